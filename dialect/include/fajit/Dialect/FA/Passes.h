#pragma once

#include <memory>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

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

/// Module-level checks that no single op can make: a runtime scalar name used with two
/// types, two mods with the same symbol, a capture name bound to two buffer types.
LogicalResult verifyFAModule(ModuleOp module);

}  // namespace mlir::fa
