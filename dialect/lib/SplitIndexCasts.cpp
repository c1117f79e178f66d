// fa-split-index-casts: sitofp(a ± b) of two indices becomes sitofp(a) ± sitofp(b), so a kernel
// converts q once per row and kv once per column instead of kv - q once per element.
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/Passes.h"

namespace mlir::fa {
#define GEN_PASS_DEF_FASPLITINDEXCASTS
#include "fajit/Dialect/FA/Passes.h.inc"
}  // namespace mlir::fa

using namespace mlir;
using namespace mlir::fa;

namespace {

constexpr int64_t kExactBelow = int64_t{1} << 24;  // every integer of smaller magnitude is exact in f32

/// An index argument (b, h, q, kv) of the mod that owns `v`'s block: what a kernel passes
/// per element, non-negative and, for any real tensor, below 2^24.
bool isIndexArgument(Value v) {
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg || !arg.getType().isInteger(32)) return false;
  auto mod = dyn_cast<ModBody>(arg.getOwner()->getParentOp());
  return mod && arg.getArgNumber() < mod.getNumFixedArgs();
}

bool isSmallConstant(Value v) {
  llvm::APInt c;
  if (!matchPattern(v, m_ConstantInt(&c))) return false;
  int64_t x = c.getSExtValue();
  return x > -kExactBelow && x < kExactBelow;
}

bool isExactOperand(Value v) { return isIndexArgument(v) || isSmallConstant(v); }

struct SplitIndexCast : public OpRewritePattern<arith::SIToFPOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(arith::SIToFPOp cast, PatternRewriter &rewriter) const override {
    Operation *def = cast.getIn().getDefiningOp();
    if (!def || !isa<arith::AddIOp, arith::SubIOp>(def) || !cast.getIn().getType().isInteger(32))
      return failure();
    Value a = def->getOperand(0), b = def->getOperand(1);
    if (!isExactOperand(a) || !isExactOperand(b)) return failure();
    Type f = cast.getType();
    Location loc = cast.getLoc();
    Value fa = rewriter.create<arith::SIToFPOp>(loc, f, a);
    Value fb = rewriter.create<arith::SIToFPOp>(loc, f, b);
    if (isa<arith::AddIOp>(def))
      rewriter.replaceOpWithNewOp<arith::AddFOp>(cast, fa, fb);
    else
      rewriter.replaceOpWithNewOp<arith::SubFOp>(cast, fa, fb);
    return success();
  }
};

struct FASplitIndexCastsPass : public mlir::fa::impl::FASplitIndexCastsBase<FASplitIndexCastsPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<SplitIndexCast>(&getContext());
    if (failed(applyPatternsAndFoldGreedily(getOperation(), std::move(patterns)))) signalPassFailure();
  }
};

}  // namespace
