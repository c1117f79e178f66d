#include "fajit/Dialect/FA/FATypes.h"

#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/DialectImplementation.h"

#include "fajit/Dialect/FA/FADialect.h"

using namespace mlir;
using namespace mlir::fa;

#define GET_TYPEDEF_CLASSES
#include "fajit/Dialect/FA/FATypes.cpp.inc"

LogicalResult BufferType::verify(function_ref<InFlightDiagnostic()> emitError, Type elementType,
                                 unsigned rank) {
  if (!elementType.isF32() && !elementType.isSignlessInteger(32))
    return emitError() << "fa.buffer element type must be f32 or i32, got " << elementType;
  if (rank < 1 || rank > 4) return emitError() << "fa.buffer rank must be between 1 and 4, got " << rank;
  return success();
}

void FADialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "fajit/Dialect/FA/FATypes.cpp.inc"
      >();
}
