// fa::ModProgram: compile an fa.score_mod / fa.mask_mod body into flat register code, and run it.
#include "fajit/detail/interp.h"

#include "fajit/detail/program_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "fajit/Dialect/FA/BodyOps.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/error.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/TypeSwitch.h"

namespace fa {
namespace detail {

using mlir::fa::BodyOp;
using mlir::fa::BodyOpKind;

namespace {

// ---- width-aware integer helpers (w is 1 or 32) -------------------------------------------
inline uint32_t mask_of(unsigned w) { return w >= 32 ? ~0u : ((1u << w) - 1u); }
inline uint32_t zext(uint32_t x, unsigned w) { return x & mask_of(w); }
inline int32_t sext(uint32_t x, unsigned w) {
  unsigned sh = 32 - w;
  return static_cast<int32_t>(x << sh) >> sh;
}
inline int64_t smin_of(unsigned w) { return -(int64_t{1} << (w - 1)); }
inline int64_t smax_of(unsigned w) { return (int64_t{1} << (w - 1)) - 1; }
inline uint32_t trunc(int64_t x, unsigned w) { return static_cast<uint32_t>(x) & mask_of(w); }

std::string name_of(BodyOp op) { return mlir::fa::getBodyOpName(op).str(); }

[[noreturn]] void throw_div_zero(BodyOp op) {
  throw Error(fmt::format("division by zero in {}", name_of(op)));
}
[[noreturn]] void throw_div_overflow(BodyOp op, int64_t a, int64_t b) {
  throw Error(fmt::format("signed division overflow ({} / {}) in {}", a, b, name_of(op)));
}
[[noreturn]] void throw_shift(BodyOp op, uint32_t amount, unsigned w) {
  throw Error(fmt::format("shift amount {} is out of range for i{} in {}", amount, w, name_of(op)));
}

// Signed division family: checks, then the rounding `op` asks for.
inline uint32_t sdiv(BodyOp op, uint32_t ua, uint32_t ub, unsigned w) {
  int64_t a = sext(ua, w), b = sext(ub, w);
  if (b == 0) throw_div_zero(op);
  if (a == smin_of(w) && b == -1) throw_div_overflow(op, a, b);
  int64_t q = a / b, r = a % b;
  switch (op) {
    case BodyOp::DivSI: return trunc(q, w);
    case BodyOp::RemSI: return trunc(r, w);
    case BodyOp::FloorDivSI: return trunc(r != 0 && ((r < 0) != (b < 0)) ? q - 1 : q, w);
    default: /* CeilDivSI */ return trunc(r != 0 && ((r < 0) == (b < 0)) ? q + 1 : q, w);
  }
}

inline bool cmpi(uint16_t pred, uint32_t a, uint32_t b, unsigned w) {
  using P = mlir::arith::CmpIPredicate;
  switch (static_cast<P>(pred)) {
    case P::eq: return zext(a, w) == zext(b, w);
    case P::ne: return zext(a, w) != zext(b, w);
    case P::slt: return sext(a, w) < sext(b, w);
    case P::sle: return sext(a, w) <= sext(b, w);
    case P::sgt: return sext(a, w) > sext(b, w);
    case P::sge: return sext(a, w) >= sext(b, w);
    case P::ult: return zext(a, w) < zext(b, w);
    case P::ule: return zext(a, w) <= zext(b, w);
    case P::ugt: return zext(a, w) > zext(b, w);
    case P::uge: return zext(a, w) >= zext(b, w);
  }
  return false;
}

inline bool cmpf(uint16_t pred, float a, float b) {
  using P = mlir::arith::CmpFPredicate;
  bool unordered = std::isnan(a) || std::isnan(b);
  switch (static_cast<P>(pred)) {
    case P::AlwaysFalse: return false;
    case P::OEQ: return !unordered && a == b;
    case P::OGT: return !unordered && a > b;
    case P::OGE: return !unordered && a >= b;
    case P::OLT: return !unordered && a < b;
    case P::OLE: return !unordered && a <= b;
    case P::ONE: return !unordered && a != b;
    case P::ORD: return !unordered;
    case P::UEQ: return unordered || a == b;
    case P::UGT: return unordered || a > b;
    case P::UGE: return unordered || a >= b;
    case P::ULT: return unordered || a < b;
    case P::ULE: return unordered || a <= b;
    case P::UNE: return unordered || a != b;
    case P::UNO: return unordered;
    case P::AlwaysTrue: return true;
  }
  return false;
}

// max/min ordering -0 below +0; NaN handled by the callers.
inline float fmax_ordered(float a, float b) {
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
inline float fmin_ordered(float a, float b) {
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

// cvt.rzi with saturation to [lo, hi]; NaN -> 0.
inline int64_t fp_to_int_sat(float f, int64_t lo, int64_t hi) {
  if (std::isnan(f)) return 0;
  double t = std::trunc(static_cast<double>(f));
  if (t <= static_cast<double>(lo)) return lo;
  if (t >= static_cast<double>(hi)) return hi;
  return static_cast<int64_t>(t);
}

[[noreturn]] void throw_oob(const std::string& capture, int32_t idx, int dim, int64_t size) {
  throw Error(fmt::format("capture '{}' index {} is out of bounds for dimension {} of size {}", capture, idx,
                          dim, size));
}

}  // namespace
}  // namespace detail

// ---- Bindings ------------------------------------------------------------------------------

const char* scalar_type_name(ScalarType t) {
  switch (t) {
    case ScalarType::kI1: return "i1";
    case ScalarType::kI32: return "i32";
    case ScalarType::kF32: return "f32";
  }
  return "?";
}

HostBuffer HostBuffer::f32(const float* data, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  return HostBuffer{ScalarType::kF32, std::move(shape), std::move(strides), data};
}
HostBuffer HostBuffer::i32(const int32_t* data, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  return HostBuffer{ScalarType::kI32, std::move(shape), std::move(strides), data};
}

Bindings& Bindings::buffer(std::string name, HostBuffer buf) {
  buffers_[std::move(name)] = std::move(buf);
  return *this;
}
Bindings& Bindings::scalar_f32(std::string name, float value) {
  ScalarValue v;
  v.type = ScalarType::kF32;
  v.f = value;
  scalars_[std::move(name)] = v;
  return *this;
}
Bindings& Bindings::scalar_i32(std::string name, int32_t value) {
  ScalarValue v;
  v.type = ScalarType::kI32;
  v.i = value;
  scalars_[std::move(name)] = v;
  return *this;
}
const HostBuffer* Bindings::find_buffer(std::string_view name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : &it->second;
}
const ScalarValue* Bindings::find_scalar(std::string_view name) const {
  auto it = scalars_.find(name);
  return it == scalars_.end() ? nullptr : &it->second;
}

// ---- compile -------------------------------------------------------------------------------

namespace {

using detail::Inst;
using mlir::fa::BodyOp;
using mlir::fa::BodyOpKind;

std::string op_label(mlir::Operation* op) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "'" << op->getName() << "'";
  return s;
}

unsigned int_width(mlir::Type t) {
  if (auto it = llvm::dyn_cast<mlir::IntegerType>(t)) return it.getWidth();
  return 0;
}

ScalarType scalar_type_of(mlir::Type t) {
  if (t.isF32()) return ScalarType::kF32;
  if (t.isSignlessInteger(1)) return ScalarType::kI1;
  return ScalarType::kI32;
}

class Compiler {
 public:
  explicit Compiler(detail::ModFields& f) : f_(f) {}
  void run(mlir::Operation* mod);

 private:
  uint32_t new_reg() {
    f_.init.push_back(detail::Reg{0});
    return static_cast<uint32_t>(f_.init.size() - 1);
  }
  uint32_t reg_of(mlir::Value v, mlir::Operation* user) {
    auto it = regs_.find(v);
    if (it == regs_.end())
      throw Error(fmt::format("{} in {} @{} uses a value the interpreter cannot read", op_label(user),
                              kind_name_, f_.name));
    return it->second;
  }
  void emit(mlir::Operation* op, BodyOp code, unsigned width, uint16_t aux = 0) {
    Inst in{};
    in.op = static_cast<uint8_t>(code);
    in.width = static_cast<uint8_t>(width);
    in.aux = aux;
    for (unsigned i = 0; i < op->getNumOperands(); ++i) in.src[i] = reg_of(op->getOperand(i), op);
    uint32_t dst = new_reg();
    in.dst = dst;
    regs_[op->getResult(0)] = dst;
    f_.code.push_back(in);
  }
  [[noreturn]] void unsupported(mlir::Operation* op, const std::string& why = "") {
    throw Error(fmt::format("{} is not supported by the interpreter (in {} @{}){}", op_label(op), kind_name_,
                            f_.name, why));
  }
  void compile_op(mlir::Operation* op);

  detail::ModFields& f_;
  std::string kind_name_;
  llvm::DenseMap<mlir::Value, uint32_t> regs_;
  llvm::DenseMap<mlir::Value, unsigned> capture_slot_;
  llvm::StringMap<uint32_t> scalar_reg_;
};

void Compiler::run(mlir::Operation* mod) {
  if (!mod) throw Error("ModProgram::compile: null operation");
  auto body = llvm::dyn_cast<mlir::fa::ModBody>(mod);
  if (!body)
    throw Error(
        fmt::format("ModProgram::compile: expected an fa.score_mod, fa.mask_mod or fa.score_grad, got {}",
                    op_label(mod)));
  f_.kind = llvm::isa<mlir::fa::ScoreModOp>(mod)  ? ModKind::kScore
            : llvm::isa<mlir::fa::MaskModOp>(mod) ? ModKind::kMask
                                                  : ModKind::kScoreGrad;
  kind_name_ = body.getKindName().str();
  f_.name = body.getModName().str();
  mlir::Block* entry = &body.getEntryBlock();
  const unsigned fixed = body.getNumFixedArgs();
  llvm::SmallVector<llvm::StringRef> capture_names;
  for (unsigned i = fixed; i < entry->getNumArguments(); ++i)
    capture_names.push_back(body.getCaptureName(i - fixed));
  // Fixed arguments live in registers 0..fixed-1: [score,] b, h, q, kv[, dt].
  for (unsigned i = 0; i < fixed; ++i) regs_[entry->getArgument(i)] = new_reg();
  for (unsigned i = fixed; i < entry->getNumArguments(); ++i) {
    auto bt = llvm::dyn_cast<mlir::fa::BufferType>(entry->getArgument(i).getType());
    if (!bt) unsupported(mod, ": a capture is not an !fa.buffer");
    unsigned slot = i - fixed;
    capture_slot_[entry->getArgument(i)] = slot;
    f_.captures.push_back(CaptureInfo{capture_names[slot].str(), scalar_type_of(bt.getElementType()),
                                      static_cast<int>(bt.getRank())});
  }
  bool yielded = false;
  for (mlir::Operation& op : *entry) {
    if (auto y = llvm::dyn_cast<mlir::fa::YieldOp>(op)) {
      f_.result = reg_of(y.getValue(), &op);
      yielded = true;
      break;
    }
    compile_op(&op);
  }
  if (!yielded) throw Error(fmt::format("{} @{} has no fa.yield", kind_name_, f_.name));
}

void Compiler::compile_op(mlir::Operation* op) {
  namespace arith = mlir::arith;
  if (auto g = llvm::dyn_cast<mlir::fa::GradAddOp>(op)) {
    auto it = capture_slot_.find(g.getBuffer());
    if (it == capture_slot_.end()) unsupported(op, ": buffer is not a capture");
    if (g.getIndices().size() > 4) unsupported(op, ": buffers have rank 4 at most");
    Inst in{};
    in.op = detail::kGradAddOp;
    in.width = static_cast<uint8_t>(g.getIndices().size());
    in.aux = static_cast<uint16_t>(it->second);
    for (unsigned i = 0; i < g.getIndices().size(); ++i) in.src[i] = reg_of(g.getIndices()[i], op);
    in.dst = reg_of(g.getValue(), op);
    f_.code.push_back(in);
    return;
  }
  if (!mlir::fa::isSupportedBodyOp(op) || op->getNumResults() != 1) unsupported(op);
  mlir::Type rt = op->getResult(0).getType();
  if (!(rt.isF32() || rt.isSignlessInteger(1) || rt.isSignlessInteger(32)))
    unsupported(op, fmt::format(": result type is not i1, i32 or f32"));
  unsigned rw = int_width(rt);
  auto src_width = [&]() { return int_width(op->getOperand(0).getType()); };

  if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
    uint32_t r = new_reg();
    mlir::Attribute v = c.getValue();
    if (auto fa = llvm::dyn_cast<mlir::FloatAttr>(v); fa && rt.isF32())
      f_.init[r].f = static_cast<float>(fa.getValueAsDouble());
    else if (auto ia = llvm::dyn_cast<mlir::IntegerAttr>(v); ia && rw)
      f_.init[r].u = static_cast<uint32_t>(ia.getValue().getZExtValue()) & detail::mask_of(rw);
    else
      unsupported(op, ": constant is not an i1, i32 or f32 scalar");
    regs_[op->getResult(0)] = r;
    return;
  }
  if (auto s = llvm::dyn_cast<mlir::fa::ScalarOp>(op)) {
    ScalarType t = scalar_type_of(rt);
    auto it = scalar_reg_.find(s.getName());
    if (it != scalar_reg_.end()) {
      for (size_t i = 0; i < f_.scalars.size(); ++i)
        if (f_.scalars[i].name == s.getName() && f_.scalars[i].type != t)
          throw Error(fmt::format("scalar '{}' is used as {} and as {} in {} @{}", s.getName().str(),
                                  scalar_type_name(f_.scalars[i].type), scalar_type_name(t), kind_name_,
                                  f_.name));
      regs_[op->getResult(0)] = it->second;
      return;
    }
    uint32_t r = new_reg();
    scalar_reg_[s.getName()] = r;
    f_.scalars.push_back(ScalarInfo{s.getName().str(), t});
    f_.scalar_regs.push_back(r);
    regs_[op->getResult(0)] = r;
    return;
  }
  if (auto l = llvm::dyn_cast<mlir::fa::LoadOp>(op)) {
    auto it = capture_slot_.find(l.getBuffer());
    if (it == capture_slot_.end()) unsupported(op, ": buffer is not a capture");
    Inst in{};
    in.op = static_cast<uint8_t>(BodyOp::Load);
    in.width = static_cast<uint8_t>(l.getIndices().size());
    in.aux = static_cast<uint16_t>(it->second);
    if (l.getIndices().size() > 4) unsupported(op, ": buffers have rank 4 at most");
    for (unsigned i = 0; i < l.getIndices().size(); ++i) in.src[i] = reg_of(l.getIndices()[i], op);
    in.dst = new_reg();
    regs_[op->getResult(0)] = in.dst;
    f_.code.push_back(in);
    return;
  }
  if (auto c = llvm::dyn_cast<arith::CmpIOp>(op))
    return emit(op, BodyOp::CmpI, src_width(), static_cast<uint16_t>(c.getPredicate()));
  if (auto c = llvm::dyn_cast<arith::CmpFOp>(op))
    return emit(op, BodyOp::CmpF, 0, static_cast<uint16_t>(c.getPredicate()));

  // Everything else: its opcode, width from the result (or the source for casts from int).
  std::optional<BodyOp> code = mlir::fa::getBodyOp(op);
  if (!code || op->getNumOperands() > 3) unsupported(op);
  const BodyOpKind kind = mlir::fa::getBodyOpKind(*code);
  const unsigned w = kind == BodyOpKind::IntToFloat || kind == BodyOpKind::IntExtend ? src_width() : rw;
  // Operand types must be the body types too (the verifier checks; keep the oracle honest).
  for (mlir::Value v : op->getOperands()) {
    mlir::Type t = v.getType();
    if (!(t.isF32() || t.isSignlessInteger(1) || t.isSignlessInteger(32)))
      unsupported(op, ": operand type is not i1, i32 or f32");
  }
  emit(op, *code, w);
}

}  // namespace

ModProgram ModProgram::compile(mlir::Operation* mod) {
  auto f = std::make_shared<detail::ModFields>();
  Compiler(*f).run(mod);
  return ModProgram(std::move(f));
}

// ---- bind ----------------------------------------------------------------------------------

BoundMod ModProgram::bind(const Bindings& env) const {
  const detail::ModFields& f = *f_;
  BoundMod bm(*this);
  bm.buffers_.reserve(f.captures.size());
  for (const CaptureInfo& c : f.captures) {
    const HostBuffer* hb = env.find_buffer(c.name);
    if (!hb)
      throw Error(fmt::format("missing capture '{}' (a {} buffer of rank {})", c.name,
                              scalar_type_name(c.dtype), c.rank));
    if (hb->dtype != c.dtype)
      throw Error(fmt::format("capture '{}' must be a {} buffer, got {}", c.name, scalar_type_name(c.dtype),
                              scalar_type_name(hb->dtype)));
    if (static_cast<int>(hb->shape.size()) != c.rank)
      throw Error(fmt::format("capture '{}' must have rank {}, got {}", c.name, c.rank, hb->shape.size()));
    if (!hb->strides.empty() && hb->strides.size() != hb->shape.size())
      throw Error(fmt::format("capture '{}' has {} strides for {} dimensions", c.name, hb->strides.size(),
                              hb->shape.size()));
    detail::BoundBuffer b{};
    b.data = static_cast<const char*>(hb->data);
    int64_t contiguous = 1, numel = 1;
    for (int d = c.rank - 1; d >= 0; --d) {
      if (hb->shape[d] < 0)
        throw Error(
            fmt::format("capture '{}' has negative size {} in dimension {}", c.name, hb->shape[d], d));
      b.shape[d] = hb->shape[d];
      b.stride[d] = (hb->strides.empty() ? contiguous : hb->strides[d]) * 4;
      contiguous *= hb->shape[d];
      numel *= hb->shape[d];
    }
    if (numel > 0 && !b.data) throw Error(fmt::format("capture '{}' has no data", c.name));
    bm.buffers_.push_back(b);
  }
  bm.scalar_values_.reserve(f.scalars.size());
  for (const ScalarInfo& s : f.scalars) {
    const ScalarValue* v = env.find_scalar(s.name);
    if (!v) throw Error(fmt::format("missing scalar '{}' ({})", s.name, scalar_type_name(s.type)));
    if (v->type != s.type)
      throw Error(fmt::format("scalar '{}' must be {}, got {}", s.name, scalar_type_name(s.type),
                              scalar_type_name(v->type)));
    detail::Reg r;
    if (s.type == ScalarType::kF32)
      r.f = v->f;
    else
      r.i = v->i;
    bm.scalar_values_.push_back(r);
  }
  return bm;
}

float ModProgram::eval_score(float score, int b, int h, int q, int kv, const Bindings& env) const {
  return bind(env).score(score, b, h, q, kv);
}

bool ModProgram::eval_mask(int b, int h, int q, int kv, const Bindings& env) const {
  return bind(env).mask(b, h, q, kv);
}

// ---- run -----------------------------------------------------------------------------------

float ModProgram::eval_score_grad(float score, int b, int h, int q, int kv, float dt, const Bindings& env,
                                  const GradSink& sink) const {
  return bind(env).score_grad(score, b, h, q, kv, dt, sink);
}

namespace {
const char* kind_noun(ModKind k) {
  switch (k) {
    case ModKind::kScore: return "a score_mod";
    case ModKind::kMask: return "a mask_mod";
    case ModKind::kScoreGrad: return "a score_grad";
  }
  return "?";
}
}  // namespace

float BoundMod::score(float score, int b, int h, int q, int kv) const {
  if (prog_.f_->kind != ModKind::kScore)
    throw Error(fmt::format("@{} is {}, not a score_mod", prog_.f_->name, kind_noun(prog_.f_->kind)));
  const int32_t args[4] = {b, h, q, kv};
  return run(args, score).f;
}

float BoundMod::score_grad(float score, int b, int h, int q, int kv, float dt, const GradSink& sink) const {
  if (prog_.f_->kind != ModKind::kScoreGrad)
    throw Error(fmt::format("@{} is {}, not a score_grad", prog_.f_->name, kind_noun(prog_.f_->kind)));
  const int32_t args[4] = {b, h, q, kv};
  return run(args, score, dt, sink ? &sink : nullptr).f;
}

bool BoundMod::mask(int b, int h, int q, int kv) const {
  if (prog_.f_->kind != ModKind::kMask)
    throw Error(fmt::format("@{} is {}, not a mask_mod", prog_.f_->name, kind_noun(prog_.f_->kind)));
  const int32_t args[4] = {b, h, q, kv};
  return (run(args, 0.0f).u & 1u) != 0;
}

detail::Reg BoundMod::run(const int32_t* args, float score, float dt, const GradSink* sink) const {
  using namespace detail;
  using B = BodyOp;
  const detail::ModFields& f = *prog_.f_;
  constexpr size_t kStackRegs = 256;
  Reg stack_regs[kStackRegs];
  Reg* r = stack_regs;
  if (f.init.size() > kStackRegs) {
    thread_local std::vector<Reg> heap_regs;
    if (heap_regs.size() < f.init.size()) heap_regs.resize(f.init.size());
    r = heap_regs.data();
  }
  std::memcpy(r, f.init.data(), f.init.size() * sizeof(Reg));
  unsigned a0 = 0;
  if (f.kind != ModKind::kMask) r[a0++].f = score;
  for (int i = 0; i < 4; ++i) r[a0 + i].i = args[i];
  if (f.kind == ModKind::kScoreGrad) r[a0 + 4].f = dt;
  for (size_t i = 0; i < scalar_values_.size(); ++i) r[f.scalar_regs[i]] = scalar_values_[i];

  for (const Inst& in : f.code) {
    if (in.op == kGradAddOp) {
      const BoundBuffer& buf = buffers_[in.aux];
      GradAdd g{f.captures[in.aux].name, in.aux, in.width, {0, 0, 0, 0}, r[in.dst].f};
      for (unsigned k = 0; k < in.width; ++k) {
        int32_t idx = r[in.src[k]].i;
        if (idx < 0 || idx >= buf.shape[k])
          throw_oob(f.captures[in.aux].name, idx, static_cast<int>(k), buf.shape[k]);
        g.index[k] = idx;
      }
      if (sink) (*sink)(g);
      continue;
    }
    const unsigned w = in.width;
    const Reg a = r[in.src[0]], b = r[in.src[1]];
    Reg& d = r[in.dst];
    const BodyOp op = static_cast<BodyOp>(in.op);
    switch (op) {
      case B::AddI: d.u = zext(a.u + b.u, w); break;
      case B::SubI: d.u = zext(a.u - b.u, w); break;
      case B::MulI: d.u = zext(a.u * b.u, w); break;
      case B::DivSI:
      case B::RemSI:
      case B::FloorDivSI:
      case B::CeilDivSI: d.u = sdiv(op, a.u, b.u, w); break;
      case B::DivUI:
      case B::RemUI: {
        uint32_t x = zext(a.u, w), y = zext(b.u, w);
        if (y == 0) throw_div_zero(op);
        d.u = op == B::DivUI ? x / y : x % y;
        break;
      }
      case B::MaxSI: d.u = sext(a.u, w) >= sext(b.u, w) ? a.u : b.u; break;
      case B::MinSI: d.u = sext(a.u, w) <= sext(b.u, w) ? a.u : b.u; break;
      case B::MaxUI: d.u = zext(a.u, w) >= zext(b.u, w) ? a.u : b.u; break;
      case B::MinUI: d.u = zext(a.u, w) <= zext(b.u, w) ? a.u : b.u; break;
      case B::AndI: d.u = a.u & b.u; break;
      case B::OrI: d.u = a.u | b.u; break;
      case B::XOrI: d.u = a.u ^ b.u; break;
      case B::ShLI:
      case B::ShRSI:
      case B::ShRUI: {
        uint32_t amount = zext(b.u, w);
        if (amount >= w) throw_shift(op, amount, w);
        if (op == B::ShLI)
          d.u = zext(a.u << amount, w);
        else if (op == B::ShRSI)
          d.u = zext(static_cast<uint32_t>(sext(a.u, w) >> amount), w);
        else
          d.u = zext(a.u, w) >> amount;
        break;
      }
      case B::CmpI: d.u = cmpi(in.aux, a.u, b.u, w) ? 1u : 0u; break;
      case B::AbsI: {
        int32_t s = sext(a.u, w);
        d.u = zext(s < 0 ? 0u - static_cast<uint32_t>(s) : static_cast<uint32_t>(s), w);
        break;
      }
      case B::AddF: d.f = a.f + b.f; break;
      case B::SubF: d.f = a.f - b.f; break;
      case B::MulF: d.f = a.f * b.f; break;
      case B::DivF: d.f = a.f / b.f; break;
      case B::RemF: d.f = std::fmod(a.f, b.f); break;
      case B::NegF: d.f = -a.f; break;
      case B::MaximumF:
        d.f = (std::isnan(a.f) || std::isnan(b.f)) ? std::numeric_limits<float>::quiet_NaN()
                                                   : fmax_ordered(a.f, b.f);
        break;
      case B::MinimumF:
        d.f = (std::isnan(a.f) || std::isnan(b.f)) ? std::numeric_limits<float>::quiet_NaN()
                                                   : fmin_ordered(a.f, b.f);
        break;
      case B::MaxNumF: d.f = std::isnan(a.f) ? b.f : std::isnan(b.f) ? a.f : fmax_ordered(a.f, b.f); break;
      case B::MinNumF: d.f = std::isnan(a.f) ? b.f : std::isnan(b.f) ? a.f : fmin_ordered(a.f, b.f); break;
      case B::CmpF: d.u = cmpf(in.aux, a.f, b.f) ? 1u : 0u; break;
      case B::Exp: d.f = std::exp(a.f); break;
      case B::Exp2: d.f = std::exp2(a.f); break;
      case B::Log: d.f = std::log(a.f); break;
      case B::Log2: d.f = std::log2(a.f); break;
      case B::Tanh: d.f = std::tanh(a.f); break;
      case B::Sqrt: d.f = std::sqrt(a.f); break;
      case B::Rsqrt: d.f = 1.0f / std::sqrt(a.f); break;
      case B::AbsF: d.f = std::fabs(a.f); break;
      case B::Sin: d.f = std::sin(a.f); break;
      case B::Cos: d.f = std::cos(a.f); break;
      case B::PowF: d.f = std::pow(a.f, b.f); break;
      case B::Floor: d.f = std::floor(a.f); break;
      case B::Ceil: d.f = std::ceil(a.f); break;
      case B::Erf: d.f = std::erf(a.f); break;
      case B::SIToFP: d.f = static_cast<float>(sext(a.u, w)); break;
      case B::UIToFP: d.f = static_cast<float>(zext(a.u, w)); break;
      case B::FPToSI: d.u = trunc(fp_to_int_sat(a.f, smin_of(w), smax_of(w)), w); break;
      case B::FPToUI: d.u = trunc(fp_to_int_sat(a.f, 0, static_cast<int64_t>(mask_of(w))), w); break;
      case B::ExtUI: d.u = zext(a.u, w); break;
      case B::ExtSI: d.u = static_cast<uint32_t>(sext(a.u, w)); break;
      case B::TruncI: d.u = zext(a.u, w); break;
      case B::Select: d = (a.u & 1u) ? b : r[in.src[2]]; break;
      case B::Load: {
        const BoundBuffer& buf = buffers_[in.aux];
        const char* p = buf.data;
        for (unsigned k = 0; k < w; ++k) {
          int32_t idx = r[in.src[k]].i;
          if (idx < 0 || idx >= buf.shape[k])
            throw_oob(f.captures[in.aux].name, idx, static_cast<int>(k), buf.shape[k]);
          p += static_cast<int64_t>(idx) * buf.stride[k];
        }
        std::memcpy(&d, p, sizeof(Reg));
        break;
      }
      default: throw Error("internal: bad interpreter opcode", ErrorCode::kInternal);
    }
  }
  return r[f.result];
}

}  // namespace fa

namespace fa {
ModProgram ModProgram::score_of(const Program& program) {
  return compile(program.impl().score.getOperation());
}
ModProgram ModProgram::mask_of(const Program& program) { return compile(program.impl().mask.getOperation()); }
ModProgram ModProgram::grad_of(const Program& program) {
  return compile(detail::score_grad_of(program).getOperation());
}
}  // namespace fa
