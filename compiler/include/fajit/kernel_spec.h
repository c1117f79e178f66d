// fa::KernelSpec: a plain value naming everything that selects a kernel besides the mods (its
// canonical text plus the generated source form the cache key), and fa::CaptureSlot, where
// the kernel reads each capture.
#pragma once

#include <string>
#include <vector>

#include "fajit/export.h"
#include "fajit/types.h"  // fa::DType

namespace fa {

enum class KernelKind : uint8_t {
  kForward,    // attention forward (templates/fajit/forward.cuh)
  kBlockMask,  // block classification from the mask_mod (templates/fajit/block_mask.cuh)
  kBackward,   // attention backward: preprocess, dK/dV (+ dQ partials), dQ (backward.cuh)
  kDecode,     // split-KV decoding for short queries: parts, then combine (decode.cuh)
};

// Which forward kernel: FlashAttention-2 style mma.sync (sm_80+), or the Hopper kernel with
// wgmma, a producer warpgroup and two consumer warpgroups (sm_90a only). kAuto picks wgmma on
// sm_90a unless an explicit tile is given (tiles describe the mma.sync kernel).
enum class KernelFamily : uint8_t { kAuto, kMmaSync, kWgmma };

// How a kernel finds a sequence's rows: dense [B, H, L, D] operands; ragged (packed
// sequences: cu_seqlens / seqlens tables read per CTA, lengths change without a new kernel);
// paged (ragged, and K/V rows gathered from a page pool through a page table). Forward
// (both families: the wgmma forward with K/V by cp.async) and decoding kernels take all three;
// the others are dense.
enum class SequenceLayout : uint8_t { kDense, kRagged, kPaged };

// The forward kernel's tile: BLOCK_M query rows per CTA, BLOCK_N key rows per pipeline
// stage, warps per CTA, cp.async stages. All zero = the default for the head dims.
struct TileConfig {
  int block_m = 0, block_n = 0, warps = 0, stages = 0;
  bool is_default() const { return block_m == 0 && block_n == 0 && warps == 0 && stages == 0; }
  bool operator==(const TileConfig& o) const {
    return block_m == o.block_m && block_n == o.block_n && warps == o.warps && stages == o.stages;
  }
};

struct FA_API KernelSpec {
  KernelKind kind = KernelKind::kForward;
  DType dtype = DType::bf16;  // Q/K/V/O element type: f16 or bf16
  int head_dim_qk = 128;      // a multiple of 8 from 32 to 256
  int head_dim_v = 128;       // a multiple of 8 from 32 to 256, independent of head_dim_qk
  KernelFamily family = KernelFamily::kAuto;
  TileConfig tile;  // resolved by resolved(); default picks per head dims
  std::string arch = "sm_90a";
  bool deterministic = false;  // backward: dQ without atomics, bit-identical run to run
  SequenceLayout layout = SequenceLayout::kDense;
  // How the mods address captured buffers. false (what fa::compile builds): 32-bit element
  // offsets with the innermost dimension contiguous, for buffers that span fewer than 2^31
  // elements; true: 64-bit offsets through every stride. The runtime launches the wide twin
  // of a kernel (compiled on first need) only for a call whose buffers (or buffer gradients)
  // the narrow form cannot address.
  bool wide_captures = false;
  // The Hopper forward's K/V copies. false (what fa::compile builds): TMA only, one thread
  // issuing each tile; true: cp.async by the producer warpgroup, the twin the runtime compiles
  // on first need for a call whose K or V the driver's tensor maps cannot describe (a base or
  // row stride not a multiple of 16 bytes, FAJIT_TMA=0). Keeping the fallback out of the
  // default kernel saves 7-9 % of its NVRTC time. resolved() sets it for the ragged and paged
  // layouts of the wgmma forward (their K/V rows come by cp.async).
  bool cp_async_kv = false;
  // The forward and decoding kernels also write each row's largest modded score
  // (ForwardOptions::max_scores, flex_attention's AuxRequest(max_scores=True)). false (what
  // fa::compile builds): the kernels track no such max; true: the twin the runtime compiles on
  // the first call that asks for the maxima.
  bool row_max = false;

  // Launch shape of a resolved forward spec (mirrors the template's constants; codegen emits
  // static_asserts so the two cannot drift apart).
  int threads() const;
  int smem_bytes() const;
  // A resolved decoding spec: the CTAs per SM its split count assumes (kernel.cpp) and its
  // __launch_bounds__ guarantee — what the arch's shared memory holds, at most 3 (registers
  // then stay within 170, what the d64 kernels use). One value for every layout of a spec:
  // the ragged and paged kernels differ in registers, and an occupancy measured per kernel
  // split (so rounded) their runs differently, where paged must equal packed bit for bit.
  int decode_ctas_per_sm() const;

  // The same spec with the tile filled in and every field checked; throws fa::Error naming
  // the bad field ("head_dim_qk must be a multiple of 8 from 32 to 256, got 100"), the
  // family that cannot take the head dims, or the tile the arch's shared memory cannot hold.
  // The default tile depends on whether the score_mod costs registers per score (codegen's
  // score_mod_weighs: for the backward, a derivative other than dS = dT) and, for the wgmma
  // forward, whether there is a mask_mod (none: every tile full, wide tiles cost no partial ones).
  KernelSpec resolved(bool has_score_mod = false, bool has_mask_mod = true) const;
  // Canonical one-line text: "forward bf16 qk128 v128 tile128x64w8s2 sm_90a".
  std::string to_string() const;
  bool operator==(const KernelSpec& o) const {
    return kind == o.kind && dtype == o.dtype && family == o.family && head_dim_qk == o.head_dim_qk &&
           head_dim_v == o.head_dim_v && tile == o.tile && arch == o.arch &&
           deterministic == o.deterministic && layout == o.layout && wide_captures == o.wide_captures &&
           cp_async_kv == o.cp_async_kv && row_max == o.row_max;
  }
};

// Where a capture lives in FaCaptures: buffers[slot] or scalars[slot].
struct CaptureSlot {
  std::string name;
  bool is_buffer = false;
  bool is_float = false;  // f32, else i32
  int rank = 0;           // buffers only
  int slot = 0;
};

// Head dims: any multiple of 8 from kMinHeadDim to kMaxHeadDim. The mma.sync kernels compute in
// 16-column steps (head_dim_mma: an odd multiple of 8 computes one zero chunk more) and keep
// shared rows in 64-element swizzle groups (head_dim_pitch: 80 -> 128); the wgmma forward takes
// every head dim, and so does the wgmma backward (up to 128 each with 128 keys per CTA, above
// that the wide-head kernel: detail/codegen.h sm90_backward_wide). The mma.sync backward splits its dK/dV
// grid above 256 columns (detail/codegen.h bwd_dkdv_parts).
constexpr int kMinHeadDim = 32, kMaxHeadDim = 256;
FA_API int head_dim_mma(int head_dim);
FA_API int head_dim_pitch(int head_dim);

// The one source of the default tiles (the templates have none; codegen spells the config).
// Measured on an H200. mma.sync (templates/fajit/forward.cuh): 128x64 tiles, 2 stages; 4 warps
// (32 rows each, Q re-read from shared memory) in general, 8 warps with Q in registers when a
// score_mod runs on d128, where 4 warps spill. wgmma (templates/NOTES-sm90.md): 128x128 with
// 12 warps (a producer and two consumer warpgroups), 3 stages; up to head dim 64 192x128 with
// three consumer warpgroups, between 64 and 96 192x112 and at 113-128 (QK and V, dense layout
// only) 192x128 with 2 stages (P through shared memory) when there is neither a score_mod nor a
// mask_mod; between 64 and 128 on the dense layout a mask_mod without a score_mod takes 2 stages
// first, which leave room for the persistent form (kernel_spec.cpp: wgmma_forward_tiles has the
// measurements). Above a V head dim of 128 (O of up to 256 columns in the consumers' registers)
// BLOCK_N is 64; tiles that shared memory cannot hold fall back in order (3 stages, then 2;
// BLOCK_N 128, then 64): 192/128 takes 128x128 with 2 stages, 256/256 128x64 with 2. An
// explicit wgmma tile must be one of that list.
// Backward (mma.sync, templates/fajit/backward.cuh): block_m query rows per step, warps x 16
// keys per CTA (block_n = 16 * warps), 2 stages: 64 x 64 with 4 warps at 64/64, 64 x 128 with
// 8 warps when a head dim is above 64 (a first choice, to be measured).
// Other head dims (not measured yet): a head dim above 128 takes 16 rows per warp in the
// forward (128x64, 8 warps, Q re-read from shared memory); the backward at an odd number of
// 16-column steps of head_dim_qk takes 64 x 64 with 4 warps (dQ columns split over no warps).
// This returns the first choice; KernelSpec::resolved falls back to smaller tiles (block_n 32,
// then block_m 64) until the arch's shared memory (jit::max_dynamic_smem) holds it.
FA_API TileConfig default_tile(int head_dim_qk, int head_dim_v, bool has_score_mod,
                               KernelFamily family = KernelFamily::kMmaSync,
                               KernelKind kind = KernelKind::kForward, bool has_mask_mod = true);

// The forward configurations autotuning times (fa::Options::autotune), the resolved default
// first: on sm_90a every wgmma tile of its list that fits, then the mma.sync default and its
// 64-row tile; elsewhere mma.sync tiles of 128 and 64 rows, the default's BLOCK_N and 32,
// 2 and 3 stages. Each is a
// resolved spec with family and tile set; at most kMaxTuneCandidates, none twice.
constexpr int kMaxTuneCandidates = 8;
FA_API std::vector<KernelSpec> forward_tune_candidates(const KernelSpec& resolved_default, bool has_score_mod,
                                                       bool has_mask_mod = true);

}  // namespace fa
