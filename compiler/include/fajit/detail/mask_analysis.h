// Symbolic block-mask analysis: decides which q_block x kv_block tiles of a mask_mod are
// empty, full or partial from the IR alone, without evaluating the mask on every element.
//
//   fa::Program p = fa::trace(fa::identity_score(), fa::mods::sliding_window());
//   fa::Captures cap;
//   cap.scalar("window", 1024);
//   fa::MaskAnalysis a = fa::analyze_block_mask(p, /*B=*/1, /*H=*/1, 131072, 131072,
//                                               128, 128, cap);
//   if (a.undecided == 0) mask = fa::BlockMask::from_kinds(a.batch, a.heads, Lq, Lkv, a.kinds);
//   // else: a.kinds holds BlockKind::kUndecided where a block must be evaluated element by
//   //       element (fa::rt::BlockMaskBuildOptions::known, or fa::evaluate_undecided_blocks
//   //       on the CPU)
//
// How: the mask_mod is compiled once into a flat, MLIR-free program over intervals (i32
// [lo, hi] that widens to the full range where an op may wrap; i1 as false/true/unknown;
// f32 intervals with a may-be-NaN flag). Evaluated over a rectangle of blocks it says
// "true everywhere", "false everywhere" or "unknown"; rectangles are split until decided
// (a quadtree over the block grid, so causal at 128k takes a few thousand evaluations).
// A single unknown block is then settled by a witness search: one element where the mask
// holds and one where it does not (point evaluations and interval evaluation of
// sub-rectangles) prove it partial; an exhaustive search proves it full or empty. Blocks the
// search cannot settle within its budget, and blocks whose value depends on fa.load, stay
// undecided (BlockKind::kUndecided): the analysis never calls a block full or empty unless it is.
// (compiler/lib/analysis: interval.cpp the domain, range_program.cpp the program,
// mask_analysis.cpp the classifier; their internal headers are in fajit/analysis/.)
//
// Dependence: the tables get B (resp. H) of 1 when the mask does not read b (resp. h)
// (mlir::fa::computeUses), exactly as Kernel::block_mask builds them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/detail/interp.h"
#include "fajit/frontend.h"

namespace mlir {
class Operation;
}

namespace fa {

class Captures;

// The value of the mask over a set of elements: kFalse/kTrue when it is the same on every
// element, kUnknown when the interval analysis cannot tell.
enum class MaskVerdict : uint8_t { kFalse = 0, kTrue = 1, kUnknown = 2 };
const char* to_string(MaskVerdict v);  // "empty", "full", "unknown"

// An inclusive integer range [lo, hi] of one of b, h, q, kv.
struct IndexRange {
  int64_t lo = 0, hi = 0;
};

// Runtime scalar values the analysis may use, by name (unbound scalars are unknown).
using ScalarValues = std::map<std::string, ScalarValue, std::less<>>;
ScalarValues scalar_values_of(const Captures& captures);
ScalarValues scalar_values_of(const std::map<std::string, double>& preset_values,
                              const Program& program);  // types from the program
// x as the value of i32 scalar `name`: an integer within int32's range, else fa::Error naming it
// (a command line's 1e10, 1.5 or nan is refused, not wrapped or truncated).
int32_t i32_scalar_value(const std::string& name, double x);

namespace detail {
struct RangeFields;
}

// A mask_mod compiled into the interval program (see above). Immutable, cheap to copy,
// usable from many threads.
class MaskRangeProgram {
 public:
  static MaskRangeProgram compile(const Program& program);  // its mask_mod
  // Takes MLIR: for the compiler itself.
  static MaskRangeProgram compile(mlir::Operation* mask_mod);

  // The mask's value over the box b x h x q x kv with `scalars` bound (exact on points of
  // programs without loads and transcendental float ops).
  MaskVerdict eval(IndexRange b, IndexRange h, IndexRange q, IndexRange kv,
                   const ScalarValues& scalars) const;

  bool reads_b() const;
  bool reads_h() const;
  bool reads_buffers() const;  // some fa.load feeds the result: such blocks may stay undecided
  size_t num_instructions() const;

  const detail::RangeFields& fields() const { return *f_; }  // internal

 private:
  explicit MaskRangeProgram(std::shared_ptr<const detail::RangeFields> f) : f_(std::move(f)) {}
  std::shared_ptr<const detail::RangeFields> f_;
};

// What analyze_block_mask found.
struct MaskAnalysis {
  int batch = 1, heads = 1;  // Bm, Hm: 1 when the mask does not read b / h
  int num_q_blocks = 0, num_kv_blocks = 0;
  std::vector<uint8_t> kinds;  // [Bm, Hm, nq, nkv]: BlockKind values, kUndecided included
  int64_t decided = 0;         // blocks with kinds != kUndecided
  int64_t undecided = 0;
  int64_t evaluations = 0;  // interval/point evaluations performed (for benchmarks)
  bool reads_buffers = false;
};
constexpr uint8_t kUndecidedBlock = static_cast<uint8_t>(BlockKind::kUndecided);

// Classifies every block of [B, H, Lq, Lkv] (blocks q_block x kv_block, tails clipped to the
// lengths) from the mask_mod's IR with the captures' scalar values bound. Never touches a GPU.
// Throws fa::Error for non-positive sizes.
MaskAnalysis analyze_block_mask(const Program& program, int batch, int heads, int64_t len_q, int64_t len_kv,
                                int q_block, int kv_block, const Captures& captures);
MaskAnalysis analyze_block_mask(const MaskRangeProgram& program, int batch, int heads, int64_t len_q,
                                int64_t len_kv, int q_block, int kv_block, const ScalarValues& scalars);

// Fills the undecided blocks of `a` by evaluating `mask` (the same mask_mod as a
// fa::ModProgram) on every element of those blocks on the CPU, with `bindings` (scalars and
// host buffers). Afterwards a.kinds equals fa::brute_force_block_classes. Returns the number
// of blocks evaluated.
int64_t evaluate_undecided_blocks(MaskAnalysis& a, const ModProgram& mask, const Bindings& bindings,
                                  int64_t len_q, int64_t len_kv, int q_block, int kv_block);

}  // namespace fa
