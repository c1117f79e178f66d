#ifndef FAJIT_DIALECT_FA_OPS_TD
#define FAJIT_DIALECT_FA_OPS_TD

include "fajit/Dialect/FA/FADialect.td"
include "fajit/Dialect/FA/FATypes.td"
include "fajit/Dialect/FA/FAInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"

class FA_ModOp<string mnemonic, string signature> : FA_Op<mnemonic,
    [Symbol, IsolatedFromAbove, FA_ModBodyInterface,
     DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  // capture_names: the names users bind buffers by, one per capture argument; the printer
  // uses them as the SSA names of the capture arguments and the parser takes them from there.
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$result_type,
                       StrArrayAttr:$capture_names);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of fixed leading block arguments (}] # signature # [{).
    static unsigned getNumFixedArgs();
    /// The name of fixed argument `i`.
    static ::llvm::StringRef getFixedArgName(unsigned i);
    /// The captured buffers, after the fixed arguments.
    ::mlir::Block::BlockArgListType getCaptures() {
      return getBody().front().getArguments().drop_front(getNumFixedArgs());
    }
    ::mlir::Block &getEntryBlock() { return getBody().front(); }
    /// The name users bind capture #i by.
    ::llvm::StringRef getCaptureName(unsigned i) {
      return ::llvm::cast<::mlir::StringAttr>(getCaptureNames()[i]).getValue();
    }
  }];
}

def FA_ScoreModOp : FA_ModOp<"score_mod", "score, b, h, q, kv"> {
  let summary = "a score modification: (f32 score, i32 b, i32 h, i32 q, i32 kv) -> f32";
  let description = [{
    Rewrites one attention score. `score` is q·k already multiplied by the softmax scale.
    Captured buffers follow the fixed arguments in `captures(...)`.

    ```mlir
    fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)
        captures(%slopes: !fa.buffer<f32, 1>) -> f32 {
      %d = arith.subi %kv, %q : i32
      %df = arith.sitofp %d : i32 to f32
      %s = fa.load %slopes[%h] : !fa.buffer<f32, 1>
      %m = arith.mulf %df, %s : f32
      %r = arith.addf %score, %m : f32
      fa.yield %r : f32
    }
    ```
  }];
}

def FA_MaskModOp : FA_ModOp<"mask_mod", "b, h, q, kv"> {
  let summary = "a mask: (i32 b, i32 h, i32 q, i32 kv) -> i1";
  let description = [{
    Decides whether query `q` attends to key `kv` (true = keep).

    ```mlir
    fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %c = arith.cmpi sge, %q, %kv : i32
      fa.yield %c : i1
    }
    ```
  }];
}

def FA_ScoreGradOp : FA_Op<"score_grad", [IsolatedFromAbove, FA_ModBodyInterface,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "the derivative of a score_mod: (score, b, h, q, kv, f32 dt) -> f32 dS";
  let description = [{
    What `fa-differentiate` makes of the fa.score_mod named by `@mod` (not a symbol itself:
    it names the mod it differentiates). Takes the score_mod's arguments plus `dt`, the
    gradient of the loss with respect to the score_mod's result, and yields
    dS = dt * d score_mod / d score at `score`. Each `fa.grad_add` in the body adds
    dt * d score_mod / d buffer[indices] to the gradient of a captured f32 buffer. The
    captures are the score_mod's. The body is straight-line: the forward ops first, then
    their adjoints in reverse order.

    ```mlir
    fa.score_grad @bias(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32, %dt: f32)
        captures(%bias: !fa.buffer<f32, 2>) -> f32 {
      fa.grad_add %bias[%q, %kv], %dt : !fa.buffer<f32, 2>
      fa.yield %dt : f32
    }
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$mod, TypeAttr:$result_type, StrArrayAttr:$capture_names);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of fixed leading block arguments (score, b, h, q, kv, dt).
    static unsigned getNumFixedArgs();
    /// The name of fixed argument `i`.
    static ::llvm::StringRef getFixedArgName(unsigned i);
    ::mlir::Block::BlockArgListType getCaptures() {
      return getBody().front().getArguments().drop_front(getNumFixedArgs());
    }
    ::mlir::Block &getEntryBlock() { return getBody().front(); }
    ::llvm::StringRef getCaptureName(unsigned i) {
      return ::llvm::cast<::mlir::StringAttr>(getCaptureNames()[i]).getValue();
    }
    /// The name of the score_mod it differentiates (and its own name in diagnostics).
    ::llvm::StringRef getSymName() { return getMod(); }
  }];
}

def FA_GradAddOp : FA_Op<"grad_add", [ParentOneOf<["ScoreGradOp"]>,
    MemoryEffects<[MemWrite]>]> {
  let summary = "add to the gradient of one element of a captured f32 buffer";
  let description = [{
    Only inside fa.score_grad: adds `value` to d loss / d `buffer[indices]` (the adjoint of
    an fa.load of that element). One op per read; reads of the same element add up.

    ```mlir
    fa.grad_add %slopes[%h], %g : !fa.buffer<f32, 1>
    ```
  }];
  let arguments = (ins FA_BufferType:$buffer, Variadic<I32>:$indices, F32:$value);
  let assemblyFormat = "$buffer `[` $indices `]` `,` $value attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def FA_LoadOp : FA_Op<"load", [Pure, ParentOneOf<["ScoreModOp", "MaskModOp", "ScoreGradOp"]>,
    TypesMatchWith<"result type is the buffer's element type", "buffer", "result",
                   "::llvm::cast<::mlir::fa::BufferType>($_self).getElementType()">]> {
  let summary = "read one element of a captured buffer";
  let description = [{
    Reads `buffer[indices]`; one i32 index per dimension, computed from b/h/q/kv or
    anything else in the body. Buffers are read-only while a kernel runs, so loads are pure.

    ```mlir
    %s = fa.load %slopes[%h] : !fa.buffer<f32, 1>
    ```
  }];
  let arguments = (ins FA_BufferType:$buffer, Variadic<I32>:$indices);
  let results = (outs AnyTypeOf<[F32, I32]>:$result);
  let assemblyFormat = "$buffer `[` $indices `]` attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def FA_ScalarOp : FA_Op<"scalar", [Pure, ParentOneOf<["ScoreModOp", "MaskModOp", "ScoreGradOp"]>]> {
  let summary = "a named runtime scalar";
  let description = [{
    A value supplied at launch time (a kernel argument), such as a window size or a softcap.
    Changing its value never produces a new kernel. Never folded.

    ```mlir
    %w = fa.scalar "window" : i32
    ```
  }];
  let arguments = (ins StrAttr:$name);
  let results = (outs AnyTypeOf<[F32, I32]>:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def FA_YieldOp : FA_Op<"yield", [Pure, Terminator, ReturnLike,
    ParentOneOf<["ScoreModOp", "MaskModOp", "ScoreGradOp"]>]> {
  let summary = "the result of a score_mod (f32), mask_mod (i1) or score_grad (f32)";
  let arguments = (ins AnyType:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
  let hasVerifier = 1;
}

#endif // FAJIT_DIALECT_FA_OPS_TD
