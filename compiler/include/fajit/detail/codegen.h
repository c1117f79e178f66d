// Codegen: fa IR (a fa::Program) + KernelSpec -> one CUDA translation unit for NVRTC.
//
// The score_mod / mask_mod become `struct FaMods` (see templates/README.md), one SSA value
// per line, each line tagged `// fa: <the op it came from>` so an NVRTC error points back at
// the user's IR. Captured buffers and runtime scalars are read from FaCaptures slots
// (templates/fajit/params.h), so a scalar's value never changes the source.
#pragma once

#include <string>
#include <vector>

#include "fajit/frontend.h"
#include "fajit/kernel_spec.h"

namespace fa {

struct GeneratedKernel {
  std::string source;       // the whole translation unit
  std::string kernel_name;  // extern "C" entry point
  KernelSpec spec;          // resolved
  std::vector<CaptureSlot> slots;
};

// Slots in Program::captures() order: buffers take buffers[0..], scalars scalars[0..].
// Throws fa::Error when there are more than FA_MAX_BUFFERS / FA_MAX_SCALARS.
std::vector<CaptureSlot> capture_slots(const Program& program);

// Whether a captured buffer (or a buffer gradient) of this shape and these strides (elements)
// needs the wide-captures twin of a kernel (KernelSpec::wide_captures): its innermost
// dimension is not contiguous, or its elements span 2^31 or more (a negative stride counts as
// wide). Size-1 dimensions are never indexed past 0, so their strides do not matter.
bool needs_wide_captures(int rank, const int64_t* shape, const int64_t* stride);

// Output rows (one warp each) per CTA of the decode combine kernel (DecodeConfig::kCombineWarps).
constexpr int kDecodeCombineWarps = 4;

// Threads per CTA of the backward's preprocess and dQ-conversion kernels (BwdConfig::
// kPreThreads; each thread takes one 16-byte chunk of a row).
constexpr int kBwdAuxThreads = 128;
// The deterministic dQ kernel's launch shape (BwdConfig::kDetThreads / kDetSmemBytes): BLOCK_M
// query rows, 16 per warp; Q and dO tiles plus two stages of 64-key K/V tiles.
inline int bwd_det_threads(const KernelSpec& s) { return s.tile.block_m / 16 * 32; }
inline int bwd_det_smem_bytes(const KernelSpec& s) {
  return (s.tile.block_m + 2 * 64) * (head_dim_pitch(s.head_dim_qk) + head_dim_pitch(s.head_dim_v)) * 2;
}
// Parts of the dK/dV grid (BwdConfig::kDkDvParts, grid z): the mma.sync backward keeps dK and
// dV of a warp's keys in registers together up to 256 columns (each head dim rounded up to 16);
// a wider head runs a dV part and a dK (+ dQ) part.
inline int bwd_dkdv_parts(const KernelSpec& s) {
  return s.family == KernelFamily::kMmaSync && head_dim_mma(s.head_dim_qk) + head_dim_mma(s.head_dim_v) > 256
             ? 2
             : 1;
}
// Whether the Hopper backward at these head dims is the wide-head kernel (templates/fajit/
// backward_sm90.cuh, Sm90WideBwdConfig: 64 x 64 tiles, dK and dV accumulated transposed).
bool sm90_backward_wide(int head_dim_qk, int head_dim_v);
// Whether the Hopper forward at this tile gives each K stage back after S = Q·Kᵀ
// (templates/fajit/forward_sm90.cuh, EARLY_K).
bool sm90_forward_early_k(const TileConfig& tile);
// Whether a resolved forward spec is the persistent Hopper forward (templates/fajit/
// forward_sm90.cuh, PERSISTENT): the dense wgmma forward with K/V by TMA, at any tile where a
// second Q region fits the arch's shared memory beside the tile's stages. It launches one CTA
// per SM (at most one per query block) with FaFwdParams::tile_counter zeroed and Q as a fourth
// (TMA map) argument.
bool sm90_forward_persistent(const KernelSpec& spec);
// Whether the Hopper forward at this tile stages each consumer's P in shared memory for an SS
// P·V (templates/fajit/forward_sm90.cuh, Sm90FwdConfig::kPFromSmem): three consumer warpgroups
// at 128 keys above a V head dim of 64, where S, P and O do not fit 160 registers together.
bool sm90_forward_p_in_smem(const TileConfig& tile, int head_dim_v);
// Whether the dense or sequence-layout (`spec.layout`) wgmma forward with these mods takes
// `spec.tile` (one of its list: KernelSpec::resolved refuses the others).
bool sm90_forward_takes_tile(const KernelSpec& spec, bool has_score_mod, bool has_mask_mod);
// Whether a backward not asked to be deterministic still takes the deterministic kernels (dQ
// in its own kernel over the KV tables, no fp32 reductions from the dK/dV kernel): where that is
// measured faster. H200, bf16, B=4 H=16 S=4096, mma.sync (what sm_80/86 and an mma.sync
// forward get; sm_90a takes the wgmma backward at every head dim): QK 256 full 24.5 vs 35.3 ms (the dK + dQ
// part's reductions of 256 columns), 192 13.9 vs 12.7 (reductions win).
inline bool bwd_prefers_separate_dq(const KernelSpec& s) {
  return s.kind == KernelKind::kBackward && s.family == KernelFamily::kMmaSync && s.head_dim_qk > 192;
}
// Whether a deterministic backward sums dQ in its dK/dV kernel, each 64 query rows' parts in a
// fixed order (templates/fajit/backward_sm90.cuh, kDqOrdered: FaBwdParams::dq_order), rather than
// in the separate dQ kernel (dq_det): the Hopper dK/dV kernel up to head dims 128 (its dQ writers).
inline bool bwd_orders_dq(const KernelSpec& s) {
  return s.kind == KernelKind::kBackward && s.deterministic && s.family == KernelFamily::kWgmma &&
         !sm90_backward_wide(s.head_dim_qk, s.head_dim_v);
}
// Rows per CTA of the preprocess (V rows) and dQ-conversion (QK rows) kernels: a power of two
// lanes per row, one 16-byte chunk each (BwdConfig::kPreRows / kDqRows).
inline int bwd_aux_rows(int head_dim) {
  int lanes = 1;
  while (lanes < head_dim / 8) lanes *= 2;
  return kBwdAuxThreads / lanes;
}

// The FaMods struct for `program`; with_backward adds the backward's members (kScoreGrad,
// score_grad: templates/fajit/backward.cuh).
std::string emit_mods(const Program& program, bool with_backward = false);

// The has_score_mod that KernelSpec::resolved takes for `program`'s kernels of `kind`: whether
// the score_mod costs registers per score. The forward's: any score_mod. The backward's: a
// derivative other than dS = dT (with a bias alone, the backward's tiles are those of no
// score_mod; measured on the H200: ALiBi causal d64 1.46 -> 1.18 ms at BLOCK_M 128).
bool score_mod_weighs(const Program& program, KernelKind kind);

// The full source of the kernel `spec` selects.
GeneratedKernel generate(const Program& program, const KernelSpec& spec);
// The block-mask builder's table kernels (<name>_tables, _regroup, _kinds: FAJIT_DEFINE_BLOCK_TABLES),
// which read no mods: one module per arch for every mask_mod. generate() for a kBlockMask spec
// gives the classifier alone (FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER).
GeneratedKernel generate_block_tables(const std::string& arch);

}  // namespace fa
