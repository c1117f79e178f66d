// The fa dialect: FlexAttention score_mod / mask_mod programs (see FADialect.td).
#pragma once

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/Dialect.h"

#include "fajit/Dialect/FA/FADialect.h.inc"
