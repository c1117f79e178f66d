// Host-side conversions between float and the 16-bit storage formats of attention tensors
// (IEEE binary16 "f16" and bfloat16 "bf16"), bit-exact and independent of the FPU rounding
// mode. Header-only; the bit-level functions are constexpr.
//
//   uint16_t b = fa::to_bits(0.1f, fa::DType::bf16);   // round to nearest, ties to even
//   float v = fa::from_bits(b, fa::DType::bf16);       // exact widening
//
// Narrowing (to_bits) rounds to nearest with ties to even, as the GPU's cvt.rn does, so a host
// reference sees exactly the values a kernel reads:
//   - finite values beyond the largest finite 16-bit value round to +-inf when they are at
//     least half an ulp above it (f16: |x| >= 65520; bf16: |x| >= 2^128 - 2^119);
//   - f16 results below 2^-14 are subnormal (gradual underflow, no flush to zero); bf16 shares
//     float's exponent range, so its subnormals come from float subnormals;
//   - +-inf stays +-inf, signed zeros keep their sign;
//   - NaN gives a quiet NaN of the same sign (f16: 0x7e00 | sign; bf16: the top 16 bits of
//     the float with the quiet bit set, so its upper payload bits survive).
// Widening (from_bits) is exact for every bit pattern; NaN payloads are kept (shifted into the
// top of float's mantissa), so for every non-NaN pattern b, to_bits(from_bits(b, t), t) == b.
//
// Only DType::f16 and DType::bf16 are 16-bit float types: any other dtype is a precondition
// violation (it is treated as f16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fajit/tensor.h"

namespace fa {
namespace half_detail {

// float bit pattern -> f16 bit pattern, round to nearest even.
constexpr uint16_t f32_to_f16(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN -> quiet NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 (incl. inf) -> inf
  if (a >= 0x38800000u) {                                 // normal f16 (>= 2^-14)
    uint32_t r = a - 0x38000000u;                         // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                       // RNE on the 13 dropped bits
    return uint16_t(sign | (r >> 13));                    // a carry bumps the exponent
  }
  if (a <= 0x33000000u)
    return uint16_t(sign);  // <= 2^-25: half the smallest subnormal or
                            // less (the tie goes to even, i.e. zero)
  // Subnormal f16: the result counts units of 2^-24. a = m * 2^(e - 150) with e in [102, 112],
  // so the count is m >> (126 - e) rounded, a shift of 14..24 bits.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t s = 126u - e;
  uint32_t q = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal
  return uint16_t(sign | q);
}

// f16 bit pattern -> float bit pattern, exact.
constexpr uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 31) return sign | 0x7f800000u | (m << 13);  // inf, NaN (payload kept)
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  // Subnormal: m * 2^-24 with the leading bit of m at position p gives 2^(p - 24) * 1.f.
  uint32_t p = 9;
  while (!(m >> p)) --p;
  return sign | ((p + 103u) << 23) | ((m << (23u - p)) & 0x7fffffu);
}

// float bit pattern -> bf16 bit pattern, round to nearest even.
constexpr uint16_t f32_to_bf16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  // Finite values and inf: a carry out of the mantissa bumps the exponent, up to inf.
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// bf16 bit pattern -> float bit pattern, exact.
constexpr uint32_t bf16_to_f32(uint16_t b) { return uint32_t(b) << 16; }

}  // namespace half_detail

// float -> f16 or bf16 bits, round to nearest even (see the top of this file).
inline uint16_t to_bits(float f, DType t) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return t == DType::bf16 ? half_detail::f32_to_bf16(x) : half_detail::f32_to_f16(x);
}

// f16 or bf16 bits -> float, exact.
inline float from_bits(uint16_t b, DType t) {
  const uint32_t x = t == DType::bf16 ? half_detail::bf16_to_f32(b) : half_detail::f16_to_f32(b);
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

// n standard-normal values drawn with `rng`, rounded to t: the 16-bit patterns a kernel reads
// and the same values widened, which is what a float reference must read (random inputs of
// `fajit run` and the fuzzer).
struct RoundedTensor {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
template <typename Rng>
RoundedTensor random_rounded(size_t n, DType t, Rng& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  RoundedTensor h;
  h.bits.resize(n);
  h.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.bits[i] = to_bits(d(rng), t);
    h.values[i] = from_bits(h.bits[i], t);
  }
  return h;
}

}  // namespace fa
