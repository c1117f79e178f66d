#ifndef FAJIT_DIALECT_FA_TYPES_TD
#define FAJIT_DIALECT_FA_TYPES_TD

include "fajit/Dialect/FA/FADialect.td"

def FA_BufferType : TypeDef<FA_Dialect, "Buffer"> {
  let mnemonic = "buffer";
  let summary = "a captured, read-only device buffer";
  let description = [{
    A tensor captured by a score_mod or mask_mod, such as ALiBi slopes or document ids.
    Element type f32 or i32; rank 1 to 4. Its data and strides are kernel arguments.

    ```mlir
    !fa.buffer<f32, 1>
    ```
  }];
  let parameters = (ins "::mlir::Type":$elementType, "unsigned":$rank);
  let assemblyFormat = "`<` $elementType `,` $rank `>`";
  let genVerifyDecl = 1;
}

#endif // FAJIT_DIALECT_FA_TYPES_TD
