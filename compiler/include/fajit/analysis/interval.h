// The interval domain of the mask range analysis: one abstract value (AVal) per SSA value and
// its arithmetic, and the three-valued booleans (i1 intervals: false / true / unknown).
// Internal to compiler/lib/analysis (range_program.cpp evaluates a program over it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "fajit/detail/mask_analysis.h"

namespace fa::detail {

// One abstract value: an integer interval (i32 stored signed, i1 stored as 0/1) and an f32
// interval with a may-be-NaN flag. Only the part matching the SSA type is meaningful.
struct AVal {
  int64_t lo, hi;
  float flo, fhi;
  uint8_t nan;
};

inline constexpr int64_t kMin32 = std::numeric_limits<int32_t>::min();
inline constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
inline constexpr int64_t k2p32 = int64_t{1} << 32;
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline AVal ival(int64_t lo, int64_t hi) { return AVal{lo, hi, 0.0f, 0.0f, 0}; }
inline AVal itop(unsigned w) { return w == 1 ? ival(0, 1) : ival(kMin32, kMax32); }
inline AVal fval(float lo, float hi) { return AVal{0, 0, lo, hi, 0}; }
inline AVal ftop() { return AVal{0, 0, -kInf, kInf, 1}; }
// A signed i32 interval, or the whole range when it leaves [INT32_MIN, INT32_MAX] (the op
// may wrap).
inline AVal norm32(int64_t lo, int64_t hi) {
  if (lo < kMin32 || hi > kMax32) return itop(32);
  return ival(lo, hi);
}
// Signed reading: i1 true is -1.
inline AVal sgn(const AVal& v, unsigned w) {
  if (w != 1) return v;
  return ival(v.hi == 1 ? -1 : 0, v.lo == 1 ? -1 : 0);
}
inline AVal from_sgn(const AVal& v, unsigned w) {
  if (w != 1) return norm32(v.lo, v.hi);
  if (v.lo < -1 || v.hi > 0) return itop(1);
  return ival(v.hi == -1 ? 1 : 0, v.lo == -1 ? 1 : 0);
}
// Unsigned reading, always representable (the whole range when it straddles zero).
inline AVal uns(const AVal& v, unsigned w) {
  if (w == 1 || v.lo >= 0) return v;
  if (v.hi < 0) return ival(v.lo + k2p32, v.hi + k2p32);
  return ival(0, k2p32 - 1);
}
inline AVal from_uns(const AVal& v, unsigned w) {
  if (w == 1) return v.hi > 1 ? itop(1) : v;
  if (v.hi <= kMax32) return ival(v.lo, v.hi);
  if (v.lo > kMax32) return ival(v.lo - k2p32, v.hi - k2p32);
  return itop(32);
}
inline bool single(const AVal& v) { return v.lo == v.hi; }
// max / min of two integer intervals read alike (both signed or both unsigned).
inline AVal imax(const AVal& x, const AVal& y) { return ival(std::max(x.lo, y.lo), std::max(x.hi, y.hi)); }
inline AVal imin(const AVal& x, const AVal& y) { return ival(std::min(x.lo, y.lo), std::min(x.hi, y.hi)); }
inline AVal tri(bool may_false, bool may_true) { return ival(may_false ? 0 : 1, may_true ? 1 : 0); }

// a op b over the corners (for ops monotone in each argument on the box).
template <typename F>
inline AVal corners(const AVal& a, const AVal& b, F f) {
  int64_t c0 = f(a.lo, b.lo), c1 = f(a.lo, b.hi), c2 = f(a.hi, b.lo), c3 = f(a.hi, b.hi);
  return norm32(std::min({c0, c1, c2, c3}), std::max({c0, c1, c2, c3}));
}

inline int64_t div_trunc(int64_t a, int64_t b) { return a / b; }
inline int64_t div_floor(int64_t a, int64_t b) {
  int64_t q = a / b, r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t div_ceil(int64_t a, int64_t b) {
  int64_t q = a / b, r = a % b;
  return (r != 0 && ((r < 0) == (b < 0))) ? q + 1 : q;
}

inline unsigned bits_for(int64_t x) {  // x >= 0
  unsigned n = 0;
  while (n < 63 && (int64_t{1} << n) <= x) ++n;
  return n;
}

inline MaskVerdict verdict_of(const AVal& v) {
  if (v.lo == 1) return MaskVerdict::kTrue;
  if (v.hi == 0) return MaskVerdict::kFalse;
  return MaskVerdict::kUnknown;
}

// f32 corners; any NaN corner (inf - inf, 0 * inf) gives the whole range.
template <typename F>
inline AVal fcorners(const AVal& a, const AVal& b, F f) {
  if (a.nan || b.nan) return ftop();
  float c[4] = {f(a.flo, b.flo), f(a.flo, b.fhi), f(a.fhi, b.flo), f(a.fhi, b.fhi)};
  for (float x : c)
    if (std::isnan(x)) return ftop();
  return fval(std::min({c[0], c[1], c[2], c[3]}), std::max({c[0], c[1], c[2], c[3]}));
}

inline int64_t fp_to_int_sat(float f, int64_t lo, int64_t hi) {
  double t = std::trunc(static_cast<double>(f));
  if (t <= static_cast<double>(lo)) return lo;
  if (t >= static_cast<double>(hi)) return hi;
  return static_cast<int64_t>(t);
}

// cmpi / cmpf over intervals: a three-valued i1 (tri). `pred` is the arith predicate.
AVal cmpi(uint8_t pred, AVal a, AVal b, unsigned w);
AVal cmpf(uint8_t pred, const AVal& a, const AVal& b);

}  // namespace fa::detail
