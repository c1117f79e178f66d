// The mask range program: a mask_mod lowered once to flat, MLIR-free code over the interval
// domain (interval.h), and its evaluation over a box of (b, h, q, kv) ranges. What
// fa::MaskRangeProgram (fajit/mask_analysis.h) holds; internal to the compiler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fajit/analysis/interval.h"
#include "fajit/detail/mask_analysis.h"

namespace fa::detail {

// RInst::op of an op modelled as anything (loads, transcendental math): its result is the
// top of its type, and b / h reach nothing through it (RangeFields::verdict_reads_b / h).
constexpr uint8_t kRangeTop = 0xff;

struct RInst {
  uint8_t op;    // mlir::fa::BodyOp, or kRangeTop: "anything of its type" whatever its operands
  uint8_t w;     // integer width of the result (cmpi, casts from int: of the operand)
  uint8_t rw;    // integer width of the result (0 for f32)
  uint8_t pred;  // cmpi / cmpf predicate
  uint32_t dst;
  uint32_t src[3];
};

struct RangeFields {
  std::vector<AVal> init;  // registers: b, h, q, kv, constants, scalars
  std::vector<RInst> code;
  std::vector<std::string> scalar_names;
  std::vector<uint8_t> scalar_is_float;
  std::vector<uint32_t> scalar_regs;
  std::vector<uint8_t> scalar_rw;  // 0 for f32
  uint32_t result = 0;
  bool reads_b = false, reads_h = false, reads_buffers = false;
  bool opaque = false;  // holds ops modelled as "anything" (loads, transcendental math)
  // Whether the verdict can depend on b / h: false where they reach the result only through ops
  // modelled as "anything" (doc[b, q] == doc[b, kv]: b picks the load, whose value is unknown
  // whatever b is), so one (b, h) decides the blocks of all.
  bool verdict_reads_b = false, verdict_reads_h = false;
};

// A program with its scalars bound and a private register file.
class Evaluator {
 public:
  Evaluator(const RangeFields& f, const ScalarValues& scalars);

  MaskVerdict eval(const IndexRange& b, const IndexRange& h, const IndexRange& q, const IndexRange& kv);

  int64_t evaluations = 0;

 private:
  const RangeFields& f_;
  std::vector<AVal> regs_;
};

}  // namespace fa::detail
