#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "fajit/Dialect/FA/FADialect.h"
#include "fajit/Dialect/FA/FATypes.h"

#include "fajit/Dialect/FA/FAInterfaces.h.inc"

#define GET_OP_CLASSES
#include "fajit/Dialect/FA/FAOps.h.inc"

namespace mlir::fa {

/// Whether `op` may appear in a score_mod / mask_mod body: an op of the table in BodyOps.def
/// (arith/math ops and fa.load, which codegen, the interpreter and the range analysis all
/// implement), arith.constant, fa.scalar or fa.yield.
bool isSupportedBodyOp(Operation *op);

/// Registers the fa dialect and what its bodies use (arith, math) with `registry`.
void registerFADialects(DialectRegistry &registry);

}  // namespace mlir::fa
