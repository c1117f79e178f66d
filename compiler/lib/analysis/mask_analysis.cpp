// fa::analyze_block_mask: interval evaluation of a mask_mod over rectangles of blocks.
#include "fajit/detail/mask_analysis.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"
#include "fajit/captures.h"
#include "fajit/detail/program_impl.h"
#include "fajit/error.h"
#include "llvm/ADT/DenseMap.h"

namespace fa {
namespace detail {

// Interval opcodes. Anything not listed compiles to kTopOp (result: the whole type).
enum ROp : uint8_t {
  rAddI, rSubI, rMulI, rDivSI, rCeilDivSI, rFloorDivSI, rRemSI, rDivUI, rRemUI,
  rMaxSI, rMinSI, rMaxUI, rMinUI, rAndI, rOrI, rXOrI, rShLI, rShRSI, rShRUI, rCmpI, rAbsI,
  rSelect, rExtUI, rExtSI, rTruncI, rSIToFP, rUIToFP, rFPToSI, rFPToUI,
  rAddF, rSubF, rMulF, rDivF, rNegF, rAbsF, rMaxF, rMinF, rFloor, rCeil, rSqrt, rCmpF,
  rTopOp,
};

// One abstract value: an integer interval (i32 stored signed, i1 stored as 0/1) and an f32
// interval with a may-be-NaN flag. Only the part matching the SSA type is meaningful.
struct AVal {
  int64_t lo, hi;
  float flo, fhi;
  uint8_t nan;
};

struct RInst {
  uint8_t op;
  uint8_t w;      // integer width of the result (cmpi, casts from int: of the operand)
  uint8_t rw;     // integer width of the result (0 for f32)
  uint8_t pred;   // cmpi / cmpf predicate
  uint32_t dst;
  uint32_t src[3];
};

struct RangeFields {
  std::vector<AVal> init;               // registers: b, h, q, kv, constants, scalars
  std::vector<RInst> code;
  std::vector<std::string> scalar_names;
  std::vector<uint8_t> scalar_is_float;
  std::vector<uint32_t> scalar_regs;
  std::vector<uint8_t> scalar_rw;       // 0 for f32
  uint32_t result = 0;
  bool reads_b = false, reads_h = false, reads_buffers = false;
  bool opaque = false;  // holds ops modelled as "anything" (loads, transcendental math)
};

namespace {

constexpr int64_t kMin32 = std::numeric_limits<int32_t>::min();
constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
constexpr int64_t k2p32 = int64_t{1} << 32;
constexpr float kInf = std::numeric_limits<float>::infinity();

inline AVal itop(unsigned w) {
  AVal v{};
  v.lo = w == 1 ? 0 : kMin32;
  v.hi = w == 1 ? 1 : kMax32;
  return v;
}
inline AVal ival(int64_t lo, int64_t hi) {
  AVal v{};
  v.lo = lo;
  v.hi = hi;
  return v;
}
inline AVal ftop() {
  AVal v{};
  v.flo = -kInf;
  v.fhi = kInf;
  v.nan = 1;
  return v;
}
inline AVal fval(float lo, float hi) {
  AVal v{};
  v.flo = lo;
  v.fhi = hi;
  return v;
}
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
inline AVal tri(bool may_false, bool may_true) {
  return ival(may_false ? 0 : 1, may_true ? 1 : 0);
}

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

AVal cmpi(uint8_t pred, AVal a, AVal b, unsigned w) {
  using P = mlir::arith::CmpIPredicate;
  P p = static_cast<P>(pred);
  bool is_unsigned = p == P::ult || p == P::ule || p == P::ugt || p == P::uge;
  if (is_unsigned) {
    a = uns(a, w);
    b = uns(b, w);
  } else {
    a = sgn(a, w);
    b = sgn(b, w);
  }
  switch (p) {
    case P::eq: return tri(!(single(a) && single(b) && a.lo == b.lo), !(a.hi < b.lo || b.hi < a.lo));
    case P::ne: return tri(!(a.hi < b.lo || b.hi < a.lo), !(single(a) && single(b) && a.lo == b.lo));
    case P::slt: case P::ult: return tri(a.hi >= b.lo, a.lo < b.hi);
    case P::sle: case P::ule: return tri(a.hi > b.lo, a.lo <= b.hi);
    case P::sgt: case P::ugt: return tri(a.lo <= b.hi, a.hi > b.lo);
    case P::sge: case P::uge: return tri(a.lo < b.hi, a.hi >= b.lo);
  }
  return itop(1);
}

AVal cmpf(uint8_t pred, const AVal& a, const AVal& b) {
  using P = mlir::arith::CmpFPredicate;
  P p = static_cast<P>(pred);
  if (p == P::AlwaysFalse) return tri(true, false);
  if (p == P::AlwaysTrue) return tri(false, true);
  if (a.nan || b.nan) return itop(1);
  switch (p) {
    case P::OEQ: case P::UEQ:
      return tri(!(a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo),
                 !(a.fhi < b.flo || b.fhi < a.flo));
    case P::ONE: case P::UNE:
      return tri(!(a.fhi < b.flo || b.fhi < a.flo),
                 !(a.flo == a.fhi && b.flo == b.fhi && a.flo == b.flo));
    case P::OLT: case P::ULT: return tri(!(a.fhi < b.flo), a.flo < b.fhi);
    case P::OLE: case P::ULE: return tri(!(a.fhi <= b.flo), a.flo <= b.fhi);
    case P::OGT: case P::UGT: return tri(!(a.flo > b.fhi), a.fhi > b.flo);
    case P::OGE: case P::UGE: return tri(!(a.flo >= b.fhi), a.fhi >= b.flo);
    case P::ORD: return tri(false, true);
    case P::UNO: return tri(true, false);
    default: return itop(1);
  }
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

void step(const RInst& in, AVal* r) {
  const AVal a = r[in.src[0]], b = r[in.src[1]];
  AVal& d = r[in.dst];
  const unsigned w = in.w;
  switch (in.op) {
    case rAddI:
      if (w == 1) d = single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1);
      else d = norm32(a.lo + b.lo, a.hi + b.hi);
      break;
    case rSubI:
      if (w == 1) d = single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1);
      else d = norm32(a.lo - b.hi, a.hi - b.lo);
      break;
    case rMulI:
      if (w == 1) d = ival(a.lo & b.lo, a.hi & b.hi);
      else d = corners(a, b, [](int64_t x, int64_t y) { return x * y; });
      break;
    case rDivSI: case rCeilDivSI: case rFloorDivSI:
      // Division by a range holding 0 (UB) or INT_MIN / -1 (UB): anything.
      if (w != 32 || (b.lo <= 0 && b.hi >= 0) || (a.lo == kMin32 && b.lo <= -1 && b.hi >= -1)) {
        d = itop(w);
      } else if (in.op == rDivSI) {
        d = corners(a, b, div_trunc);
      } else if (in.op == rFloorDivSI) {
        d = corners(a, b, div_floor);
      } else {
        d = corners(a, b, div_ceil);
      }
      break;
    case rRemSI: {
      if (w != 32 || (b.lo <= 0 && b.hi >= 0) || (a.lo == kMin32 && b.lo <= -1 && b.hi >= -1)) {
        d = itop(w);
        break;
      }
      int64_t m = std::max(std::llabs(b.lo), std::llabs(b.hi)) - 1;  // |a % b| <= |b| - 1
      const int64_t c = std::llabs(b.lo);  // the sign of a % b is the dividend's
      if (single(b) && (a.lo >= 0 || a.hi <= 0) && a.lo / c == a.hi / c) {
        d = ival(a.lo % c, a.hi % c);  // within one period of one sign: monotone
      } else if (a.lo >= 0) {
        d = ival(0, std::min(a.hi, m));
      } else if (a.hi <= 0) {
        d = ival(std::max(a.lo, -m), 0);
      } else {
        d = ival(std::max(a.lo, -m), std::min(a.hi, m));
      }
      break;
    }
    case rDivUI: case rRemUI: {
      AVal x = uns(a, w), y = uns(b, w);
      if (y.lo == 0) {
        d = itop(w);
      } else if (in.op == rDivUI) {
        d = from_uns(ival(x.lo / y.hi, x.hi / y.lo), w);
      } else if (single(y) && x.lo / y.lo == x.hi / y.lo) {
        d = from_uns(ival(x.lo % y.lo, x.hi % y.lo), w);
      } else {
        d = from_uns(ival(0, std::min(x.hi, y.hi - 1)), w);
      }
      break;
    }
    case rMaxSI: case rMinSI: {
      AVal x = sgn(a, w), y = sgn(b, w);
      d = in.op == rMaxSI ? ival(std::max(x.lo, y.lo), std::max(x.hi, y.hi))
                          : ival(std::min(x.lo, y.lo), std::min(x.hi, y.hi));
      d = from_sgn(d, w);
      break;
    }
    case rMaxUI: case rMinUI: {
      AVal x = uns(a, w), y = uns(b, w);
      d = in.op == rMaxUI ? ival(std::max(x.lo, y.lo), std::max(x.hi, y.hi))
                          : ival(std::min(x.lo, y.lo), std::min(x.hi, y.hi));
      d = from_uns(d, w);
      break;
    }
    case rAndI:
      if (w == 1) d = ival(a.lo & b.lo, a.hi & b.hi);
      else if (single(a) && single(b)) d = ival(a.lo & b.lo, a.lo & b.lo);
      else if (a.lo >= 0 && b.lo >= 0) d = ival(0, std::min(a.hi, b.hi));
      else if (a.lo >= 0) d = ival(0, a.hi);
      else if (b.lo >= 0) d = ival(0, b.hi);
      else d = itop(32);
      break;
    case rOrI: case rXOrI:
      if (w == 1) {
        d = in.op == rOrI ? ival(a.lo | b.lo, a.hi | b.hi)
                          : (single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1));
      } else if (single(a) && single(b)) {
        int64_t v = in.op == rOrI ? (a.lo | b.lo) : (a.lo ^ b.lo);
        d = ival(v, v);
      } else if (a.lo >= 0 && b.lo >= 0) {
        d = ival(in.op == rOrI ? std::max(a.lo, b.lo) : 0,
                 (int64_t{1} << bits_for(std::max(a.hi, b.hi))) - 1);
      } else {
        d = itop(32);
      }
      break;
    case rShLI: case rShRSI: case rShRUI: {
      AVal s = uns(b, w);
      if (w != 32 || !single(s) || s.lo >= 32) {
        d = itop(w);
      } else if (in.op == rShLI) {
        d = norm32(a.lo * (int64_t{1} << s.lo), a.hi * (int64_t{1} << s.lo));
      } else if (in.op == rShRSI) {
        d = ival(a.lo >> s.lo, a.hi >> s.lo);
      } else {
        AVal x = uns(a, w);
        d = from_uns(ival(x.lo >> s.lo, x.hi >> s.lo), w);
      }
      break;
    }
    case rCmpI: d = cmpi(in.pred, a, b, w); break;
    case rAbsI:
      if (w != 32 || a.lo == kMin32) d = itop(w);
      else if (a.lo >= 0) d = a;
      else if (a.hi <= 0) d = ival(-a.hi, -a.lo);
      else d = ival(0, std::max(-a.lo, a.hi));
      break;
    case rSelect: {
      const AVal c = r[in.src[2]];
      if (a.lo == 1) {
        d = b;
      } else if (a.hi == 0) {
        d = c;
      } else {
        AVal j{};
        j.lo = std::min(b.lo, c.lo);
        j.hi = std::max(b.hi, c.hi);
        j.flo = std::min(b.flo, c.flo);
        j.fhi = std::max(b.fhi, c.fhi);
        j.nan = b.nan | c.nan;
        d = j;
      }
      break;
    }
    case rExtUI: d = from_uns(uns(a, w), in.rw); break;
    case rExtSI: d = from_sgn(sgn(a, w), in.rw); break;
    case rTruncI:
      if (in.rw == 1) d = single(a) ? ival(a.lo & 1, a.lo & 1) : itop(1);
      else d = from_uns(uns(a, w), in.rw);
      break;
    case rSIToFP: {
      AVal x = sgn(a, w);
      d = fval(static_cast<float>(x.lo), static_cast<float>(x.hi));  // rounding is monotone
      break;
    }
    case rUIToFP: {
      AVal x = uns(a, w);
      d = fval(static_cast<float>(x.lo), static_cast<float>(x.hi));
      break;
    }
    case rFPToSI: case rFPToUI: {
      const unsigned rw = in.rw;
      if (rw != 32 || std::isnan(a.flo) || std::isnan(a.fhi)) {
        d = itop(rw);
        break;
      }
      if (in.op == rFPToSI) {
        d = ival(fp_to_int_sat(a.flo, kMin32, kMax32), fp_to_int_sat(a.fhi, kMin32, kMax32));
      } else {
        d = from_uns(ival(fp_to_int_sat(a.flo, 0, k2p32 - 1), fp_to_int_sat(a.fhi, 0, k2p32 - 1)), 32);
      }
      if (a.nan) {  // NaN converts to 0
        d.lo = std::min<int64_t>(d.lo, 0);
        d.hi = std::max<int64_t>(d.hi, 0);
      }
      break;
    }
    case rAddF: d = fcorners(a, b, [](float x, float y) { return x + y; }); break;
    case rSubF: d = fcorners(a, b, [](float x, float y) { return x - y; }); break;
    case rMulF: d = fcorners(a, b, [](float x, float y) { return x * y; }); break;
    case rDivF:
      if (b.flo <= 0.0f && b.fhi >= 0.0f) d = ftop();
      else d = fcorners(a, b, [](float x, float y) { return x / y; });
      break;
    case rNegF: d = fval(-a.fhi, -a.flo), d.nan = a.nan; break;
    case rAbsF:
      if (a.flo >= 0.0f) d = fval(a.flo, a.fhi);
      else if (a.fhi <= 0.0f) d = fval(-a.fhi, -a.flo);
      else d = fval(0.0f, std::max(-a.flo, a.fhi));
      d.nan = a.nan;
      break;
    case rMaxF: case rMinF:
      if (a.nan || b.nan) d = ftop();
      else if (in.op == rMaxF) d = fval(std::max(a.flo, b.flo), std::max(a.fhi, b.fhi));
      else d = fval(std::min(a.flo, b.flo), std::min(a.fhi, b.fhi));
      break;
    case rFloor: d = fval(std::floor(a.flo), std::floor(a.fhi)), d.nan = a.nan; break;
    case rCeil: d = fval(std::ceil(a.flo), std::ceil(a.fhi)), d.nan = a.nan; break;
    case rSqrt:
      if (a.nan || a.flo < 0.0f) d = ftop();
      else d = fval(std::sqrt(a.flo), std::sqrt(a.fhi));
      break;
    case rCmpF: d = cmpf(in.pred, a, b); break;
    default:  // rTopOp
      d = in.rw ? itop(in.rw) : ftop();
      break;
  }
}

// ---- compile ---------------------------------------------------------------------------------

unsigned int_width(mlir::Type t) {
  if (auto it = llvm::dyn_cast<mlir::IntegerType>(t)) return it.getWidth();
  return 0;
}

class RangeCompiler {
 public:
  explicit RangeCompiler(RangeFields& f) : f_(f) {}

  void run(mlir::fa::MaskModOp mask) {
    mlir::Block& entry = mask.getEntryBlock();
    for (unsigned i = 0; i < 4; ++i) {
      regs_[entry.getArgument(i)] = new_reg(itop(32));
    }
    mlir::fa::ModUses uses = mlir::fa::computeUses(mask.getOperation());
    f_.reads_b = uses.b;
    f_.reads_h = uses.h;
    f_.reads_buffers = !uses.buffers.empty();
    for (mlir::Operation& op : entry) {
      if (auto y = llvm::dyn_cast<mlir::fa::YieldOp>(op)) {
        f_.result = reg(y.getValue());
        return;
      }
      compile_op(&op);
    }
    throw Error(fmt::format("fa.mask_mod @{} has no fa.yield", mask.getSymName().str()));
  }

 private:
  uint32_t new_reg(AVal v) {
    f_.init.push_back(v);
    return static_cast<uint32_t>(f_.init.size() - 1);
  }
  uint32_t reg(mlir::Value v) {
    auto it = regs_.find(v);
    if (it == regs_.end()) throw Error("mask range analysis: a value is used before it is defined");
    return it->second;
  }
  static AVal top_of(mlir::Type t) { return t.isF32() ? ftop() : itop(int_width(t) == 1 ? 1 : 32); }

  void compile_op(mlir::Operation* op) {
    namespace arith = mlir::arith;
    namespace math = mlir::math;
    using llvm::isa;
    if (op->getNumResults() != 1) return;
    mlir::Type rt = op->getResult(0).getType();
    const unsigned rw = int_width(rt);
    if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
      AVal v = top_of(rt);
      if (auto fa = llvm::dyn_cast<mlir::FloatAttr>(c.getValue()); fa && rt.isF32()) {
        float x = static_cast<float>(fa.getValueAsDouble());
        v = std::isnan(x) ? ftop() : fval(x, x);
      } else if (auto ia = llvm::dyn_cast<mlir::IntegerAttr>(c.getValue()); ia && rw) {
        int64_t x = rw == 1 ? int64_t(ia.getValue().getZExtValue() & 1) : ia.getValue().getSExtValue();
        v = ival(x, x);
      }
      regs_[op->getResult(0)] = new_reg(v);
      return;
    }
    if (auto s = llvm::dyn_cast<mlir::fa::ScalarOp>(op)) {
      std::string name = s.getName().str();
      for (size_t i = 0; i < f_.scalar_names.size(); ++i)
        if (f_.scalar_names[i] == name && f_.scalar_rw[i] == rw) {
          regs_[op->getResult(0)] = f_.scalar_regs[i];
          return;
        }
      uint32_t r = new_reg(top_of(rt));
      f_.scalar_names.push_back(name);
      f_.scalar_is_float.push_back(rt.isF32());
      f_.scalar_regs.push_back(r);
      f_.scalar_rw.push_back(static_cast<uint8_t>(rw));
      regs_[op->getResult(0)] = r;
      return;
    }
    RInst in{};
    in.rw = static_cast<uint8_t>(rw);
    in.w = static_cast<uint8_t>(rw);
    in.op = rTopOp;
    auto src_w = [&]() { return static_cast<uint8_t>(int_width(op->getOperand(0).getType())); };
    if (isa<arith::AddIOp>(op)) in.op = rAddI;
    else if (isa<arith::SubIOp>(op)) in.op = rSubI;
    else if (isa<arith::MulIOp>(op)) in.op = rMulI;
    else if (isa<arith::DivSIOp>(op)) in.op = rDivSI;
    else if (isa<arith::CeilDivSIOp>(op)) in.op = rCeilDivSI;
    else if (isa<arith::FloorDivSIOp>(op)) in.op = rFloorDivSI;
    else if (isa<arith::RemSIOp>(op)) in.op = rRemSI;
    else if (isa<arith::DivUIOp>(op)) in.op = rDivUI;
    else if (isa<arith::RemUIOp>(op)) in.op = rRemUI;
    else if (isa<arith::MaxSIOp>(op)) in.op = rMaxSI;
    else if (isa<arith::MinSIOp>(op)) in.op = rMinSI;
    else if (isa<arith::MaxUIOp>(op)) in.op = rMaxUI;
    else if (isa<arith::MinUIOp>(op)) in.op = rMinUI;
    else if (isa<arith::AndIOp>(op)) in.op = rAndI;
    else if (isa<arith::OrIOp>(op)) in.op = rOrI;
    else if (isa<arith::XOrIOp>(op)) in.op = rXOrI;
    else if (isa<arith::ShLIOp>(op)) in.op = rShLI;
    else if (isa<arith::ShRSIOp>(op)) in.op = rShRSI;
    else if (isa<arith::ShRUIOp>(op)) in.op = rShRUI;
    else if (isa<math::AbsIOp>(op)) in.op = rAbsI;
    else if (isa<arith::SelectOp>(op)) in.op = rSelect;
    else if (auto c = llvm::dyn_cast<arith::CmpIOp>(op)) {
      in.op = rCmpI;
      in.w = src_w();
      in.pred = static_cast<uint8_t>(c.getPredicate());
    } else if (auto c = llvm::dyn_cast<arith::CmpFOp>(op)) {
      in.op = rCmpF;
      in.pred = static_cast<uint8_t>(c.getPredicate());
    } else if (isa<arith::ExtUIOp>(op)) in.op = rExtUI, in.w = src_w();
    else if (isa<arith::ExtSIOp>(op)) in.op = rExtSI, in.w = src_w();
    else if (isa<arith::TruncIOp>(op)) in.op = rTruncI, in.w = src_w();
    else if (isa<arith::SIToFPOp>(op)) in.op = rSIToFP, in.w = src_w();
    else if (isa<arith::UIToFPOp>(op)) in.op = rUIToFP, in.w = src_w();
    else if (isa<arith::FPToSIOp>(op)) in.op = rFPToSI;
    else if (isa<arith::FPToUIOp>(op)) in.op = rFPToUI;
    else if (isa<arith::AddFOp>(op)) in.op = rAddF;
    else if (isa<arith::SubFOp>(op)) in.op = rSubF;
    else if (isa<arith::MulFOp>(op)) in.op = rMulF;
    else if (isa<arith::DivFOp>(op)) in.op = rDivF;
    else if (isa<arith::NegFOp>(op)) in.op = rNegF;
    else if (isa<math::AbsFOp>(op)) in.op = rAbsF;
    else if (isa<arith::MaximumFOp, arith::MaxNumFOp>(op)) in.op = rMaxF;
    else if (isa<arith::MinimumFOp, arith::MinNumFOp>(op)) in.op = rMinF;
    else if (isa<math::FloorOp>(op)) in.op = rFloor;
    else if (isa<math::CeilOp>(op)) in.op = rCeil;
    else if (isa<math::SqrtOp>(op)) in.op = rSqrt;
    // Everything else (fa.load, transcendental math whose GPU rounding differs from the
    // host's, remf, ...) is "anything of its type".
    if (in.op == rTopOp) f_.opaque = true;
    if (op->getNumOperands() > 3) in.op = rTopOp;
    for (unsigned i = 0; i < op->getNumOperands() && i < 3; ++i) {
      mlir::Value v = op->getOperand(i);
      if (llvm::isa<mlir::fa::BufferType>(v.getType())) continue;
      in.src[i] = reg(v);
    }
    in.dst = new_reg(top_of(rt));
    regs_[op->getResult(0)] = in.dst;
    f_.code.push_back(in);
  }

  RangeFields& f_;
  llvm::DenseMap<mlir::Value, uint32_t> regs_;
};

// ---- evaluation ----------------------------------------------------------------------------

// A program with its scalars bound and a private register file.
class Evaluator {
 public:
  Evaluator(const RangeFields& f, const ScalarValues& scalars) : f_(f), regs_(f.init) {
    for (size_t i = 0; i < f.scalar_names.size(); ++i) {
      auto it = scalars.find(f.scalar_names[i]);
      if (it == scalars.end()) continue;
      const ScalarValue& v = it->second;
      AVal& r = regs_[f.scalar_regs[i]];
      if (f.scalar_is_float[i]) {
        float x = v.type == ScalarType::kF32 ? v.f : static_cast<float>(v.i);
        if (!std::isnan(x)) r = fval(x, x);
      } else if (v.type != ScalarType::kF32) {
        int64_t x = f.scalar_rw[i] == 1 ? (v.i & 1) : v.i;
        r = ival(x, x);
      }
    }
  }

  MaskVerdict eval(const IndexRange& b, const IndexRange& h, const IndexRange& q,
                   const IndexRange& kv) {
    ++evaluations;
    AVal* r = regs_.data();
    r[0] = ival(b.lo, b.hi);
    r[1] = ival(h.lo, h.hi);
    r[2] = ival(q.lo, q.hi);
    r[3] = ival(kv.lo, kv.hi);
    for (const RInst& in : f_.code) step(in, r);
    return verdict_of(r[f_.result]);
  }

  int64_t evaluations = 0;

 private:
  const RangeFields& f_;
  std::vector<AVal> regs_;
};

constexpr int kLeafBudget = 512;  // interval evaluations per undecided block

struct Classifier {
  Evaluator& ev;
  const RangeFields& f;
  IndexRange b, h;
  int64_t len_q, len_kv;
  int q_block, kv_block, nkv;
  uint8_t* kinds;  // [nq, nkv] of this (b, h)
  int64_t undecided = 0;

  IndexRange qrange(int qb0, int qb1) const {
    return {int64_t(qb0) * q_block, std::min<int64_t>(int64_t(qb1) * q_block, len_q) - 1};
  }
  IndexRange krange(int kb0, int kb1) const {
    return {int64_t(kb0) * kv_block, std::min<int64_t>(int64_t(kb1) * kv_block, len_kv) - 1};
  }
  void fill(int qb0, int qb1, int kb0, int kb1, uint8_t kind) {
    if (kind == kUndecidedBlock) undecided += int64_t(qb1 - qb0) * (kb1 - kb0);
    for (int qb = qb0; qb < qb1; ++qb) std::memset(kinds + size_t(qb) * nkv + kb0, kind, size_t(kb1 - kb0));
  }

  // Regions of blocks [qb0, qb1) x [kb0, kb1): decided ones are filled; undecided single
  // blocks go to the witness search. Returns false when the region stayed unknown.
  void region(int qb0, int qb1, int kb0, int kb1) {
    MaskVerdict v = ev.eval(b, h, qrange(qb0, qb1), krange(kb0, kb1));
    if (v != MaskVerdict::kUnknown) {
      fill(qb0, qb1, kb0, kb1, v == MaskVerdict::kTrue ? 2 : 0);
      return;
    }
    if (qb1 - qb0 == 1 && kb1 - kb0 == 1) {
      const uint8_t k = leaf(qrange(qb0, qb1), krange(kb0, kb1));
      kinds[size_t(qb0) * nkv + kb0] = k;
      undecided += k == kUndecidedBlock;
      return;
    }
    const int qm = qb1 - qb0 > 1 ? (qb0 + qb1) / 2 : qb1;
    const int km = kb1 - kb0 > 1 ? (kb0 + kb1) / 2 : kb1;
    if (f.opaque) {
      // Data-dependent bodies: stop splitting where no child is decided (deeper levels
      // would not be either when the unknown comes from a load); leave it undecided.
      bool any = false;
      int ch[4][4] = {{qb0, qm, kb0, km}, {qb0, qm, km, kb1}, {qm, qb1, kb0, km}, {qm, qb1, km, kb1}};
      for (auto& c : ch)
        if (c[0] < c[1] && c[2] < c[3] &&
            ev.eval(b, h, qrange(c[0], c[1]), krange(c[2], c[3])) != MaskVerdict::kUnknown)
          any = true;
      if (!any) {
        fill(qb0, qb1, kb0, kb1, kUndecidedBlock);
        return;
      }
    }
    region(qb0, qm, kb0, km);
    if (km < kb1) region(qb0, qm, km, kb1);
    if (qm < qb1) {
      region(qm, qb1, kb0, km);
      if (km < kb1) region(qm, qb1, km, kb1);
    }
  }

  // One block the interval analysis left unknown: look for an element where the mask holds
  // and one where it does not (partial), or prove by exhaustion that it is full or empty.
  uint8_t leaf(IndexRange q, IndexRange k) {
    bool seen_true = false, seen_false = false;
    auto point = [&](int64_t qi, int64_t ki) {
      MaskVerdict v = ev.eval(b, h, {qi, qi}, {ki, ki});
      if (v == MaskVerdict::kTrue) seen_true = true;
      else if (v == MaskVerdict::kFalse) seen_false = true;
      return v != MaskVerdict::kUnknown;
    };
    if (b.lo != b.hi || h.lo != h.hi) return kUndecidedBlock;
    const int64_t qc = (q.lo + q.hi) / 2, kc = (k.lo + k.hi) / 2;
    if (!point(q.lo, k.hi) || !point(q.hi, k.lo)) return kUndecidedBlock;  // unknown on a point
    if (seen_true && seen_false) return 1;
    if (!point(q.lo, k.lo) || !point(q.hi, k.hi) || !point(qc, kc)) return kUndecidedBlock;
    if (seen_true && seen_false) return 1;
    struct Box { IndexRange q, k; };
    Box stack[64 * 4];
    int top = 0;
    stack[top++] = {q, k};
    int budget = kLeafBudget;
    while (top > 0) {
      Box bx = stack[--top];
      const int64_t qm = bx.q.lo + (bx.q.hi - bx.q.lo) / 2, km = bx.k.lo + (bx.k.hi - bx.k.lo) / 2;
      Box ch[4];
      int n = 0;
      const bool sq = bx.q.hi > bx.q.lo, sk = bx.k.hi > bx.k.lo;
      if (sq && sk) {
        ch[n++] = {{bx.q.lo, qm}, {bx.k.lo, km}};
        ch[n++] = {{bx.q.lo, qm}, {km + 1, bx.k.hi}};
        ch[n++] = {{qm + 1, bx.q.hi}, {bx.k.lo, km}};
        ch[n++] = {{qm + 1, bx.q.hi}, {km + 1, bx.k.hi}};
      } else if (sq) {
        ch[n++] = {{bx.q.lo, qm}, bx.k};
        ch[n++] = {{qm + 1, bx.q.hi}, bx.k};
      } else {
        ch[n++] = {bx.q, {bx.k.lo, km}};
        ch[n++] = {bx.q, {km + 1, bx.k.hi}};
      }
      for (int i = 0; i < n; ++i) {
        if (--budget < 0) return kUndecidedBlock;
        MaskVerdict v = ev.eval(b, h, ch[i].q, ch[i].k);
        if (v == MaskVerdict::kTrue) seen_true = true;
        else if (v == MaskVerdict::kFalse) seen_false = true;
        else if (ch[i].q.lo == ch[i].q.hi && ch[i].k.lo == ch[i].k.hi) return kUndecidedBlock;
        else if (top < int(sizeof stack / sizeof stack[0])) stack[top++] = ch[i];
        else return kUndecidedBlock;
        if (seen_true && seen_false) return 1;
      }
    }
    // Every element was covered by a decided box.
    return seen_true && seen_false ? 1 : seen_true ? 2 : 0;
  }
};

}  // namespace
}  // namespace detail

const char* to_string(MaskVerdict v) {
  switch (v) {
    case MaskVerdict::kFalse: return "empty";
    case MaskVerdict::kTrue: return "full";
    case MaskVerdict::kUnknown: return "unknown";
  }
  return "?";
}

ScalarValues scalar_values_of(const Captures& captures) {
  ScalarValues out;
  for (const auto& [name, s] : captures.scalars()) {
    ScalarValue v;
    if (s.is_float) {
      v.type = ScalarType::kF32;
      v.f = s.f;
    } else {
      v.type = ScalarType::kI32;
      v.i = s.i;
    }
    out[name] = v;
  }
  return out;
}

ScalarValues scalar_values_of(const std::map<std::string, double>& preset_values,
                              const Program& program) {
  ScalarValues out;
  for (const auto& [name, x] : preset_values) {
    bool is_float = false;
    for (const Program::Capture& c : program.captures())
      if (!c.is_buffer && c.name == name) is_float = c.is_float;
    ScalarValue v;
    if (is_float) {
      v.type = ScalarType::kF32;
      v.f = static_cast<float>(x);
    } else {
      v.type = ScalarType::kI32;
      v.i = static_cast<int32_t>(x);
    }
    out[name] = v;
  }
  return out;
}

MaskRangeProgram MaskRangeProgram::compile(mlir::Operation* mask_mod) {
  auto m = llvm::dyn_cast_or_null<mlir::fa::MaskModOp>(mask_mod);
  if (!m) throw Error("MaskRangeProgram::compile: expected an fa.mask_mod");
  auto f = std::make_shared<detail::RangeFields>();
  detail::RangeCompiler(*f).run(m);
  return MaskRangeProgram(std::move(f));
}

MaskRangeProgram MaskRangeProgram::compile(const Program& program) {
  return compile(program.impl().mask.getOperation());
}

MaskVerdict MaskRangeProgram::eval(IndexRange b, IndexRange h, IndexRange q, IndexRange kv,
                                   const ScalarValues& scalars) const {
  detail::Evaluator ev(*f_, scalars);
  return ev.eval(b, h, q, kv);
}

bool MaskRangeProgram::reads_b() const { return f_->reads_b; }
bool MaskRangeProgram::reads_h() const { return f_->reads_h; }
bool MaskRangeProgram::reads_buffers() const { return f_->reads_buffers; }
size_t MaskRangeProgram::num_instructions() const { return f_->code.size(); }

MaskAnalysis analyze_block_mask(const MaskRangeProgram& program, int batch, int heads,
                                int64_t len_q, int64_t len_kv, int q_block, int kv_block,
                                const ScalarValues& scalars) {
  if (batch < 1 || heads < 1 || len_q < 1 || len_kv < 1)
    throw Error(fmt::format("block mask needs positive sizes, got B={} H={} Lq={} Lkv={}", batch,
                            heads, len_q, len_kv));
  if (q_block < 1 || kv_block < 1)
    throw Error(fmt::format("block sizes must be positive, got {}x{}", q_block, kv_block));
  if (len_q > std::numeric_limits<int32_t>::max() || len_kv > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("lengths must be below 2^31, got Lq={} Lkv={}", len_q, len_kv));
  const detail::RangeFields& f = program.fields();
  MaskAnalysis a;
  a.batch = f.reads_b ? batch : 1;
  a.heads = f.reads_h ? heads : 1;
  a.num_q_blocks = static_cast<int>((len_q + q_block - 1) / q_block);
  a.num_kv_blocks = static_cast<int>((len_kv + kv_block - 1) / kv_block);
  a.reads_buffers = f.reads_buffers;
  const size_t per = size_t(a.num_q_blocks) * a.num_kv_blocks;
  a.kinds.resize(size_t(a.batch) * a.heads * per);  // every block is written below
  detail::Evaluator ev(f, scalars);
  for (int bi = 0; bi < a.batch; ++bi)
    for (int hi = 0; hi < a.heads; ++hi) {
      detail::Classifier c{ev, f, {bi, bi}, {hi, hi}, len_q, len_kv, q_block, kv_block,
                           a.num_kv_blocks, a.kinds.data() + (size_t(bi) * a.heads + hi) * per};
      c.region(0, a.num_q_blocks, 0, a.num_kv_blocks);
      a.undecided += c.undecided;
    }
  a.decided = int64_t(a.kinds.size()) - a.undecided;
  a.evaluations = ev.evaluations;
  return a;
}

MaskAnalysis analyze_block_mask(const Program& program, int batch, int heads, int64_t len_q,
                                int64_t len_kv, int q_block, int kv_block,
                                const Captures& captures) {
  return analyze_block_mask(MaskRangeProgram::compile(program), batch, heads, len_q, len_kv,
                            q_block, kv_block, scalar_values_of(captures));
}

int64_t evaluate_undecided_blocks(MaskAnalysis& a, const ModProgram& mask,
                                  const Bindings& bindings, int64_t len_q, int64_t len_kv,
                                  int q_block, int kv_block) {
  if (a.undecided == 0) return 0;
  const BoundMod m = mask.bind(bindings);
  const size_t per = size_t(a.num_q_blocks) * a.num_kv_blocks;
  int64_t n = 0;
  for (int bi = 0; bi < a.batch; ++bi)
    for (int hi = 0; hi < a.heads; ++hi)
      for (int qb = 0; qb < a.num_q_blocks; ++qb)
        for (int kb = 0; kb < a.num_kv_blocks; ++kb) {
          uint8_t& kind = a.kinds[(size_t(bi) * a.heads + hi) * per + size_t(qb) * a.num_kv_blocks + kb];
          if (kind != kUndecidedBlock) continue;
          const int q0 = qb * q_block, k0 = kb * kv_block;
          const int q1 = static_cast<int>(std::min<int64_t>(len_q, int64_t(q0) + q_block));
          const int k1 = static_cast<int>(std::min<int64_t>(len_kv, int64_t(k0) + kv_block));
          bool any = false, all = true;
          for (int i = q0; i < q1 && !(any && !all); ++i)
            for (int j = k0; j < k1; ++j) {
              if (m.mask(bi, hi, i, j)) any = true;
              else all = false;
            }
          kind = all ? 2 : any ? 1 : 0;
          ++n;
        }
  a.decided += n;
  a.undecided -= n;
  return n;
}

}  // namespace fa
