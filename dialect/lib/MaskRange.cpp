// fa-mask-block-range: the value of each mask_mod over one block, from MLIR's integer range
// analysis (arith ops implement InferIntRangeInterface).
#include "fajit/Dialect/FA/Passes.h"

#include "llvm/ADT/StringMap.h"
#include "mlir/Analysis/DataFlow/ConstantPropagationAnalysis.h"
#include "mlir/Analysis/DataFlow/DeadCodeAnalysis.h"
#include "mlir/Analysis/DataFlow/IntegerRangeAnalysis.h"
#include "mlir/Analysis/DataFlowFramework.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"

#include "fajit/Dialect/FA/FAOps.h"

namespace mlir::fa {
#define GEN_PASS_DEF_FAMASKBLOCKRANGE
#include "fajit/Dialect/FA/Passes.h.inc"
}  // namespace mlir::fa

using namespace mlir;
using namespace mlir::fa;

namespace {

struct FAMaskBlockRangePass : public mlir::fa::impl::FAMaskBlockRangeBase<FAMaskBlockRangePass> {
  using Base::Base;

  void runOnOperation() override {
    llvm::StringMap<double> values;
    for (const std::string &kv : scalars) {
      StringRef s(kv);
      auto [name, text] = s.split('=');
      double v = 0;
      if (name.empty() || text.empty() || text.getAsDouble(v)) {
        getOperation().emitError() << "fa-mask-block-range: scalars: expected NAME=VALUE, got '" << kv << "'";
        return signalPassFailure();
      }
      values[name] = v;
    }
    if (q0 > q1 || k0 > k1 || b0 > b1 || h0 > h1) {
      getOperation().emitError() << "fa-mask-block-range: empty block (q " << q0 << ".." << q1 << ", kv "
                                 << k0 << ".." << k1 << ")";
      return signalPassFailure();
    }
    SmallVector<MaskModOp> masks(getOperation().getOps<MaskModOp>());
    for (MaskModOp m : masks) {
      FailureOr<StringRef> verdict = classify(m, values);
      if (failed(verdict)) return signalPassFailure();
      m->setAttr("fa.block", StringAttr::get(&getContext(), *verdict));
    }
  }

  // Analyses a clone in which each fixed argument is clamped to its range (maxsi(minsi(x,
  // hi), lo) is x for every element of the block, and its inferred range is [lo, hi]) and
  // each bound scalar is a constant.
  FailureOr<StringRef> classify(MaskModOp original, const llvm::StringMap<double> &values) {
    OpBuilder b(&getContext());
    OwningOpRef<ModuleOp> scratch = ModuleOp::create(original.getLoc());
    b.setInsertionPointToEnd(scratch->getBody());
    auto m = cast<MaskModOp>(b.clone(*original.getOperation()));
    Block &entry = m.getEntryBlock();
    b.setInsertionPointToStart(&entry);
    Location loc = m.getLoc();
    const int64_t ranges[4][2] = {{b0, b1}, {h0, h1}, {q0, q1}, {k0, k1}};
    for (unsigned i = 0; i < 4; ++i) {
      BlockArgument arg = entry.getArgument(i);
      if (arg.use_empty()) continue;
      Value lo = b.create<arith::ConstantIntOp>(loc, ranges[i][0], 32);
      Value hi = b.create<arith::ConstantIntOp>(loc, ranges[i][1], 32);
      auto upper = b.create<arith::MinSIOp>(loc, arg, hi);
      auto clamped = b.create<arith::MaxSIOp>(loc, upper, lo);
      arg.replaceAllUsesExcept(clamped, upper);
    }
    for (ScalarOp s : llvm::make_early_inc_range(entry.getOps<ScalarOp>())) {
      auto it = values.find(s.getName());
      if (it == values.end()) continue;
      b.setInsertionPoint(s);
      Value c;
      if (s.getType().isF32())
        c = b.create<arith::ConstantFloatOp>(loc, APFloat(static_cast<float>(it->second)), b.getF32Type());
      else
        c = b.create<arith::ConstantIntOp>(loc, static_cast<int64_t>(it->second), 32);
      s.replaceAllUsesWith(c);
      s.erase();
    }

    DataFlowSolver solver;
    solver.load<dataflow::DeadCodeAnalysis>();
    solver.load<dataflow::SparseConstantPropagation>();
    solver.load<dataflow::IntegerRangeAnalysis>();
    if (failed(solver.initializeAndRun(*scratch))) return failure();
    auto yield = cast<YieldOp>(entry.getTerminator());
    const auto *lattice = solver.lookupState<dataflow::IntegerValueRangeLattice>(yield.getValue());
    if (!lattice || lattice->getValue().isUninitialized()) return StringRef("partial?");
    const ConstantIntRanges &r = lattice->getValue().getValue();
    if (r.umin() == r.umax()) return StringRef(r.umin().isZero() ? "empty" : "full");
    return StringRef("partial?");
  }
};

}  // namespace
