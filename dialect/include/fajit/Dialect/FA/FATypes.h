#pragma once

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "fajit/Dialect/FA/FATypes.h.inc"
