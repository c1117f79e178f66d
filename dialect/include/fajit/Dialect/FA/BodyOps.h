// The ops of score_mod / mask_mod bodies as one table (BodyOps.def): the opcode enum every
// evaluator dispatches on, each op's signature kind, and the lookup from an mlir::Operation.
//
//   if (std::optional<mlir::fa::BodyOp> code = mlir::fa::getBodyOp(op))
//     switch (*code) { case mlir::fa::BodyOp::AddI: ...; }   // no default: -Wswitch lists
//                                                           // the ops a switch lacks
#pragma once

#include <cstdint>
#include <optional>

#include "llvm/ADT/StringRef.h"

namespace mlir {
class Operation;
}

namespace mlir::fa {

/// The signature of a body op: the types it reads and produces ("int" is i1 or i32).
enum class BodyOpKind : uint8_t {
  IntBinary,     // int x int -> int, all three of one width
  IntUnary,      // int -> int
  IntCompare,    // int x int -> i1 (predicate attribute)
  FloatBinary,   // f32 x f32 -> f32
  FloatUnary,    // f32 -> f32
  FloatCompare,  // f32 x f32 -> i1 (predicate attribute)
  IntToFloat,    // int -> f32
  FloatToInt,    // f32 -> int
  IntExtend,     // i1 -> i32
  IntTruncate,   // i32 -> i1
  Select,        // i1 x T x T -> T
  Load,          // buffer x i32... -> element type (one index per dimension)
};

/// One enumerator per line of BodyOps.def, in its order.
enum class BodyOp : uint8_t {
#define FA_BODY_OP(Name, OpClass, Kind) Name,
#include "fajit/Dialect/FA/BodyOps.def"
};

inline constexpr unsigned kNumBodyOps = 0
#define FA_BODY_OP(Name, OpClass, Kind) +1
#include "fajit/Dialect/FA/BodyOps.def"
    ;

/// The table entry of `op`, or nullopt when `op` is not a body op of the table (arith.constant,
/// fa.scalar and fa.yield are not: evaluators handle them apart).
std::optional<BodyOp> getBodyOp(Operation *op);

/// The op's name: "arith.addi".
llvm::StringRef getBodyOpName(BodyOp op);

/// The op's signature.
BodyOpKind getBodyOpKind(BodyOp op);

/// Number of operands (a load: at least 2, the buffer and one index per dimension).
unsigned getBodyOpArity(BodyOpKind kind);

}  // namespace mlir::fa
