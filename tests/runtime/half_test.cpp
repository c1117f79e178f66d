// fajit/runtime/half.h against references computed another way: widening against the
// formats' definitions evaluated with ldexp in long double, narrowing against a nearest search
// (ties to even) over the sorted table of every representable value.
#include "fajit/runtime/half.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using fa::DType;

static_assert(fa::half_detail::f32_to_f16(0x3f800000u) == 0x3c00u, "1.0f -> f16");
static_assert(fa::half_detail::f16_to_f32(0x0001u) == 0x33800000u, "2^-24 <- f16");
static_assert(fa::half_detail::f32_to_bf16(0x3f800000u) == 0x3f80u, "1.0f -> bf16");

float f32(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
uint32_t u32(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

// Mantissa and exponent field widths, exponent bias.
struct Format {
  int mant_bits, exp_bits, bias;
};
Format format(DType t) { return t == DType::bf16 ? Format{7, 8, 127} : Format{10, 5, 15}; }

// The value of a 16-bit pattern by the format's definition (not by bit manipulation into a
// float). NaN for NaN patterns. With unbounded_inf, the all-ones exponent with a zero mantissa
// is the value it would have if the exponent range continued (2^(emax+1)): the rounding
// boundary for overflow.
long double decode(uint16_t b, DType t, bool unbounded_inf = false) {
  const Format f = format(t);
  const int e = (b >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant_bits) - 1);
  const int emax_field = (1 << f.exp_bits) - 1;
  long double v;
  if (e == emax_field) {
    if (m != 0) return std::numeric_limits<long double>::quiet_NaN();
    v = unbounded_inf ? std::ldexp(1.0L, emax_field - f.bias) : std::numeric_limits<long double>::infinity();
  } else if (e == 0) {
    v = std::ldexp(static_cast<long double>(m), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(static_cast<long double>((1 << f.mant_bits) + m), e - f.bias - f.mant_bits);
  }
  return (b & 0x8000u) ? -v : v;
}

const char* name(DType t) { return t == DType::bf16 ? "bf16" : "f16"; }

// Every non-negative representable value in increasing order, the last one being the
// overflow boundary (the inf pattern with its unbounded value).
struct Table {
  std::vector<uint16_t> bits;
  std::vector<long double> vals;
};
Table table(DType t) {
  Table tb;
  const uint16_t inf = t == DType::bf16 ? 0x7f80u : 0x7c00u;
  for (uint32_t b = 0; b <= inf; ++b) {
    tb.bits.push_back(uint16_t(b));
    tb.vals.push_back(decode(uint16_t(b), t, /*unbounded_inf=*/true));
  }
  return tb;
}

// Round to nearest, ties to even, by searching the table: the two representable neighbours
// of |x| and their distances in long double (exact here: the operands are close or one is 0).
uint16_t reference_round(float x, DType /*t*/, const Table& tb) {
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  if (std::isnan(x)) return 0xffffu;  // any NaN; checked separately
  if (std::isinf(x)) return sign | tb.bits.back();
  const long double a = std::fabs(static_cast<long double>(x));
  if (a >= tb.vals.back()) return sign | tb.bits.back();
  const size_t hi = size_t(std::upper_bound(tb.vals.begin(), tb.vals.end(), a) - tb.vals.begin());
  const size_t lo = hi - 1;  // vals[lo] <= a < vals[hi]
  if (tb.vals[lo] == a) return sign | tb.bits[lo];
  const long double dlo = a - tb.vals[lo], dhi = tb.vals[hi] - a;
  size_t pick;
  if (dlo < dhi)
    pick = lo;
  else if (dhi < dlo)
    pick = hi;
  else
    pick = (tb.bits[lo] & 1u) ? hi : lo;
  return sign | tb.bits[pick];
}

bool is_nan_bits(uint16_t b, DType t) {
  const uint16_t inf = t == DType::bf16 ? 0x7f80u : 0x7c00u;
  return (b & 0x7fffu) > inf;
}

void check_round(float x, DType t, const Table& tb) {
  const uint16_t got = fa::to_bits(x, t);
  if (std::isnan(x)) {
    EXPECT_TRUE(is_nan_bits(got, t)) << name(t) << " NaN 0x" << std::hex << u32(x);
    EXPECT_EQ(got & 0x8000u, (u32(x) >> 16) & 0x8000u) << name(t) << " NaN sign";
    return;
  }
  const uint16_t want = reference_round(x, t, tb);
  ASSERT_EQ(got, want) << name(t) << " x=" << x << " (0x" << std::hex << u32(x) << ")";
}

class HalfTest : public ::testing::TestWithParam<DType> {};

// All 65536 patterns: widening is exact (against the format's definition) and narrowing the
// result gives the pattern back; NaN widens to NaN and narrows to NaN of the same sign.
TEST_P(HalfTest, EveryPatternRoundTrips) {
  const DType t = GetParam();
  for (uint32_t i = 0; i < 0x10000u; ++i) {
    const uint16_t b = uint16_t(i);
    const float f = fa::from_bits(b, t);
    const long double v = decode(b, t);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(f)) << name(t) << " 0x" << std::hex << i;
      ASSERT_EQ(std::signbit(f), bool(b & 0x8000u)) << name(t) << " 0x" << std::hex << i;
      const uint16_t back = fa::to_bits(f, t);
      ASSERT_TRUE(is_nan_bits(back, t)) << name(t) << " 0x" << std::hex << i;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u) << name(t) << " 0x" << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<long double>(f), v) << name(t) << " 0x" << std::hex << i;
    ASSERT_EQ(std::signbit(f), bool(b & 0x8000u)) << name(t) << " 0x" << std::hex << i;
    ASSERT_EQ(fa::to_bits(f, t), b) << name(t) << " 0x" << std::hex << i;
  }
}

// Every midpoint between neighbouring values (exact in float for both formats), and the
// floats just below and above it, for both signs; this covers the subnormal/normal boundary,
// the max finite value and the overflow threshold (the midpoint below the inf pattern).
TEST_P(HalfTest, MidpointsAndTheirNeighbours) {
  const DType t = GetParam();
  const Table tb = table(t);
  for (size_t i = 0; i + 1 < tb.vals.size(); ++i) {
    const long double mid_ld = (tb.vals[i] + tb.vals[i + 1]) / 2;
    const float mid = static_cast<float>(mid_ld);
    ASSERT_EQ(static_cast<long double>(mid), mid_ld) << "midpoint not exact in float";
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      check_round(x, t, tb);
      check_round(-x, t, tb);
    }
  }
}

// Named cases, with the expected bits written out.
TEST(Half, NamedCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // f16
  EXPECT_EQ(fa::to_bits(0.0f, DType::f16), 0x0000u);
  EXPECT_EQ(fa::to_bits(-0.0f, DType::f16), 0x8000u);
  EXPECT_EQ(fa::to_bits(1.0f, DType::f16), 0x3c00u);
  EXPECT_EQ(fa::to_bits(65504.0f, DType::f16), 0x7bffu);    // max finite
  EXPECT_EQ(fa::to_bits(65519.996f, DType::f16), 0x7bffu);  // just below the threshold
  EXPECT_EQ(fa::to_bits(65520.0f, DType::f16), 0x7c00u);    // tie -> even (inf)
  EXPECT_EQ(fa::to_bits(-1e10f, DType::f16), 0xfc00u);      // overflow
  EXPECT_EQ(fa::to_bits(inf, DType::f16), 0x7c00u);
  EXPECT_EQ(fa::to_bits(-inf, DType::f16), 0xfc00u);
  EXPECT_EQ(fa::to_bits(nan, DType::f16), 0x7e00u);
  EXPECT_EQ(fa::to_bits(-nan, DType::f16), 0xfe00u);
  EXPECT_EQ(fa::to_bits(std::ldexp(1.0f, -14), DType::f16), 0x0400u);     // min normal
  EXPECT_EQ(fa::to_bits(std::ldexp(1023.5f, -24), DType::f16), 0x0400u);  // tie up to normal
  EXPECT_EQ(fa::to_bits(std::ldexp(1.0f, -24), DType::f16), 0x0001u);     // min subnormal
  EXPECT_EQ(fa::to_bits(std::ldexp(1.0f, -25), DType::f16), 0x0000u);     // tie -> even (0)
  EXPECT_EQ(fa::to_bits(std::ldexp(1.5f, -25), DType::f16), 0x0001u);
  EXPECT_EQ(fa::to_bits(std::ldexp(1.5f, -24), DType::f16), 0x0002u);         // tie -> even (2)
  EXPECT_EQ(fa::to_bits(std::ldexp(2.5f, -24), DType::f16), 0x0002u);         // tie -> even (2)
  EXPECT_EQ(fa::to_bits(1.0f + std::ldexp(1.0f, -11), DType::f16), 0x3c00u);  // tie -> even
  EXPECT_EQ(fa::to_bits(1.0f + std::ldexp(3.0f, -11), DType::f16), 0x3c02u);  // tie -> even
  EXPECT_EQ(fa::to_bits(std::numeric_limits<float>::denorm_min(), DType::f16), 0x0000u);
  EXPECT_EQ(fa::from_bits(0x7bffu, DType::f16), 65504.0f);
  EXPECT_EQ(fa::from_bits(0x0001u, DType::f16), std::ldexp(1.0f, -24));
  EXPECT_EQ(fa::from_bits(0x03ffu, DType::f16), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fa::from_bits(0xfc00u, DType::f16), -inf);
  EXPECT_TRUE(std::isnan(fa::from_bits(0x7c01u, DType::f16)));
  // bf16
  EXPECT_EQ(fa::to_bits(1.0f, DType::bf16), 0x3f80u);
  EXPECT_EQ(fa::to_bits(-0.0f, DType::bf16), 0x8000u);
  EXPECT_EQ(fa::to_bits(std::numeric_limits<float>::max(), DType::bf16), 0x7f80u);  // overflow
  EXPECT_EQ(fa::to_bits(f32(0x7f7f7fffu), DType::bf16), 0x7f7fu);  // just below the threshold
  EXPECT_EQ(fa::to_bits(f32(0x7f7f8000u), DType::bf16), 0x7f80u);  // tie -> even (inf)
  EXPECT_EQ(fa::to_bits(f32(0x3f808000u), DType::bf16), 0x3f80u);  // tie -> even
  EXPECT_EQ(fa::to_bits(f32(0x3f818000u), DType::bf16), 0x3f82u);  // tie -> even
  EXPECT_EQ(fa::to_bits(f32(0x00008000u), DType::bf16), 0x0000u);  // subnormal tie -> 0
  EXPECT_EQ(fa::to_bits(f32(0x00008001u), DType::bf16), 0x0001u);
  EXPECT_EQ(fa::to_bits(f32(0x007fffffu), DType::bf16), 0x0080u);  // up to min normal
  EXPECT_EQ(fa::to_bits(inf, DType::bf16), 0x7f80u);
  EXPECT_EQ(fa::to_bits(-inf, DType::bf16), 0xff80u);
  EXPECT_EQ(fa::to_bits(nan, DType::bf16), 0x7fc0u);
  EXPECT_EQ(fa::to_bits(f32(0x7f800001u), DType::bf16), 0x7fc0u);  // signalling NaN: quiet
  EXPECT_EQ(fa::to_bits(f32(0xff810000u), DType::bf16), 0xffc1u);  // sign, payload kept
  EXPECT_EQ(fa::from_bits(0x7f7fu, DType::bf16), f32(0x7f7f0000u));
  EXPECT_EQ(fa::from_bits(0x0001u, DType::bf16), f32(0x00010000u));
}

// Random floats: uniformly random bit patterns (every exponent, NaN and inf included), and
// floats with random exponents around the format's range, and random values near the
// boundaries (the subnormal/normal boundary, the smallest subnormal, the max finite value).
TEST_P(HalfTest, RandomFloatsMatchTheReference) {
  const DType t = GetParam();
  const Table tb = table(t);
  std::mt19937_64 rng(t == DType::bf16 ? 2 : 1);
  for (int i = 0; i < 400000; ++i) check_round(f32(uint32_t(rng())), t, tb);

  const Format f = format(t);
  const int emin = 1 - f.bias - f.mant_bits - 2, emax = (1 << f.exp_bits) - f.bias + 1;
  std::uniform_int_distribution<int> exp(emin, emax);
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  for (int i = 0; i < 400000; ++i) {
    float x = std::ldexp(frac(rng), exp(rng));
    check_round((rng() & 1) ? -x : x, t, tb);
  }

  const float min_normal = static_cast<float>(decode(uint16_t(1u << f.mant_bits), t));
  const float min_sub = static_cast<float>(decode(0x0001u, t));
  const float max_finite = static_cast<float>(decode(uint16_t(tb.bits.back() - 1), t));
  for (float c : {min_normal, min_sub, max_finite}) {
    std::uniform_real_distribution<float> near(c * 0.75f, std::min(c * 1.25f, FLT_MAX));
    for (int i = 0; i < 100000; ++i) check_round(near(rng), t, tb);
    // And the 2000 floats on either side of it, one by one.
    float lo = c, hi = c;
    for (int i = 0; i < 2000; ++i) {
      lo = std::nextafter(lo, 0.0f);
      hi = std::nextafter(hi, INFINITY);
      check_round(lo, t, tb);
      check_round(hi, t, tb);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, HalfTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(name(i.param)); });

}  // namespace
