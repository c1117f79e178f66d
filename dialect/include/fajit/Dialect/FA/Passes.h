#pragma once

#include <memory>

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include "fajit/Dialect/FA/FAOps.h"

namespace mlir::fa {

#define GEN_PASS_DECL
#include "fajit/Dialect/FA/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "fajit/Dialect/FA/Passes.h.inc"

/// What a mod reads: the result of fa-annotate-deps, also usable directly.
struct ModUses {
  bool score = false, b = false, h = false, q = false, kv = false;
  llvm::SmallVector<std::string> buffers;  // capture names read, in capture order
  llvm::SmallVector<std::string> scalars;  // runtime scalar names, sorted
};
ModUses computeUses(Operation *modOp);

/// Builds the derivative of `mod` right after it (what fa-differentiate does for one mod,
/// without the cleanup: run canonicalize + CSE after). Emits an error naming the op and
/// fails when the derivative does not exist.
FailureOr<ScoreGradOp> differentiateScoreMod(ScoreModOp mod);

/// The capture names of the f32 buffers `mod` reads: the buffers a gradient can be asked for
/// (i32 buffers are indices, never differentiated), in capture order.
llvm::SmallVector<std::string> differentiableBuffers(ScoreModOp mod);

/// Module-level checks that no single op can make: a runtime scalar name used with two
/// types, two mods with the same symbol, a capture name bound to two buffer types.
LogicalResult verifyFAModule(ModuleOp module);

}  // namespace mlir::fa
