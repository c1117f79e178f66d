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

#endif // FAJIT_DIALECT_FA_PASSES_TD
