// fajit forward attention kernel (FlashAttention-2 structure, mma.sync, sm_80+).
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ... };                                   // see templates/README.md
//   #include "fajit/forward.cuh"
//   using FaConfig = fa::FwdConfig<fa::bf16_t, 128, 128, 128, 64, 4, 2>;
//                          // the tile from the host: fa::default_tile() (kernel_spec.h)
//   FAJIT_DEFINE_FORWARD(fajit_fwd, FaConfig, FaMods)
// The macro arguments must be single identifiers (macros split on commas): name the config
// with a `using` first. The kernel is `extern "C"`, so the host looks it up by `name`.
//
// ---- Element type -----------------------------------------------------------------------
//   fa::f16_t (IEEE half) or fa::bf16_t; Q, K, V and O share it. LSE is fp32.
//
// ---- Config (fa::FwdConfig<Element, DQK, DV, BLOCK_M, BLOCK_N, WARPS, STAGES, MIN_BLOCKS,
//                            Q_IN_REGS>)
//   Element      storage type of Q/K/V/O (fa::f16_t or fa::bf16_t)
//   DQK, DV      head dims of Q·Kᵀ and of V/O: multiples of 8 from 32 to 256, independently
//                (an odd number of 16-byte chunks computes one zero chunk more; shared rows
//                are padded to multiples of 64 elements: fajit::HeadRow)
//   BLOCK_M      query rows per CTA; each warp owns BLOCK_M / WARPS rows (16 or 32)
//   BLOCK_N      key/value rows per pipeline tile (32, 64 or 128)
//   WARPS        warps per CTA (4 or 8)
//   STAGES       K/V shared-memory stages of the cp.async pipeline (2..4)
//   MIN_BLOCKS   __launch_bounds__ min blocks per SM (1 = no register cap)
//   Q_IN_REGS    keep Q fragments in registers for the whole KV walk (default: when a warp
//                owns 16 rows and DQK <= 128); false re-reads them from the shared Q tile at each k-step,
//                which frees registers for 32-row warps (better K/V fragment reuse)
// The sparse block sizes of FaBlockTables must be multiples of BLOCK_M (q_block) and BLOCK_N
// (kv_block); the kernel walks kv_block / BLOCK_N sub-tiles of each sparse block.
//
// ---- Launch (host mirrors these formulas; Config constants are spelled out below) --------
//   grid  = ( ceil(len_q / BLOCK_M), batch * heads_q, 1 )
//   block = ( WARPS * 32, 1, 1 )                               == Config::kThreads
//   dynamic shared memory bytes                                == Config::kSmemBytes
//         = 2 * ( BLOCK_M * max(PQK, PV) + STAGES * BLOCK_N * (PQK + PV) )
//   with PQK, PV the head dims rounded up to multiples of 64 (HeadRow::kPitch * 8)
//   when > 48 KiB: cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, n).
//   Kernel arguments: (const FaFwdParams p, const FaCaptures cap), by value.
//   Host-validated preconditions: scale > 0; heads_q % heads_kv == 0; len_q, len_kv >= 1;
//   head dim contiguous; Q/K/V/O base pointers and row strides 16-byte aligned
//   (row strides multiples of 8 elements); mask.q_block % BLOCK_M == 0,
//   mask.kv_block % BLOCK_N == 0; table indices < ceil(len_kv / kv_block).
//
// ---- Semantics (flex_attention) ----------------------------------------------------------
//   score = q·k · scale (the product may fuse into the score's first add: templates/README.md),
//   then FaMods::score_mod(score, b, h, q, kv); for partial blocks also
//   FaMods::mask_mod(b, h, q, kv) (false -> -inf). Partial blocks first, then full blocks
//   (score_mod only); empty blocks are never read. Any tile whose kv range crosses len_kv is
//   bounds-masked, whatever its class. Query rows past len_q are computed with a clamped q
//   index (mods never see q >= len_q or kv >= len_kv) and never stored. GQA: q head h reads
//   kv head h / (heads_q / heads_kv). A row with no unmasked score gets O = 0, LSE = -inf.
//   Up to head dim 64 codegen's mods come split (MmaMods): their loads by q once per CTA
//   (ModRows), by kv a tile ahead of its S MMAs, spread over the warp (ModCols); H200, a
//   document mask at d64 1.036x against the plain per-element calls (2026-11-28).
#ifndef FAJIT_FORWARD_CUH
#define FAJIT_FORWARD_CUH

#include "fajit/attention_tile.cuh"
#include "fajit/block_walk.cuh"
#include "fajit/mma.cuh"
#include "fajit/params.h"
#include "fajit/prelude.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kWarps_,
          int kStages_, int kMinBlocksPerSM_ = 1,
          bool kQInRegisters_ = (kBlockM_ / kWarps_ == 16 && kHeadDimQK_ <= 128)>
struct FwdConfig : AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_> {
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocksPerSM = kMinBlocksPerSM_;
  static constexpr bool kQInRegisters = kQInRegisters_;

  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerWarp = kBlockM / kWarps;
  using Shape = AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_>;
  static constexpr int kMaxPitch = Shape::kCQ > Shape::kCV ? Shape::kCQ : Shape::kCV;
  static constexpr int kSmemQOBytes = kBlockM * kMaxPitch * 16;          // Q tile, then O staging
  static constexpr int kSmemKBytes = kBlockN * Shape::RowQK::kRowBytes;  // one K stage
  static constexpr int kSmemVBytes = kBlockN * Shape::RowV::kRowBytes;   // one V stage
  static constexpr int kSmemBytes = kSmemQOBytes + kStages * (kSmemKBytes + kSmemVBytes);

  static_assert(kHeadDimQK % 8 == 0 && kHeadDimQK >= 32 && kHeadDimQK <= 256,
                "DQK must be a multiple of 8 from 32 to 256");
  static_assert(kHeadDimV % 8 == 0 && kHeadDimV >= 32 && kHeadDimV <= 256,
                "DV must be a multiple of 8 from 32 to 256");
  static_assert(kWarps == 4 || kWarps == 8, "WARPS must be 4 or 8");
  static_assert(kBlockM % kWarps == 0 && (kRowsPerWarp == 16 || kRowsPerWarp == 32),
                "BLOCK_M / WARPS (rows per warp) must be 16 or 32");
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "BLOCK_N must be 32, 64 or 128");
  static_assert(kStages >= 2 && kStages <= 4, "STAGES must be 2, 3 or 4");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

template <typename Cfg, typename Mods>
__device__ __forceinline__ void forward_kernel(const FaFwdParams& p, const FaCaptures& cap) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kRW = Cfg::kRowsPerWarp;
  constexpr int kMT = kRW / 16;  // 16-row m-tiles per warp
  constexpr int kThreads = Cfg::kThreads;
  using RowQK = typename Cfg::RowQK;
  using RowV = typename Cfg::RowV;

  extern __shared__ __align__(128) unsigned char smem[];
  const LaneCoords lc;
  const int tid = lc.tid, lane = lc.lane, warp = lc.warp, g = lc.g, t = lc.t;
  const QueryBlockCta cta(kBM, p.heads_q, p.heads_kv);
  const int q0 = cta.q0, b = cta.b, h = cta.h, hkv = cta.hkv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  const E* qg = static_cast<const E*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
  constexpr bool kPaged = Cfg::kLayout == kPagedLayout;
  KvTiles<E, kPaged, kBN, RowQK, RowV, kThreads> kv(p, b, hkv);

  const u32 sQ = smem_addr(smem);
  const u32 sK = sQ + Cfg::kSmemQOBytes;
  const u32 sV = sK + kStages * Cfg::kSmemKBytes;

  // ---- block-sparse walk: partial blocks, then full blocks, kv_block / BLOCK_N tiles each
  // (sub-tiles past the end of a tail block are never visited). Two cursors over the same
  // tiles: `ld` feeds the cp.async ring kStages - 1 tiles ahead, and moves right after issuing
  // its copies, so the next block index loads under this tile's MMAs instead of stalling the
  // copies after the barrier; paged, the next tile's page ids load right after it, likewise.
  const BlockWalk<kBN> walk(p.mask, b, h, q0);
  TileCursor<kBN> ld(walk, len_kv);
  if (!ld.done(walk)) kv.prefetch(ld.start, len_kv, tid);
  auto load_kv = [&](int s) {
    if (ld.done(walk)) return;
    kv.load(sK + s * Cfg::kSmemKBytes, sV + s * Cfg::kSmemVBytes, ld.start, len_kv, tid);
    ld.next(walk, len_kv);
    if (!ld.done(walk)) kv.prefetch(ld.start, len_kv, tid);
  };

  // ---- prologue: Q, then the first STAGES-1 K/V tiles, one cp.async group each
  load_tile_async<kBM, RowQK, kThreads>(sQ, qg, p.q_stride_m, q0, len_q, tid);
  cp_async_commit();
  KvPipeline<kStages>::prime(load_kv);

  // Q fragments: ldmatrix geometry of this lane (row (lane%8) + 8*bit3, chunk bit = lane/16),
  // four swizzled chunk offsets as for K/V below. With Q_IN_REGS they are loaded once and stay
  // in registers for the whole walk; otherwise re-read per k-step (each warp reads only its
  // own rows, so no barrier is involved either way).
  const int warp_row0 = warp * kRW;
  // (lane_offsets_a's geometry with the tile base and the warp's rows folded in up front:
  // computing it as lane_offsets_a + base measured a worse register allocation, 232 -> 241.)
  u32 q_off[4];
#pragma unroll
  for (int c = 0; c < 4; ++c)
    q_off[c] = sQ + (warp_row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * (Cfg::kCQ * 16) +
               (((2 * c) ^ (lane >> 4) ^ (lane & 7)) << 4);
  auto load_q = [&](u32(&a)[4], int mi, int kk) {
    ldmatrix_x4(a, q_off[kk % 4] + (kk / 4) * 128 + mi * 16 * (Cfg::kCQ * 16));
  };
  constexpr bool kQRegs = Cfg::kQInRegisters;
  u32 qf[kQRegs ? kMT : 1][kQRegs ? Cfg::kKQ : 1][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int kk = 0; kk < Cfg::kKQ; ++kk) load_q(qf[mi][kk], mi, kk);
  }

  // Each thread's accumulator rows: row(mi, hh) = q0 + warp_row0 + mi*16 + g + 8*hh, clamped
  // so score_mod/mask_mod never see an index past the end.
  int q_idx[kMT][2];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + warp_row0 + mi * 16 + g + 8 * hh;
      q_idx[mi][hh] = q < len_q ? q : len_q - 1;
    }
  // The mods' values of those rows (their loads by q, and what follows from them)
  using Split = MmaMods<Mods, Cfg::kHeadDimQK, Cfg::kHeadDimV>;
  ModRows<Split> mod_rows[kMT];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) mod_rows[mi].gather(q_idx[mi], b, h, cap);

  const float sl2 = softmax_log2_scale(Mods::kHasScoreMod, p.scale);
  float o[kMT][Cfg::kDT][4];
  SoftmaxRows rows[kMT];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
#pragma unroll
    for (int dj = 0; dj < Cfg::kDT; ++dj)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mi][dj][i] = 0.f;
    rows[mi].init();
  }

  // Per-lane ldmatrix byte offsets. The swizzle XOR (chunk ^ row%8, row%8 == lane%8 here)
  // only touches the low 3 chunk bits, so chunk 2c+8a -> ((2c ^ x) + 8a): four lane offsets
  // per operand, the rest (a, row block) are immediates.
  u32 k_off[4], v_off[4];
  lane_offsets_b<Cfg::kCQ>(k_off, lane);  // K: B operand of S = Q·Kᵀ (rows = n)
  lane_offsets_a<Cfg::kCV>(v_off, lane);  // V: B operand of P·V with .trans (rows = k)

  int it = 0;
  for (TileCursor<kBN> cur(walk, len_kv); !cur.done(walk); ++it) {
    KvPipeline<kStages>::advance(it, load_kv);  // tile `it` visible to all

    const int start = cur.start;
    const bool is_full = cur.is_full(walk);
    cur.next(walk, len_kv);  // the next tile's block index loads under this tile's MMAs
    ModCols<Split, Cfg::kNT> cols;
    cols.gather(start, len_kv, !is_full, b, cap);  // and the mods' loads by key
    const u32 sKs = sK + (it % kStages) * Cfg::kSmemKBytes;
    const u32 sVs = sV + (it % kStages) * Cfg::kSmemVBytes;

    // ---- S = Q · Kᵀ
    float s[kMT][Cfg::kNT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int j = 0; j < Cfg::kNT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[mi][j][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk) {
      u32 qa[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        if constexpr (kQRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[mi][i] = qf[mi][kQRegs ? kk : 0][i];
        } else {
          load_q(qa[mi], mi, kk);
        }
      }
#pragma unroll
      for (int jp = 0; jp < Cfg::kNT / 2; ++jp) {
        u32 kf[4];
        ldmatrix_x4(kf, sKs + frag_at<Cfg::kCQ>(k_off, jp, kk));
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          mma_16816<E>(s[mi][2 * jp], qa[mi], kf[0], kf[1]);
          mma_16816<E>(s[mi][2 * jp + 1], qa[mi], kf[2], kf[3]);
        }
      }
    }

    // ---- score_mod on every element; mask_mod on partial tiles; bounds on tail tiles
    score_tile<Split, kBN>(s, q_idx, start, t, len_kv, is_full, p.scale, b, h, mod_rows, cols, cap);

    // ---- online softmax (base 2): S becomes P, O is rescaled to the new row max
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) {
      float alpha[2];
      if (rows[mi].step(s[mi], alpha, sl2)) scale_rows(o[mi], alpha);
    }

    // ---- O += P · V, P packed to 16-bit per k-step (A fragment = two adjacent S n-tiles)
#pragma unroll
    for (int kk = 0; kk < Cfg::kKP; ++kk) {
      u32 pa[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) pack_a<E>(pa[mi], s[mi], kk);
#pragma unroll
      for (int jp = 0; jp < Cfg::kDT / 2; ++jp) {
        u32 vf[4];
        ldmatrix_x4_trans(vf, sVs + frag_at<Cfg::kCV>(v_off, kk, jp));
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          mma_16816<E>(o[mi][2 * jp], pa[mi], vf[0], vf[1]);
          mma_16816<E>(o[mi][2 * jp + 1], pa[mi], vf[2], vf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q before O overwrites the Q/O region

  // ---- epilogue: O / l staged in this warp's rows of the Q region, 16-byte global stores;
  // LSE in natural log
  using Staging = SwizzledRows<Cfg::kCV>;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) {
    float inv[2];
    rows[mi].finish(inv);
    const int row0 = warp_row0 + mi * 16 + g;
    stage_rows<E, Staging>(sQ, o[mi], inv, row0, t);
    store_row_stats<Mods>(p, b, h, q0, row0, t, rows[mi], sl2);
  }
  __syncwarp();
  E* og = static_cast<E*>(p.o) + b * p.o_stride_b + h * p.o_stride_h;
  store_rows<kRW, RowV::kChunks, 32, Staging>(og, p.o_stride_m, sQ, warp_row0, q0, len_q, lane);
}

// The kernel on the CTA's sequence (dense: p as is).
template <typename Cfg, typename Mods>
__device__ __forceinline__ void forward_entry(const FaFwdParams& p, const FaCaptures& cap) {
  on_sequence<Cfg>(p, [&](const FaFwdParams& ps) { forward_kernel<Cfg, Mods>(ps, cap); });
}

}  // namespace fa

// Defines the extern "C" kernel `name` for a config and mods struct (single identifiers).
#define FAJIT_DEFINE_FORWARD(name, Config, Mods)                                          \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM) \
      name(const FaFwdParams p, const FaCaptures cap) {                                   \
    fa::forward_entry<Config, Mods>(p, cap);                                              \
  }

#endif  // FAJIT_FORWARD_CUH
