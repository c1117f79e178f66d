// The mask range program: lowering of a mask_mod to interval code (RangeCompiler), its
// evaluation (step, Evaluator) and fa::MaskRangeProgram.
#include "fajit/analysis/range_program.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include <fmt/format.h>

#include "fajit/Dialect/FA/BodyOps.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"
#include "fajit/detail/program_impl.h"
#include "fajit/error.h"
#include "fajit/kernel.h"
#include "llvm/ADT/DenseMap.h"

namespace fa {
namespace detail {

using mlir::fa::BodyOp;
using mlir::fa::BodyOpKind;

namespace {

void step(const RInst& in, AVal* r) {
  const AVal a = r[in.src[0]], b = r[in.src[1]];
  AVal& d = r[in.dst];
  const unsigned w = in.w;
  using B = BodyOp;
  const BodyOp op = static_cast<BodyOp>(in.op);
  switch (op) {
    case B::AddI:
      if (w == 1)
        d = single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1);
      else
        d = norm32(a.lo + b.lo, a.hi + b.hi);
      break;
    case B::SubI:
      if (w == 1)
        d = single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1);
      else
        d = norm32(a.lo - b.hi, a.hi - b.lo);
      break;
    case B::MulI:
      if (w == 1)
        d = ival(a.lo & b.lo, a.hi & b.hi);
      else
        d = corners(a, b, [](int64_t x, int64_t y) { return x * y; });
      break;
    case B::DivSI:
    case B::CeilDivSI:
    case B::FloorDivSI:
      // Division by a range holding 0 (UB) or INT_MIN / -1 (UB): anything.
      if (w != 32 || (b.lo <= 0 && b.hi >= 0) || (a.lo == kMin32 && b.lo <= -1 && b.hi >= -1)) {
        d = itop(w);
      } else if (op == B::DivSI) {
        d = corners(a, b, div_trunc);
      } else if (op == B::FloorDivSI) {
        d = corners(a, b, div_floor);
      } else {
        d = corners(a, b, div_ceil);
      }
      break;
    case B::RemSI: {
      if (w != 32 || (b.lo <= 0 && b.hi >= 0) || (a.lo == kMin32 && b.lo <= -1 && b.hi >= -1)) {
        d = itop(w);
        break;
      }
      int64_t m = std::max(std::llabs(b.lo), std::llabs(b.hi)) - 1;  // |a % b| <= |b| - 1
      const int64_t c = std::llabs(b.lo);                            // the sign of a % b is the dividend's
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
    case B::DivUI:
    case B::RemUI: {
      AVal x = uns(a, w), y = uns(b, w);
      if (y.lo == 0) {
        d = itop(w);
      } else if (op == B::DivUI) {
        d = from_uns(ival(x.lo / y.hi, x.hi / y.lo), w);
      } else if (single(y) && x.lo / y.lo == x.hi / y.lo) {
        d = from_uns(ival(x.lo % y.lo, x.hi % y.lo), w);
      } else {
        d = from_uns(ival(0, std::min(x.hi, y.hi - 1)), w);
      }
      break;
    }
    case B::MaxSI:
    case B::MinSI: {
      AVal x = sgn(a, w), y = sgn(b, w);
      d = from_sgn(op == B::MaxSI ? imax(x, y) : imin(x, y), w);
      break;
    }
    case B::MaxUI:
    case B::MinUI: {
      AVal x = uns(a, w), y = uns(b, w);
      d = from_uns(op == B::MaxUI ? imax(x, y) : imin(x, y), w);
      break;
    }
    case B::AndI:
      if (w == 1)
        d = ival(a.lo & b.lo, a.hi & b.hi);
      else if (single(a) && single(b))
        d = ival(a.lo & b.lo, a.lo & b.lo);
      else if (a.lo >= 0 && b.lo >= 0)
        d = ival(0, std::min(a.hi, b.hi));
      else if (a.lo >= 0)
        d = ival(0, a.hi);
      else if (b.lo >= 0)
        d = ival(0, b.hi);
      else
        d = itop(32);
      break;
    case B::OrI:
    case B::XOrI:
      if (w == 1) {
        d = op == B::OrI ? ival(a.lo | b.lo, a.hi | b.hi)
                         : (single(a) && single(b) ? ival(a.lo ^ b.lo, a.lo ^ b.lo) : itop(1));
      } else if (single(a) && single(b)) {
        int64_t v = op == B::OrI ? (a.lo | b.lo) : (a.lo ^ b.lo);
        d = ival(v, v);
      } else if (a.lo >= 0 && b.lo >= 0) {
        d = ival(op == B::OrI ? std::max(a.lo, b.lo) : 0, (int64_t{1} << bits_for(std::max(a.hi, b.hi))) - 1);
      } else {
        d = itop(32);
      }
      break;
    case B::ShLI:
    case B::ShRSI:
    case B::ShRUI: {
      AVal s = uns(b, w);
      if (w != 32 || !single(s) || s.lo >= 32) {
        d = itop(w);
      } else if (op == B::ShLI) {
        d = norm32(a.lo * (int64_t{1} << s.lo), a.hi * (int64_t{1} << s.lo));
      } else if (op == B::ShRSI) {
        d = ival(a.lo >> s.lo, a.hi >> s.lo);
      } else {
        AVal x = uns(a, w);
        d = from_uns(ival(x.lo >> s.lo, x.hi >> s.lo), w);
      }
      break;
    }
    case B::CmpI: d = cmpi(in.pred, a, b, w); break;
    case B::AbsI:
      if (w != 32 || a.lo == kMin32)
        d = itop(w);
      else if (a.lo >= 0)
        d = a;
      else if (a.hi <= 0)
        d = ival(-a.hi, -a.lo);
      else
        d = ival(0, std::max(-a.lo, a.hi));
      break;
    case B::Select: {
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
    case B::ExtUI: d = from_uns(uns(a, w), in.rw); break;
    case B::ExtSI: d = from_sgn(sgn(a, w), in.rw); break;
    case B::TruncI:
      if (in.rw == 1)
        d = single(a) ? ival(a.lo & 1, a.lo & 1) : itop(1);
      else
        d = from_uns(uns(a, w), in.rw);
      break;
    case B::SIToFP: {
      AVal x = sgn(a, w);
      d = fval(static_cast<float>(x.lo), static_cast<float>(x.hi));  // rounding is monotone
      break;
    }
    case B::UIToFP: {
      AVal x = uns(a, w);
      d = fval(static_cast<float>(x.lo), static_cast<float>(x.hi));
      break;
    }
    case B::FPToSI:
    case B::FPToUI: {
      const unsigned rw = in.rw;
      if (rw != 32 || std::isnan(a.flo) || std::isnan(a.fhi)) {
        d = itop(rw);
        break;
      }
      if (op == B::FPToSI) {
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
    case B::AddF: d = fcorners(a, b, [](float x, float y) { return x + y; }); break;
    case B::SubF: d = fcorners(a, b, [](float x, float y) { return x - y; }); break;
    case B::MulF: d = fcorners(a, b, [](float x, float y) { return x * y; }); break;
    case B::DivF:
      if (b.flo <= 0.0f && b.fhi >= 0.0f)
        d = ftop();
      else
        d = fcorners(a, b, [](float x, float y) { return x / y; });
      break;
    case B::NegF: d = fval(-a.fhi, -a.flo), d.nan = a.nan; break;
    case B::AbsF:
      if (a.flo >= 0.0f)
        d = fval(a.flo, a.fhi);
      else if (a.fhi <= 0.0f)
        d = fval(-a.fhi, -a.flo);
      else
        d = fval(0.0f, std::max(-a.flo, a.fhi));
      d.nan = a.nan;
      break;
    case B::MaximumF:
    case B::MaxNumF:
    case B::MinimumF:
    case B::MinNumF:
      if (a.nan || b.nan)
        d = ftop();
      else if (op == B::MaximumF || op == B::MaxNumF)
        d = fval(std::max(a.flo, b.flo), std::max(a.fhi, b.fhi));
      else
        d = fval(std::min(a.flo, b.flo), std::min(a.fhi, b.fhi));
      break;
    case B::Floor: d = fval(std::floor(a.flo), std::floor(a.fhi)), d.nan = a.nan; break;
    case B::Ceil: d = fval(std::ceil(a.flo), std::ceil(a.fhi)), d.nan = a.nan; break;
    case B::Sqrt:
      if (a.nan || a.flo < 0.0f)
        d = ftop();
      else
        d = fval(std::sqrt(a.flo), std::sqrt(a.fhi));
      break;
    case B::CmpF: d = cmpf(in.pred, a, b); break;
    default:  // kRangeTop: the ops modelled_as_anything()
      d = in.rw ? itop(in.rw) : ftop();
      break;
  }
}

// ---- compile ---------------------------------------------------------------------------------

unsigned int_width(mlir::Type t) {
  if (auto it = llvm::dyn_cast<mlir::IntegerType>(t)) return it.getWidth();
  return 0;
}

// The body ops step() models as "anything of their type" (its default case): fa.load, and the
// ops whose GPU results the host cannot reproduce bit for bit (transcendental math) or that
// have no transfer function yet (remf). A program holding one is opaque.
bool modelled_as_anything(BodyOp op) {
  using B = BodyOp;
  switch (op) {
    case B::Load:
    case B::RemF:
    case B::Exp:
    case B::Exp2:
    case B::Log:
    case B::Log2:
    case B::Tanh:
    case B::Rsqrt:
    case B::Sin:
    case B::Cos:
    case B::PowF:
    case B::Erf: return true;
    default: return false;
  }
}

class RangeCompiler {
 public:
  explicit RangeCompiler(RangeFields& f) : f_(f) {}

  void run(mlir::fa::MaskModOp mask) {
    mlir::Block& entry = mask.getEntryBlock();
    for (unsigned i = 0; i < 4; ++i) {
      regs_[entry.getArgument(i)] = new_reg(itop(32));
    }
    taint_[entry.getArgument(0)] = kTaintB;
    taint_[entry.getArgument(1)] = kTaintH;
    mlir::fa::ModUses uses = mlir::fa::computeUses(mask.getOperation());
    f_.reads_b = uses.b;
    f_.reads_h = uses.h;
    f_.reads_buffers = !uses.buffers.empty();
    for (mlir::Operation& op : entry) {
      if (auto y = llvm::dyn_cast<mlir::fa::YieldOp>(op)) {
        f_.result = reg(y.getValue());
        const uint8_t t = taint_.lookup(y.getValue());
        f_.verdict_reads_b = (t & kTaintB) != 0;
        f_.verdict_reads_h = (t & kTaintH) != 0;
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
    std::optional<BodyOp> code = mlir::fa::getBodyOp(op);
    if (!code)
      throw Error(fmt::format("mask range analysis: '{}' is not a mask_mod body op",
                              op->getName().getStringRef().str()));
    const bool anything = modelled_as_anything(*code);
    RInst in{};
    // One rule for the value and for what b / h reach: an op modelled as anything is emitted as
    // kRangeTop, so a transfer function given to it takes effect only once it leaves that list,
    // and with it b / h start flowing through it.
    in.op = anything ? kRangeTop : static_cast<uint8_t>(*code);
    static_assert(mlir::fa::kNumBodyOps <= kRangeTop, "kRangeTop must not be a BodyOp");
    in.rw = static_cast<uint8_t>(rw);
    in.w = static_cast<uint8_t>(rw);
    switch (mlir::fa::getBodyOpKind(*code)) {
      case BodyOpKind::IntCompare:
      case BodyOpKind::IntExtend:
      case BodyOpKind::IntTruncate:
      case BodyOpKind::IntToFloat: in.w = static_cast<uint8_t>(int_width(op->getOperand(0).getType())); break;
      default: break;
    }
    if (auto c = llvm::dyn_cast<mlir::arith::CmpIOp>(op))
      in.pred = static_cast<uint8_t>(c.getPredicate());
    else if (auto c = llvm::dyn_cast<mlir::arith::CmpFOp>(op))
      in.pred = static_cast<uint8_t>(c.getPredicate());
    if (anything) f_.opaque = true;
    uint8_t taint = 0;  // what the result may depend on: nothing for an op modelled as anything
    for (unsigned i = 0; i < op->getNumOperands() && i < 3; ++i) {
      mlir::Value v = op->getOperand(i);
      if (llvm::isa<mlir::fa::BufferType>(v.getType())) continue;
      in.src[i] = reg(v);
      if (!anything) taint |= taint_.lookup(v);
    }
    if (taint) taint_[op->getResult(0)] = taint;
    in.dst = new_reg(top_of(rt));
    regs_[op->getResult(0)] = in.dst;
    f_.code.push_back(in);
  }

  static constexpr uint8_t kTaintB = 1, kTaintH = 2;
  RangeFields& f_;
  llvm::DenseMap<mlir::Value, uint32_t> regs_;
  llvm::DenseMap<mlir::Value, uint8_t> taint_;  // values that b (kTaintB) / h (kTaintH) may reach
};

}  // namespace

// ---- evaluation ----------------------------------------------------------------------------

Evaluator::Evaluator(const RangeFields& f, const ScalarValues& scalars) : f_(f), regs_(f.init) {
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

MaskVerdict Evaluator::eval(const IndexRange& b, const IndexRange& h, const IndexRange& q,
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

ScalarValues scalar_values_of(const std::map<std::string, double>& preset_values, const Program& program) {
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
      v.i = i32_scalar_value(name, x);
    }
    out[name] = v;
  }
  return out;
}

int32_t i32_scalar_value(const std::string& name, double x) {
  if (!(x >= double(INT32_MIN) && x <= double(INT32_MAX)) || x != std::floor(x))
    throw Error(fmt::format("scalar '{}' is an i32: {} is not an integer in [{}, {}]", name, x, INT32_MIN,
                            INT32_MAX));
  return static_cast<int32_t>(x);
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

}  // namespace fa
