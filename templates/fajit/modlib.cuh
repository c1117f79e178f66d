// fajit mod library: the named device primitives generated score_mod / mask_mod code calls
// for arith/math ops whose semantics C++ does not give directly (wrap-around, floor/ceil
// division, NaN-propagating min/max, saturating casts, captured-buffer loads). Semantics
// match the host interpreter (compiler/include/fajit/interp.h). No includes but params.h and
// prelude.cuh (fa.grad_add's reduction).
#ifndef FAJIT_MODLIB_CUH
#define FAJIT_MODLIB_CUH

#include "fajit/params.h"
#include "fajit/prelude.cuh"

namespace fa {
namespace mod {

// Two's-complement wrap-around (signed overflow is UB in C++, defined in arith).
__device__ __forceinline__ int add(int a, int b) { return (int)((unsigned)a + (unsigned)b); }
__device__ __forceinline__ int sub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }
__device__ __forceinline__ int mul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }

__device__ __forceinline__ int divu(int a, int b) { return (int)((unsigned)a / (unsigned)b); }
__device__ __forceinline__ int remu(int a, int b) { return (int)((unsigned)a % (unsigned)b); }
// Division rounding toward -inf / +inf.
__device__ __forceinline__ int floordiv(int a, int b) {
  int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__device__ __forceinline__ int ceildiv(int a, int b) {
  int q = a / b;
  return (q * b != a && ((a < 0) == (b < 0))) ? q + 1 : q;
}

__device__ __forceinline__ int smax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int smin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int umax(int a, int b) { return (unsigned)a > (unsigned)b ? a : b; }
__device__ __forceinline__ int umin(int a, int b) { return (unsigned)a < (unsigned)b ? a : b; }
__device__ __forceinline__ int iabs(int a) { return a < 0 ? (int)(0u - (unsigned)a) : a; }

// Shifts: amounts >= 32 are poison in arith (the interpreter rejects them); mask like PTX.
__device__ __forceinline__ int shl(int a, int b) { return (int)((unsigned)a << (b & 31)); }
__device__ __forceinline__ int shrs(int a, int b) { return a >> (b & 31); }
__device__ __forceinline__ int shru(int a, int b) { return (int)((unsigned)a >> (b & 31)); }

// A mask_mod that keeps an interval of keys per row (codegen's mask_kv_range) works its bounds
// out in 64 bits, where kv ± a 32-bit row value cannot wrap: kKvOpen* stand for a side without
// a bound, kv_bound() clamps a bound into [-1, 2^31 - 1] (keys are in [0, 2^31 - 1)).
constexpr long long kKvOpenLo = -(1ll << 40), kKvOpenHi = 1ll << 40;
__device__ __forceinline__ long long max64(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long min64(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ int kv_bound(long long x) {
  return (int)(x < -1 ? -1ll : x > 2147483647ll ? 2147483647ll : x);
}

// arith.maximumf / minimumf: NaN wins; -0 < +0.
__device__ __forceinline__ float maximumf(float a, float b) {
  if (a != a || b != b) return __int_as_float(0x7fc00000);
  if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));
  return a > b ? a : b;
}
__device__ __forceinline__ float minimumf(float a, float b) {
  if (a != a || b != b) return __int_as_float(0x7fc00000);
  if (a == b) return __int_as_float(__float_as_int(a) | __float_as_int(b));
  return a < b ? a : b;
}

// arith.divf: a · (1/b) with the reciprocal correctly rounded, so the quotient is within
// 1.5 ulp (Triton's default f32 division is 2 ulp). A loop-invariant divisor (a captured scalar,
// a constant: softcap's s / cap) then costs two multiplies per score, its reciprocal hoisted out
// of the key loop, where the IEEE division costs a reciprocal, Newton steps and a range check per
// score. Branch-free: a divisor whose reciprocal would not be a normal float is scaled by 2^±64
// first and the quotient scaled back (exact), so 0, inf, NaN, denormal and huge divisors give
// a / b's inf, 0 and NaN.
__device__ __forceinline__ float divf(float a, float b) {
  const float m = fabsf(b);
  const float s = m > 0x1p64f ? 0x1p-64f : (m < 0x1p-64f ? 0x1p64f : 1.f);
  return __fmul_rn(__fmul_rn(a, __frcp_rn(__fmul_rn(b, s))), s);
}

// math.tanh: 1 - 2 / (e^(2x) + 1) by one MUFU.EX2 and one MUFU.RCP (absolute error ~2^-22,
// saturating to ±1 without a branch), and below |x| = 1/16, where that form loses relative
// accuracy, the odd Taylor polynomial x - x³/3 + 2x⁵/15 (relative error < 2^-23 there). CUDA's
// tanhf (2 ulp) inlines a long expansion: on softcap's every score it cost more compile time
// and run time than the rest of the score path.
__device__ __forceinline__ float tanh(float x) {
  const float big = 1.f - 2.f * fa::rcp(fa::ex2(2.8853900817779268f * x) + 1.f);  // 2·log2(e)
  const float x2 = x * x;
  const float small = x * fmaf(x2, fmaf(x2, 0.13333333333f, -0.33333333333f), 1.f);
  return fabsf(x) < 0.0625f ? small : big;
}

// arith.fptosi / fptoui: truncate, saturate, NaN -> 0 (cvt.rzi).
__device__ __forceinline__ int f2i(float a) { return __float2int_rz(a); }
__device__ __forceinline__ int f2u(float a) { return (int)__float2uint_rz(a); }

// fa.load: element [i0, i1, ...] of a captured buffer (read-only for the kernel's lifetime).
// The offsets serve FaBuffer and FaGradBuffer (same strides layout). By default they are
// 32-bit with the innermost index unscaled: the host launches this form only when every
// buffer (and buffer gradient) of the call spans fewer than 2^31 elements with a contiguous
// innermost dimension (KernelSpec::wide_captures); FAJIT_WIDE_CAPTURES selects 64-bit offsets
// through every stride for the others. (The 64-bit multiply-adds and the stride of the last
// index cost ~6 instructions per load: 5-7 % of a document-masked forward.)
#ifdef FAJIT_WIDE_CAPTURES
typedef long long capture_offset_t;
#else
typedef int capture_offset_t;
#endif
// Index i of dimension d scaled by its stride; the innermost index as it is when narrow.
template <typename Buf>
__device__ __forceinline__ capture_offset_t scaled(const Buf& b, int d, int i) {
  return (capture_offset_t)i * (capture_offset_t)b.stride[d];
}
template <typename Buf>
__device__ __forceinline__ capture_offset_t innermost(const Buf& b, int d, int i) {
#ifdef FAJIT_WIDE_CAPTURES
  return scaled(b, d, i);
#else
  (void)b, (void)d;
  return i;
#endif
}
template <typename Buf>
__device__ __forceinline__ capture_offset_t offset(const Buf& b, int i0) {
  return innermost(b, 0, i0);
}
template <typename Buf>
__device__ __forceinline__ capture_offset_t offset(const Buf& b, int i0, int i1) {
  return scaled(b, 0, i0) + innermost(b, 1, i1);
}
template <typename Buf>
__device__ __forceinline__ capture_offset_t offset(const Buf& b, int i0, int i1, int i2) {
  return scaled(b, 0, i0) + scaled(b, 1, i1) + innermost(b, 2, i2);
}
template <typename Buf>
__device__ __forceinline__ capture_offset_t offset(const Buf& b, int i0, int i1, int i2, int i3) {
  return scaled(b, 0, i0) + scaled(b, 1, i1) + scaled(b, 2, i2) + innermost(b, 3, i3);
}
template <typename... I>
__device__ __forceinline__ float load_f32(const FaBuffer& b, I... idx) {
  return __ldg(static_cast<const float*>(b.ptr) + offset(b, idx...));
}
template <typename... I>
__device__ __forceinline__ int load_i32(const FaBuffer& b, I... idx) {
  return __ldg(static_cast<const int*>(b.ptr) + offset(b, idx...));
}

// fa.grad_add (score_grad only): grad[i0, ...] += v with an fp32 reduction, at the element the
// forward's load reads (same strides arithmetic, no bounds check, as load_f32). Nothing when
// the gradient is not wanted (null ptr) or v is 0 (masked and underflowed elements).
template <typename... I>
__device__ __forceinline__ void grad_add_f32(const FaGradBuffer& g, float v, I... idx) {
  if (g.ptr != nullptr && v != 0.f) red_add_f32(g.ptr + offset(g, idx...), v);
}

}  // namespace mod
}  // namespace fa

#endif  // FAJIT_MODLIB_CUH
