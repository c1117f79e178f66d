#ifndef FAJIT_DIALECT_FA_PASSES_TD
#define FAJIT_DIALECT_FA_PASSES_TD

include "mlir/Pass/PassBase.td"

def FAAnnotateDeps : Pass<"fa-annotate-deps", "::mlir::ModuleOp"> {
  let summary = "record what each score_mod / mask_mod depends on";
  let description = [{
    Attaches `fa.uses = [...]` to every fa.score_mod / fa.mask_mod: the fixed arguments the
    (simplified) body really reads (`score`, `b`, `h`, `q`, `kv`), then `@name` for each
    captured buffer read and `$name` for each runtime scalar. Block masks are built with
    B or H of 1 when the mask does not read b or h; a score_mod that returns its score
    unchanged is recognised as the identity.
  }];
}

def FAMaskBlockRange : Pass<"fa-mask-block-range", "::mlir::ModuleOp"> {
  let summary = "classify one block of every mask_mod with integer range analysis";
  let description = [{
    For the block b in [b0, b1], h in [h0, h1], q in [q0, q1], kv in [k0, k1], runs MLIR's
    dataflow IntegerRangeAnalysis over each fa.mask_mod (the arguments clamped to their
    ranges, bound runtime scalars as constants, fa.load and unbound scalars as any value)
    and attaches `fa.block = "full"` when the result is true for every element, `"empty"`
    when it is false for every element, `"partial?"` when the analysis cannot tell (the
    block may still be all one kind: only full and empty are claims).

    ```
    fajit-opt --fa-mask-block-range="q0=0 q1=127 k0=128 k1=255 scalars=window=64" in.mlir
    ```
    fa::analyze_block_mask decides the same blocks with an MLIR-free interval program at
    block-mask build time (and then settles the "partial?" ones with a witness search).
  }];
  let options = [
    Option<"q0", "q0", "int64_t", "0", "first query index of the block">,
    Option<"q1", "q1", "int64_t", "0", "last query index of the block (inclusive)">,
    Option<"k0", "k0", "int64_t", "0", "first key index of the block">,
    Option<"k1", "k1", "int64_t", "0", "last key index of the block (inclusive)">,
    Option<"b0", "b0", "int64_t", "0", "first batch index">,
    Option<"b1", "b1", "int64_t", "2147483647", "last batch index (default: any)">,
    Option<"h0", "h0", "int64_t", "0", "first head index">,
    Option<"h1", "h1", "int64_t", "2147483647", "last head index (default: any)">,
    ListOption<"scalars", "scalars", "std::string",
               "runtime scalar values, NAME=VALUE (unbound scalars take any value)">
  ];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def FADifferentiate : Pass<"fa-differentiate", "::mlir::ModuleOp"> {
  let summary = "derive an fa.score_grad from every fa.score_mod";
  let description = [{
    Reverse-mode differentiation of each fa.score_mod's straight-line body: after the
    score_mod, inserts `fa.score_grad @name(score, b, h, q, kv, dt) captures(...)` that
    recomputes the forward values, sweeps the ops backwards from the yielded value (seeded
    with `dt`), yields the adjoint of `score` and adds each f32 fa.load's adjoint to its
    buffer's gradient with `fa.grad_add`. Integer values carry no adjoint. An op with no
    derivative (math.floor, math.ceil, arith.remf, arith.fptosi/fptoui) through which the
    adjoint of the score or of a buffer would have to flow is an error naming the op.
    Then canonicalize + CSE: `score + bias[q, kv]` becomes `grad_add %bias[%q, %kv], %dt`
    and `yield %dt`. A score_mod that already has its fa.score_grad is left alone.

    ```
    fajit-opt --fa-differentiate in.mlir
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def FASplitIndexCasts : Pass<"fa-split-index-casts", "::mlir::ModuleOp"> {
  let summary = "convert each index of a difference or sum to float on its own";
  let description = [{
    Rewrites `arith.sitofp (a - b)` and `arith.sitofp (a + b)`, where each of a and b is
    one of a mod's index arguments (b, h, q, kv) or an integer constant of magnitude below
    2^24, into `arith.subf` / `arith.addf` of the two converted operands. A kernel applies
    the mods to every element of a tile, and `kv - q` differs from element to element, so
    each element paid an integer subtraction and a conversion. Split, `sitofp %q` is the
    same value along a row and `sitofp %kv` along a column, and CSE in the kernel compiler
    keeps one conversion per row and one per column: an element pays one float subtraction
    (ALiBi, `score + slope * (kv - q)`: the Hopper forward's I2F count 137 -> 76).

    The result is the same float: both operands are integers below 2^24, exact in f32, so
    their f32 sum or difference is the exact integer result rounded once, as the
    conversion of the integer result is, and the i32 sum cannot wrap. Every attention
    length up to 16 Mi tokens keeps its indices there. Past it the operands are rounded
    when converted, so the two forms can differ by the roundings of both (kv = 2^25 + 3,
    q = 2^25 + 1: 4 instead of 2), and a sum of two indices past 2^30, which wraps in
    i32, does not wrap in f32.

    ```
    fajit-opt --fa-split-index-casts in.mlir
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

#endif // FAJIT_DIALECT_FA_PASSES_TD
