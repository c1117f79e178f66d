#include "fajit/Dialect/FA/BodyOps.h"

#include "fajit/Dialect/FA/FAOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

using namespace mlir;
using namespace mlir::fa;

std::optional<BodyOp> mlir::fa::getBodyOp(Operation *op) {
#define FA_BODY_OP(Name, OpClass, Kind) \
  if (isa<OpClass>(op)) return BodyOp::Name;
#include "fajit/Dialect/FA/BodyOps.def"
  return std::nullopt;
}

StringRef mlir::fa::getBodyOpName(BodyOp op) {
  static constexpr StringLiteral kNames[] = {
#define FA_BODY_OP(Name, OpClass, Kind) OpClass::getOperationName(),
#include "fajit/Dialect/FA/BodyOps.def"
  };
  return kNames[static_cast<unsigned>(op)];
}

BodyOpKind mlir::fa::getBodyOpKind(BodyOp op) {
  static constexpr BodyOpKind kKinds[] = {
#define FA_BODY_OP(Name, OpClass, Kind) BodyOpKind::Kind,
#include "fajit/Dialect/FA/BodyOps.def"
  };
  return kKinds[static_cast<unsigned>(op)];
}

unsigned mlir::fa::getBodyOpArity(BodyOpKind kind) {
  switch (kind) {
    case BodyOpKind::IntUnary:
    case BodyOpKind::FloatUnary:
    case BodyOpKind::IntToFloat:
    case BodyOpKind::FloatToInt:
    case BodyOpKind::IntExtend:
    case BodyOpKind::IntTruncate: return 1;
    case BodyOpKind::IntBinary:
    case BodyOpKind::IntCompare:
    case BodyOpKind::FloatBinary:
    case BodyOpKind::FloatCompare:
    case BodyOpKind::Load: return 2;
    case BodyOpKind::Select: return 3;
  }
  llvm_unreachable("unknown BodyOpKind");
}
