#include "fajit/Dialect/FA/FADialect.h"

#include "mlir/IR/DialectImplementation.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/Dialect/FA/FATypes.h"

using namespace mlir;
using namespace mlir::fa;

#include "fajit/Dialect/FA/FADialect.cpp.inc"

void FADialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "fajit/Dialect/FA/FAOps.cpp.inc"
      >();
  registerTypes();
}

void mlir::fa::registerFADialects(DialectRegistry &registry) {
  registry.insert<FADialect, arith::ArithDialect, math::MathDialect>();
}
