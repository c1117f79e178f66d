#ifndef FAJIT_DIALECT_FA_INTERFACES_TD
#define FAJIT_DIALECT_FA_INTERFACES_TD

include "mlir/IR/OpBase.td"

// What every mods body (fa.score_mod, fa.mask_mod, fa.score_grad) has: fixed leading block
// arguments ([score,] b, h, q, kv[, dt]), then the captured buffers. Passes, the interpreter and
// codegen read a body through this instead of switching over the three ops.
def FA_ModBodyInterface : OpInterface<"ModBody"> {
  let cppNamespace = "::mlir::fa";
  let description = [{
    A mods body: its entry block's arguments are the fixed ones (getNumFixedArgs, named by
    getFixedArgName), then one !fa.buffer per capture (named by getCaptureName).
  }];
  let methods = [
    InterfaceMethod<"The number of fixed leading block arguments.", "unsigned", "getNumFixedArgs",
                    (ins), [{ return $_op.getNumFixedArgs(); }]>,
    InterfaceMethod<"The name of fixed argument `i` (score, b, h, q, kv, dt).", "::llvm::StringRef",
                    "getFixedArgName", (ins "unsigned":$i), [{ return $_op.getFixedArgName(i); }]>,
    InterfaceMethod<"The body's one block.", "::mlir::Block &", "getEntryBlock", (ins),
                    [{ return $_op.getEntryBlock(); }]>,
    InterfaceMethod<"The name users bind capture `i` by.", "::llvm::StringRef", "getCaptureName",
                    (ins "unsigned":$i), [{ return $_op.getCaptureName(i); }]>,
    InterfaceMethod<"The mod's name (a score_grad's: the score_mod it differentiates).",
                    "::llvm::StringRef", "getModName", (ins), [{ return $_op.getSymName(); }]>,
    InterfaceMethod<"The op's name for messages (fa.score_mod, ...).", "::llvm::StringRef",
                    "getKindName", (ins), [{ return $_op->getName().getStringRef(); }]>,
  ];
}

#endif  // FAJIT_DIALECT_FA_INTERFACES_TD
