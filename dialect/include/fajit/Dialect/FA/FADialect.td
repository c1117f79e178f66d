//===- FADialect.td - the fa dialect -----------------------------------------===//
//
// fa describes the user code of FlexAttention-style attention: a score_mod that rewrites
// one attention score and a mask_mod that decides whether a (q, kv) pair takes part.
// Arithmetic is upstream arith/math; fa adds only function-like containers, reads of
// captured buffers and named runtime scalars.
//
//===----------------------------------------------------------------------------===//
#ifndef FAJIT_DIALECT_FA_TD
#define FAJIT_DIALECT_FA_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def FA_Dialect : Dialect {
  let name = "fa";
  let cppNamespace = "::mlir::fa";
  let summary = "FlexAttention score_mod / mask_mod programs";
  let description = [{
    Function-like `fa.score_mod` / `fa.mask_mod` ops with fixed signatures, whose pure bodies
    use `arith` and `math` ops, `fa.load` (read a captured buffer), `fa.scalar` (a named
    runtime scalar) and end in `fa.yield`.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
  let useDefaultTypePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerTypes();
  }];
}

class FA_Op<string mnemonic, list<Trait> traits = []> : Op<FA_Dialect, mnemonic, traits>;

#endif // FAJIT_DIALECT_FA_TD
