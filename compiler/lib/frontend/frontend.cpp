// Tracing: symbolic fa::Index / fa::Score / fa::Bool operations append ops to the mod
// being traced on this thread.
#include "fajit/frontend.h"

#include <atomic>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include "mlir/IR/Builders.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/detail/program_impl.h"

namespace fa {
namespace detail {
namespace {

using mlir::Value;

struct TraceState {
  mlir::OpBuilder builder;
  mlir::Block* block = nullptr;
  mlir::Location loc;
  unsigned long long id = 0;
  std::string what = "";  // "score_mod 'alibi'", for messages
  struct CaptureInfo {
    unsigned arg;
    ValueKind kind;
    int rank;
  };
  std::map<std::string, CaptureInfo> captures = {};
  std::vector<std::string> capture_order = {};
};

thread_local TraceState* t_trace = nullptr;
std::atomic<unsigned long long> g_next_trace{1};

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

TraceState& active(const char* what) {
  if (!t_trace)
    throw Error(
        fmt::format("{} used outside of a trace: build symbolic values inside a score_mod/mask_mod "
                    "traced by fa::trace or fa::compile",
                    what));
  return *t_trace;
}

Value value_of(const Sym& s, const char* what) {
  TraceState& t = active(what);
  if (s.value == nullptr) throw Error(fmt::format("{}: uninitialised symbolic value in {}", what, t.what));
  if (s.trace != t.id)
    throw Error(
        fmt::format("{}: a symbolic value from another trace was used in {} (symbolic values must not be "
                    "kept between traces)",
                    what, t.what));
  return Value::getFromOpaquePointer(s.value);
}

Sym wrap(Value v) { return Sym{v.getAsOpaquePointer(), t_trace->id}; }

ValueKind kind_of(Value v) {
  mlir::Type t = v.getType();
  if (t.isF32()) return ValueKind::kFloat;
  if (t.isSignlessInteger(1)) return ValueKind::kBool;
  return ValueKind::kInt;
}

const char* kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::kInt: return "fa::Index";
    case ValueKind::kFloat: return "fa::Score";
    case ValueKind::kBool: return "fa::Bool";
  }
  return "?";
}

mlir::Type type_of(mlir::OpBuilder& b, ValueKind k) {
  switch (k) {
    case ValueKind::kInt: return b.getI32Type();
    case ValueKind::kFloat: return b.getF32Type();
    case ValueKind::kBool: return b.getI1Type();
  }
  return {};
}

}  // namespace

Sym constant_int(int32_t v) {
  TraceState& t = active("fa::Index constant");
  return wrap(t.builder.create<mlir::arith::ConstantIntOp>(t.loc, v, 32));
}

Sym constant_float(float v) {
  TraceState& t = active("fa::Score constant");
  return wrap(
      t.builder.create<mlir::arith::ConstantFloatOp>(t.loc, llvm::APFloat(v), t.builder.getF32Type()));
}

Sym constant_bool(bool v) {
  TraceState& t = active("fa::Bool constant");
  return wrap(t.builder.create<mlir::arith::ConstantIntOp>(t.loc, v ? 1 : 0, 1));
}

Sym binary(BinOp op, Sym sa, Sym sb) {
  namespace arith = mlir::arith;
  Value a = value_of(sa, "binary operator"), b = value_of(sb, "binary operator");
  TraceState& t = *t_trace;
  auto& bld = t.builder;
  ValueKind k = kind_of(a);
  if (kind_of(b) != k)
    throw Error(fmt::format("operands of a binary operator in {} have different kinds ({} and {})", t.what,
                            kind_name(k), kind_name(kind_of(b))));
  auto cmpi = [&](arith::CmpIPredicate p) { return wrap(bld.create<arith::CmpIOp>(t.loc, p, a, b)); };
  auto cmpf = [&](arith::CmpFPredicate p) { return wrap(bld.create<arith::CmpFOp>(t.loc, p, a, b)); };
  if (k == ValueKind::kInt) {
    switch (op) {
      case BinOp::kAdd: return wrap(bld.create<arith::AddIOp>(t.loc, a, b));
      case BinOp::kSub: return wrap(bld.create<arith::SubIOp>(t.loc, a, b));
      case BinOp::kMul: return wrap(bld.create<arith::MulIOp>(t.loc, a, b));
      case BinOp::kDiv: return wrap(bld.create<arith::DivSIOp>(t.loc, a, b));
      case BinOp::kRem: return wrap(bld.create<arith::RemSIOp>(t.loc, a, b));
      case BinOp::kMin: return wrap(bld.create<arith::MinSIOp>(t.loc, a, b));
      case BinOp::kMax: return wrap(bld.create<arith::MaxSIOp>(t.loc, a, b));
      case BinOp::kLt: return cmpi(arith::CmpIPredicate::slt);
      case BinOp::kLe: return cmpi(arith::CmpIPredicate::sle);
      case BinOp::kGt: return cmpi(arith::CmpIPredicate::sgt);
      case BinOp::kGe: return cmpi(arith::CmpIPredicate::sge);
      case BinOp::kEq: return cmpi(arith::CmpIPredicate::eq);
      case BinOp::kNe: return cmpi(arith::CmpIPredicate::ne);
      default: break;
    }
  } else if (k == ValueKind::kFloat) {
    switch (op) {
      case BinOp::kAdd: return wrap(bld.create<arith::AddFOp>(t.loc, a, b));
      case BinOp::kSub: return wrap(bld.create<arith::SubFOp>(t.loc, a, b));
      case BinOp::kMul: return wrap(bld.create<arith::MulFOp>(t.loc, a, b));
      case BinOp::kDiv: return wrap(bld.create<arith::DivFOp>(t.loc, a, b));
      case BinOp::kRem: return wrap(bld.create<arith::RemFOp>(t.loc, a, b));
      case BinOp::kMin: return wrap(bld.create<arith::MinimumFOp>(t.loc, a, b));
      case BinOp::kMax: return wrap(bld.create<arith::MaximumFOp>(t.loc, a, b));
      case BinOp::kPow: return wrap(bld.create<mlir::math::PowFOp>(t.loc, a, b));
      case BinOp::kLt: return cmpf(arith::CmpFPredicate::OLT);
      case BinOp::kLe: return cmpf(arith::CmpFPredicate::OLE);
      case BinOp::kGt: return cmpf(arith::CmpFPredicate::OGT);
      case BinOp::kGe: return cmpf(arith::CmpFPredicate::OGE);
      case BinOp::kEq: return cmpf(arith::CmpFPredicate::OEQ);
      case BinOp::kNe: return cmpf(arith::CmpFPredicate::UNE);
      default: break;
    }
  } else {
    switch (op) {
      case BinOp::kAnd: return wrap(bld.create<arith::AndIOp>(t.loc, a, b));
      case BinOp::kOr: return wrap(bld.create<arith::OrIOp>(t.loc, a, b));
      case BinOp::kEq: return cmpi(arith::CmpIPredicate::eq);
      case BinOp::kNe: return cmpi(arith::CmpIPredicate::ne);
      default: break;
    }
  }
  throw Error(fmt::format("operator not defined on {} in {}", kind_name(k), t.what));
}

Sym unary(UnOp op, Sym sa) {
  namespace arith = mlir::arith;
  namespace math = mlir::math;
  Value a = value_of(sa, "unary operator");
  TraceState& t = *t_trace;
  auto& bld = t.builder;
  ValueKind k = kind_of(a);
  if (k == ValueKind::kInt) {
    if (op == UnOp::kNeg) {
      Value zero = bld.create<arith::ConstantIntOp>(t.loc, 0, 32);
      return wrap(bld.create<arith::SubIOp>(t.loc, zero, a));
    }
    if (op == UnOp::kAbs) return wrap(bld.create<math::AbsIOp>(t.loc, a));
  } else if (k == ValueKind::kBool) {
    if (op == UnOp::kNot) {
      Value one = bld.create<arith::ConstantIntOp>(t.loc, 1, 1);
      return wrap(bld.create<arith::XOrIOp>(t.loc, a, one));
    }
  } else {
    switch (op) {
      case UnOp::kNeg: return wrap(bld.create<arith::NegFOp>(t.loc, a));
      case UnOp::kAbs: return wrap(bld.create<math::AbsFOp>(t.loc, a));
      case UnOp::kExp: return wrap(bld.create<math::ExpOp>(t.loc, a));
      case UnOp::kExp2: return wrap(bld.create<math::Exp2Op>(t.loc, a));
      case UnOp::kLog: return wrap(bld.create<math::LogOp>(t.loc, a));
      case UnOp::kLog2: return wrap(bld.create<math::Log2Op>(t.loc, a));
      case UnOp::kTanh: return wrap(bld.create<math::TanhOp>(t.loc, a));
      case UnOp::kSqrt: return wrap(bld.create<math::SqrtOp>(t.loc, a));
      case UnOp::kRsqrt: return wrap(bld.create<math::RsqrtOp>(t.loc, a));
      case UnOp::kSin: return wrap(bld.create<math::SinOp>(t.loc, a));
      case UnOp::kCos: return wrap(bld.create<math::CosOp>(t.loc, a));
      case UnOp::kFloor: return wrap(bld.create<math::FloorOp>(t.loc, a));
      case UnOp::kCeil: return wrap(bld.create<math::CeilOp>(t.loc, a));
      case UnOp::kErf: return wrap(bld.create<math::ErfOp>(t.loc, a));
      case UnOp::kSigmoid: {
        mlir::FloatType f32 = bld.getF32Type();
        Value one = bld.create<arith::ConstantFloatOp>(t.loc, llvm::APFloat(1.0f), f32);
        Value e = bld.create<math::ExpOp>(t.loc, bld.create<arith::NegFOp>(t.loc, a));
        return wrap(bld.create<arith::DivFOp>(t.loc, one, bld.create<arith::AddFOp>(t.loc, one, e)));
      }
      case UnOp::kNot: break;
    }
  }
  throw Error(fmt::format("function not defined on {} in {}", kind_name(k), t.what));
}

Sym select(Sym sc, Sym sa, Sym sb) {
  Value c = value_of(sc, "fa::where"), a = value_of(sa, "fa::where"), b = value_of(sb, "fa::where");
  TraceState& t = *t_trace;
  if (kind_of(a) != kind_of(b))
    throw Error(fmt::format("fa::where in {}: branches have different kinds ({} and {})", t.what,
                            kind_name(kind_of(a)), kind_name(kind_of(b))));
  return wrap(t.builder.create<mlir::arith::SelectOp>(t.loc, c, a, b));
}

Sym convert(Sym sa, ValueKind to) {
  namespace arith = mlir::arith;
  Value a = value_of(sa, "conversion");
  TraceState& t = *t_trace;
  auto& bld = t.builder;
  ValueKind from = kind_of(a);
  if (from == to) return sa;
  mlir::Type ty = type_of(bld, to);
  if (from == ValueKind::kInt && to == ValueKind::kFloat)
    return wrap(bld.create<arith::SIToFPOp>(t.loc, ty, a));
  if (from == ValueKind::kFloat && to == ValueKind::kInt)
    return wrap(bld.create<arith::FPToSIOp>(t.loc, ty, a));
  if (from == ValueKind::kBool && to == ValueKind::kInt)
    return wrap(bld.create<arith::ExtUIOp>(t.loc, ty, a));
  if (from == ValueKind::kBool && to == ValueKind::kFloat)
    return wrap(bld.create<arith::UIToFPOp>(t.loc, ty, a));
  throw Error(fmt::format("cannot convert {} to {} in {}; compare it instead", kind_name(from), kind_name(to),
                          t.what));
}

Sym load(const std::string& name, ValueKind dtype, int rank, const Sym* idx, int n) {
  TraceState& t = active("fa::buffer");
  if (!is_identifier(name)) throw Error(fmt::format("buffer name '{}' must be an identifier", name));
  for (const char* reserved : {"score", "b", "h", "q", "kv"})
    if (name == reserved)
      throw Error(
          fmt::format("buffer name '{}' is reserved (score, b, h, q and kv name the fixed arguments)", name));
  if (rank < 1 || rank > 4)
    throw Error(fmt::format("buffer '{}' has rank {}; ranks 1 to 4 are supported", name, rank));
  if (n != rank)
    throw Error(fmt::format("buffer '{}' has rank {} but is indexed with {} {} in {}", name, rank, n,
                            n == 1 ? "index" : "indices", t.what));
  auto it = t.captures.find(name);
  if (it == t.captures.end()) {
    mlir::Type elem = type_of(t.builder, dtype);
    auto type = mlir::fa::BufferType::get(t.builder.getContext(), elem, rank);
    t.block->addArgument(type, t.loc);
    it = t.captures.emplace(name, TraceState::CaptureInfo{t.block->getNumArguments() - 1, dtype, rank}).first;
    t.capture_order.push_back(name);
  } else if (it->second.kind != dtype || it->second.rank != rank) {
    throw Error(fmt::format("buffer '{}' is used as {} rank {} and as {} rank {} in {}", name,
                            dtype == ValueKind::kFloat ? "float" : "int32", rank,
                            it->second.kind == ValueKind::kFloat ? "float" : "int32", it->second.rank,
                            t.what));
  }
  llvm::SmallVector<Value, 4> indices;
  for (int i = 0; i < n; ++i) indices.push_back(value_of(idx[i], "buffer index"));
  Value buf = t.block->getArgument(it->second.arg);
  return wrap(t.builder.create<mlir::fa::LoadOp>(t.loc, type_of(t.builder, dtype), buf, indices));
}

Sym scalar(const std::string& name, ValueKind dtype) {
  TraceState& t = active("fa::scalar");
  if (!is_identifier(name)) throw Error(fmt::format("scalar name '{}' must be an identifier", name));
  return wrap(
      t.builder.create<mlir::fa::ScalarOp>(t.loc, type_of(t.builder, dtype), t.builder.getStringAttr(name)));
}

namespace {

// Sets up one mod op and runs `body` with this thread's trace pointing at it.
template <typename ModOp, typename Body>
void trace_mod(mlir::ModuleOp module, const std::string& kind, const std::string& name, mlir::Type result,
               llvm::ArrayRef<mlir::Type> fixed, Body&& body) {
  if (!is_identifier(name)) throw Error(fmt::format("{} name '{}' must be an identifier", kind, name));
  mlir::MLIRContext* ctx = module.getContext();
  TraceState state{mlir::OpBuilder(ctx), nullptr, mlir::NameLoc::get(mlir::StringAttr::get(ctx, name))};
  state.id = g_next_trace++;
  state.what = fmt::format("{} '{}'", kind, name);
  state.builder.setInsertionPointToEnd(module.getBody());
  auto op = state.builder.create<ModOp>(state.loc, state.builder.getStringAttr(name),
                                        mlir::TypeAttr::get(result), state.builder.getArrayAttr({}));
  state.block = new mlir::Block();
  op.getBody().push_back(state.block);
  for (mlir::Type t : fixed) state.block->addArgument(t, state.loc);
  state.builder.setInsertionPointToEnd(state.block);

  TraceState* saved = t_trace;
  t_trace = &state;
  struct Restore {
    TraceState* saved;
    ~Restore() { t_trace = saved; }
  } restore{saved};
  Sym result_sym = body(state);
  Value v = value_of(result_sym, "result");
  state.builder.create<mlir::fa::YieldOp>(state.loc, v);
  llvm::SmallVector<mlir::Attribute> names;
  for (auto& n : state.capture_order) names.push_back(state.builder.getStringAttr(n));
  op.setCaptureNamesAttr(state.builder.getArrayAttr(names));
}

}  // namespace
}  // namespace detail

Program trace(const ScoreMod& score, const MaskMod& mask) {
  using namespace detail;
  if (!score.fn) throw Error(fmt::format("score_mod '{}' has no function", score.name));
  if (!mask.fn) throw Error(fmt::format("mask_mod '{}' has no function", mask.name));
  auto ctx = make_context();
  mlir::OpBuilder b(ctx.get());
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::ModuleOp::create(b.getUnknownLoc());
  mlir::Type f32 = b.getF32Type(), i32 = b.getI32Type();
  if (score.name == mask.name)
    throw Error(
        fmt::format("score_mod and mask_mod are both named '{}'; give them different names", score.name));
  trace_mod<mlir::fa::ScoreModOp>(
      *module, "score_mod", score.name, f32, {f32, i32, i32, i32, i32}, [&](TraceState& t) {
        mlir::Block* blk = t.block;
        auto arg = [&](unsigned i) { return wrap(blk->getArgument(i)); };
        Score r = score.fn(Score(arg(0)), Index(arg(1)), Index(arg(2)), Index(arg(3)), Index(arg(4)));
        return r.sym();
      });
  trace_mod<mlir::fa::MaskModOp>(
      *module, "mask_mod", mask.name, b.getI1Type(), {i32, i32, i32, i32}, [&](TraceState& t) {
        mlir::Block* blk = t.block;
        auto arg = [&](unsigned i) { return wrap(blk->getArgument(i)); };
        Bool r = mask.fn(Index(arg(0)), Index(arg(1)), Index(arg(2)), Index(arg(3)));
        return r.sym();
      });
  return finish_program(std::move(ctx), std::move(module),
                        fmt::format("score_mod '{}' / mask_mod '{}'", score.name, mask.name));
}

// ---- combinators -----------------------------------------------------------------------

ScoreMod identity_score() {
  return {"identity", [](Score s, Index, Index, Index, Index) { return s; }};
}

MaskMod noop_mask() {
  return {"noop", [](Index, Index, Index, Index) { return Bool(true); }};
}

namespace {
MaskMod combine(std::vector<MaskMod> masks, bool is_and) {
  if (masks.empty()) {
    if (is_and) return noop_mask();
    return {"none", [](Index, Index, Index, Index) { return Bool(false); }};
  }
  if (masks.size() == 1) return masks.front();
  std::string name = is_and ? "and" : "or";
  for (auto& m : masks) {
    if (!m.fn) throw Error(fmt::format("mask_mod '{}' has no function", m.name));
    name += "_" + m.name;
  }
  return {name, [masks = std::move(masks), is_and](Index b, Index h, Index q, Index kv) {
            Bool acc = masks.front().fn(b, h, q, kv);
            for (size_t i = 1; i < masks.size(); ++i) {
              Bool next = masks[i].fn(b, h, q, kv);
              acc = is_and ? (acc && next) : (acc || next);
            }
            return acc;
          }};
}
}  // namespace

MaskMod and_masks(std::vector<MaskMod> masks) { return combine(std::move(masks), true); }
MaskMod or_masks(std::vector<MaskMod> masks) { return combine(std::move(masks), false); }

}  // namespace fa
