// fa-differentiate: reverse-mode derivative of each fa.score_mod as an fa.score_grad.
//
// A score_mod body is straight-line SSA. The derivative recomputes the forward values (a clone
// of the body), then walks the ops backwards from the yielded value with its adjoint seeded by
// `dt`, accumulating one adjoint per f32 value that depends on the score or on a float buffer
// ("active" values). The adjoint of `score` is dS; the adjoint of each f32 fa.load is added to
// its buffer's gradient by fa.grad_add. Canonicalize + CSE then drop what the derivative does
// not read (ALiBi's derivative is `yield %dt`).
#include <cmath>

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

#include "fajit/Dialect/FA/BodyOps.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"

namespace mlir::fa {
#define GEN_PASS_DEF_FADIFFERENTIATE
#include "fajit/Dialect/FA/Passes.h.inc"
}  // namespace mlir::fa

using namespace mlir;
using namespace mlir::fa;

namespace {

constexpr double kLn2 = 0.693147180559945309417;
constexpr double kTwoOverSqrtPi = 1.12837916709551257390;

/// Builds the adjoint ops of one score_grad body. Every helper creates f32 arith/math ops at
/// the end of the body with the location of the op being differentiated.
class Adjoints {
 public:
  Adjoints(OpBuilder &b, const DenseSet<Value> &active) : b_(b), active_(active) {}

  /// The adjoint of `v`, or a null Value when nothing flows into it.
  Value of(Value v) const { return adj_.lookup(v); }

  /// ā += g, for active f32 values only (constants, scalars and integers carry none).
  void add(Value a, Value g) {
    if (!a.getType().isF32() || !active_.contains(a)) return;
    Value &slot = adj_[a];
    const bool gated = gated_.contains(g) || (slot && gated_.contains(slot));
    slot = slot ? b_.create<arith::AddFOp>(loc_, slot, g).getResult() : g;
    if (gated) gated_.insert(slot);
  }

  // ---- gated adjoints ----
  // A select (where, min, max, abs) passes its adjoint to the branch it took and 0 to the other
  // (`gate`): an adjoint that is exactly 0 where its value does not matter. The untaken branch's
  // own derivative may be inf or NaN there (pow(q, s) at q = 0, 1 / s at s = 0), and 0 · inf
  // is NaN, so a gated adjoint scales by a local derivative as `g == 0 ? 0 : g · x`: what does
  // not flow contributes nothing. Adjoints from dt alone are never 0 by selection: plain
  // products, so mods without a select (softcap, ALiBi) are unchanged.
  Value gate(Value g) {
    gated_.insert(g);
    return g;
  }
  /// g · x, 0 where a gated g is 0.
  Value scale(Value g, Value x) { return guarded(g, mul(g, x)); }
  /// g / x, 0 where a gated g is 0.
  Value scaleDiv(Value g, Value x) { return guarded(g, div(g, x)); }
  /// g · c for a finite constant c: 0 where g is, no guard needed.
  Value scaleBy(Value g, double c) { return keepGate(g, mul(g, cst(c))); }
  /// -g.
  Value negate(Value g) { return keepGate(g, neg(g)); }

  void setLoc(Location loc) { loc_ = loc; }
  bool isActive(Value v) const { return active_.contains(v); }

  // ---- builders ----
  Value cst(double c) {
    return b_.create<arith::ConstantOp>(loc_, b_.getF32FloatAttr(static_cast<float>(c)));
  }
  Value mul(Value x, Value y) { return b_.create<arith::MulFOp>(loc_, x, y); }
  Value div(Value x, Value y) { return b_.create<arith::DivFOp>(loc_, x, y); }
  Value sub(Value x, Value y) { return b_.create<arith::SubFOp>(loc_, x, y); }
  Value neg(Value x) { return b_.create<arith::NegFOp>(loc_, x); }
  Value cmp(arith::CmpFPredicate p, Value x, Value y) { return b_.create<arith::CmpFOp>(loc_, p, x, y); }
  Value sel(Value c, Value x, Value y) { return b_.create<arith::SelectOp>(loc_, c, x, y); }
  template <typename Op>
  Value un(Value x) {
    return b_.create<Op>(loc_, x);
  }
  Value pow(Value x, Value y) { return b_.create<math::PowFOp>(loc_, x, y); }

 private:
  Value keepGate(Value g, Value r) {
    if (gated_.contains(g)) gated_.insert(r);
    return r;
  }
  Value guarded(Value g, Value product) {
    if (!gated_.contains(g)) return product;
    Value zero = cst(0.0);
    return gate(sel(cmp(arith::CmpFPredicate::OEQ, g, zero), zero, product));
  }

  OpBuilder &b_;
  const DenseSet<Value> &active_;
  DenseSet<Value> gated_;
  DenseMap<Value, Value> adj_;
  Location loc_ = b_.getUnknownLoc();
};

/// The diagnostic for an op without a derivative on the adjoint's way.
LogicalResult noDerivative(Operation *op, ScoreModOp mod, StringRef why) {
  return op->emitOpError() << "has no derivative (" << why << "); the gradient of score_mod @"
                           << mod.getSymName() << " would flow through it";
}

/// Pushes the adjoint `g` of `op`'s result to its operands: the chain rule of each body op.
LogicalResult backprop(Operation *op, BodyOp code, Value g, Adjoints &adj, ScoreModOp mod) {
  using B = BodyOp;
  using P = arith::CmpFPredicate;
  auto a = [&]() { return op->getOperand(0); };
  auto b = [&]() { return op->getOperand(1); };
  Value y = op->getNumResults() ? op->getResult(0) : Value();
  switch (code) {
    // Integer ops, compares and int -> float conversions: no adjoint flows to an integer.
    case B::AddI:
    case B::SubI:
    case B::MulI:
    case B::DivSI:
    case B::DivUI:
    case B::CeilDivSI:
    case B::FloorDivSI:
    case B::RemSI:
    case B::RemUI:
    case B::MaxSI:
    case B::MinSI:
    case B::MaxUI:
    case B::MinUI:
    case B::AndI:
    case B::OrI:
    case B::XOrI:
    case B::ShLI:
    case B::ShRSI:
    case B::ShRUI:
    case B::CmpI:
    case B::AbsI:
    case B::CmpF:
    case B::SIToFP:
    case B::UIToFP:
    case B::ExtUI:
    case B::ExtSI:
    case B::TruncI:
    case B::Load:  // the grad_add of a load is emitted by the caller
      return success();
    // Integer results: the caller refuses an active operand whose result matters.
    case B::FPToSI:
    case B::FPToUI: return success();
    case B::Floor:
    case B::Ceil:
      if (adj.isActive(a())) return noDerivative(op, mod, "a step function");
      return success();
    case B::RemF:
      if (adj.isActive(a()) || adj.isActive(b())) return noDerivative(op, mod, "a sawtooth in both operands");
      return success();
    case B::AddF:
      adj.add(a(), g);
      adj.add(b(), g);
      return success();
    case B::SubF:
      adj.add(a(), g);
      if (adj.isActive(b())) adj.add(b(), adj.negate(g));
      return success();
    case B::MulF:
      if (adj.isActive(a())) adj.add(a(), adj.scale(g, b()));
      if (adj.isActive(b())) adj.add(b(), adj.scale(g, a()));
      return success();
    case B::DivF:
      // y = a / b: ā += ȳ / b, b̄ -= ȳ y / b
      if (adj.isActive(a())) adj.add(a(), adj.scaleDiv(g, b()));
      if (adj.isActive(b())) adj.add(b(), adj.negate(adj.scaleDiv(adj.scale(g, y), b())));
      return success();
    case B::NegF: adj.add(a(), adj.negate(g)); return success();
    case B::MaximumF:
    case B::MinimumF: {
      // The chosen operand gets ȳ; a tie splits it (torch's convention).
      P win = code == B::MaximumF ? P::OGT : P::OLT;
      Value zero = adj.cst(0.0), half = adj.mul(g, adj.cst(0.5));
      Value tie = adj.cmp(P::OEQ, a(), b());
      if (adj.isActive(a()))
        adj.add(a(), adj.gate(adj.sel(adj.cmp(win, a(), b()), g, adj.sel(tie, half, zero))));
      if (adj.isActive(b()))
        adj.add(b(), adj.gate(adj.sel(adj.cmp(win, b(), a()), g, adj.sel(tie, half, zero))));
      return success();
    }
    case B::MaxNumF:
    case B::MinNumF: {
      // A tie goes to the first operand; a NaN operand is not chosen (maxnumf(a, NaN) = a), so
      // when b is NaN the adjoint goes to a (found by fajit fuzz: it went to b).
      Value zero = adj.cst(0.0);
      Value first = adj.cmp(code == B::MaxNumF ? P::OGE : P::OLE, a(), b());
      Value bIsNaN = adj.cmp(P::UNO, b(), b());
      if (adj.isActive(a())) adj.add(a(), adj.gate(adj.sel(bIsNaN, g, adj.sel(first, g, zero))));
      if (adj.isActive(b())) adj.add(b(), adj.gate(adj.sel(bIsNaN, zero, adj.sel(first, zero, g))));
      return success();
    }
    case B::Exp: adj.add(a(), adj.scale(g, y)); return success();
    case B::Exp2: adj.add(a(), adj.scaleBy(adj.scale(g, y), kLn2)); return success();
    case B::Log: adj.add(a(), adj.scaleDiv(g, a())); return success();
    case B::Log2: adj.add(a(), adj.scaleDiv(g, adj.mul(a(), adj.cst(kLn2)))); return success();
    case B::Tanh: adj.add(a(), adj.scale(g, adj.sub(adj.cst(1.0), adj.mul(y, y)))); return success();
    case B::Sqrt: adj.add(a(), adj.scaleDiv(adj.scaleBy(g, 0.5), y)); return success();
    case B::Rsqrt:
      // y = a^(-1/2): ā += -ȳ y³ / 2
      adj.add(a(), adj.scale(adj.scaleBy(g, -0.5), adj.mul(adj.mul(y, y), y)));
      return success();
    case B::AbsF: {
      // ȳ sgn(a), 0 at 0.
      Value zero = adj.cst(0.0);
      Value pos = adj.cmp(P::OGT, a(), zero), negative = adj.cmp(P::OLT, a(), zero);
      adj.add(a(), adj.gate(adj.sel(pos, g, adj.sel(negative, adj.neg(g), zero))));
      return success();
    }
    case B::Sin: adj.add(a(), adj.scale(g, adj.un<math::CosOp>(a()))); return success();
    case B::Cos: adj.add(a(), adj.negate(adj.scale(g, adj.un<math::SinOp>(a())))); return success();
    case B::Erf: {
      // ȳ (2/√π) exp(-a²)
      Value e = adj.un<math::ExpOp>(adj.neg(adj.mul(a(), a())));
      adj.add(a(), adj.scale(g, adj.mul(adj.cst(kTwoOverSqrtPi), e)));
      return success();
    }
    case B::PowF:
      // y = a^b: ā += ȳ b a^(b-1) (finite at a = 0), b̄ += ȳ y ln a
      if (adj.isActive(a()))
        adj.add(a(), adj.scale(g, adj.mul(b(), adj.pow(a(), adj.sub(b(), adj.cst(1.0))))));
      if (adj.isActive(b())) adj.add(b(), adj.scale(adj.scale(g, y), adj.un<math::LogOp>(a())));
      return success();
    case B::Select: {
      auto s = cast<arith::SelectOp>(op);
      Value zero = adj.cst(0.0);
      if (adj.isActive(s.getTrueValue()))
        adj.add(s.getTrueValue(), adj.gate(adj.sel(s.getCondition(), g, zero)));
      if (adj.isActive(s.getFalseValue()))
        adj.add(s.getFalseValue(), adj.gate(adj.sel(s.getCondition(), zero, g)));
      return success();
    }
  }
  llvm_unreachable("unknown BodyOp");
}

}  // namespace

SmallVector<std::string> mlir::fa::differentiableBuffers(ScoreModOp mod) {
  SmallVector<std::string> names;
  for (auto [i, c] : llvm::enumerate(mod.getCaptures())) {
    auto type = cast<BufferType>(c.getType());
    bool read = llvm::any_of(c.getUsers(), [](Operation *u) { return isa<LoadOp>(u); });
    if (type.getElementType().isF32() && read) names.push_back(mod.getCaptureName(i).str());
  }
  return names;
}

FailureOr<ScoreGradOp> mlir::fa::differentiateScoreMod(ScoreModOp mod) {
  Block &src = mod.getEntryBlock();
  OpBuilder b(mod);
  b.setInsertionPointAfter(mod);
  Location loc = mod.getLoc();
  Type f32 = b.getF32Type();
  auto grad = b.create<ScoreGradOp>(loc, FlatSymbolRefAttr::get(mod.getSymNameAttr()), TypeAttr::get(f32),
                                    mod.getCaptureNames());
  auto *body = new Block();
  grad.getBody().push_back(body);
  IRMapping map;
  unsigned fixed = ScoreModOp::getNumFixedArgs();
  for (unsigned i = 0; i < fixed; ++i)
    map.map(src.getArgument(i), body->addArgument(src.getArgument(i).getType(), loc));
  Value dt = body->addArgument(f32, loc);
  for (BlockArgument c : mod.getCaptures()) map.map(c, body->addArgument(c.getType(), loc));

  // The forward values, recomputed.
  b.setInsertionPointToEnd(body);
  SmallVector<Operation *> forward;
  Value result;
  for (Operation &op : src) {
    if (auto y = dyn_cast<YieldOp>(op)) {
      result = map.lookup(y.getValue());
      break;
    }
    forward.push_back(b.clone(op, map));
  }
  auto fail = [&]() -> FailureOr<ScoreGradOp> {
    grad.erase();
    return failure();
  };
  if (!result) {
    mod.emitOpError() << "has no fa.yield";
    return fail();
  }

  // Active: depends on the score or on an f32 buffer read. Live: the result depends on it.
  DenseSet<Value> active{body->getArgument(0)};
  for (Operation *op : forward) {
    bool isActive = llvm::any_of(op->getOperands(), [&](Value v) { return active.contains(v); });
    if (auto l = dyn_cast<LoadOp>(op)) isActive = isActive || l.getType().isF32();
    if (isActive) active.insert(op->result_begin(), op->result_end());
  }
  DenseSet<Value> live{result};
  for (Operation *op : llvm::reverse(forward))
    if (llvm::any_of(op->getResults(), [&](Value v) { return live.contains(v); }))
      live.insert(op->operand_begin(), op->operand_end());
  for (Operation *op : forward)
    if (isa<arith::FPToSIOp, arith::FPToUIOp>(op) && active.contains(op->getOperand(0)) &&
        live.contains(op->getResult(0))) {
      (void)noDerivative(op, mod,
                         "it rounds a value that depends on the score or a float buffer to an integer");
      return fail();
    }

  // The reverse sweep.
  Adjoints adj(b, active);
  adj.setLoc(loc);
  if (result.getType().isF32() && active.contains(result)) adj.add(result, dt);
  for (Operation *op : llvm::reverse(forward)) {
    std::optional<BodyOp> code = getBodyOp(op);
    if (!code || op->getNumResults() != 1) continue;  // constants and runtime scalars
    Value g = adj.of(op->getResult(0));
    if (!g) continue;
    adj.setLoc(op->getLoc());
    if (failed(backprop(op, *code, g, adj, mod))) return fail();
    if (auto l = dyn_cast<LoadOp>(op)) b.create<GradAddOp>(op->getLoc(), l.getBuffer(), l.getIndices(), g);
  }
  adj.setLoc(loc);
  Value dscore = adj.of(body->getArgument(0));
  if (!dscore) dscore = adj.cst(0.0);
  b.create<YieldOp>(loc, dscore);
  return grad;
}

namespace {
struct FADifferentiatePass : public mlir::fa::impl::FADifferentiateBase<FADifferentiatePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::DenseSet<StringRef> done;
    for (ScoreGradOp g : module.getOps<ScoreGradOp>()) done.insert(g.getMod());
    SmallVector<ScoreModOp> mods(module.getOps<ScoreModOp>());
    bool ok = true;
    for (ScoreModOp mod : mods)
      if (!done.contains(mod.getSymName())) ok &= succeeded(differentiateScoreMod(mod));
    if (!ok) return signalPassFailure();
    OpPassManager pm(ModuleOp::getOperationName());
    OpPassManager &nested = pm.nest<ScoreGradOp>();
    nested.addPass(createCanonicalizerPass());
    nested.addPass(createCSEPass());
    if (failed(runPipeline(pm, module))) signalPassFailure();
  }
};
}  // namespace
