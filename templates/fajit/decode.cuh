// fajit split-KV decoding kernel (mma.sync, sm_80+): attention for short queries (a few
// decoding tokens) over long key ranges, memory-bound, so built to stream K and V once at full
// bandwidth: the query rows of every head of a GQA group share one tile (K/V read once per
// group, not per head), and the KV walk is cut into `splits` parts spread over the grid so
// every SM streams; a second kernel combines the parts.
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ... };                                   // see templates/README.md
//   #include "fajit/decode.cuh"
//   using FaDecCfg = fa::DecodeConfig<fa::bf16_t, 128, 128, 64, 4>;   // tile: fa::default_tile()
//   FAJIT_DEFINE_DECODE(fajit_decode, FaDecCfg, FaMods, 3)
// defines two extern "C" kernels, launched in this order on one stream:
//   fajit_decode          one CTA per (row block, split) x (batch, packed heads): partial O, LSE
//   fajit_decode_combine  one warp per output row: O and LSE from the parts
//
// ---- Config (fa::DecodeConfig<Element, DQK, DV, BLOCK_N, STAGES>) --------------------------
//   DQK, DV   head dims, multiples of 8 from 32 to 256 (HeadRow)
//   BLOCK_N   keys per pipeline tile (32, 64 or 128); STAGES: K/V stages (2..6)
//   BLOCK_M = 64 packed query rows per CTA (4 warps x 16); a warp whose rows are all past the
//   end still loads (all 128 threads issue cp.async) but computes nothing.
//
// ---- Launch (host mirrors these; FaDecodeParams in params.h) ------------------------------
//   rows  = heads_per_cta * len_q;  row_blocks = ceil(rows / 64)
//   decode:  grid (row_blocks * splits, batch * heads_q / heads_per_cta), block 128,
//            dynamic smem kSmemBytes = 2 * (64 * PQK + STAGES * BLOCK_N * (PQK + PV))
//            (PQK, PV: head dims rounded up to 64)
//   combine: grid (ceil(batch * heads_q * len_q / 4)), block 128, no shared memory
//   Preconditions (host-checked): those of forward.cuh, len_q <= mask.q_block (one row of
//   block tables: query block 0), heads_per_cta divides heads_q / heads_kv and is 1 unless
//   mask.row_stride_h == 0, splits >= 1.
//
// ---- Semantics ----------------------------------------------------------------------------
//   Exactly forward.cuh's (flex_attention): packed row r of the CTA's heads is query r % len_q
//   of head h0 + r / len_q; its mods see that (b, h, q, kv). Split s walks tiles
//   [s * per, (s + 1) * per) of the table row (per = ceil(tiles / splits)), partial blocks
//   first as the forward. A row no split sees unmasked gets O = 0, LSE = -inf.
#ifndef FAJIT_DECODE_CUH
#define FAJIT_DECODE_CUH

#include "fajit/attention_tile.cuh"
#include "fajit/block_walk.cuh"
#include "fajit/mma.cuh"
#include "fajit/params.h"
#include "fajit/prelude.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockN_ = 64, int kStages_ = 4>
struct DecodeConfig : AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_> {
  using Element = Element_;
  using Shape = AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_>;
  using RowQK = typename Shape::RowQK;
  using RowV = typename Shape::RowV;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr bool kQInRegisters = kHeadDimQK <= 128;
  static constexpr int kSmemQBytes = kBlockM * RowQK::kRowBytes;
  static constexpr int kSmemKBytes = kBlockN * RowQK::kRowBytes;  // one K stage
  static constexpr int kSmemVBytes = kBlockN * RowV::kRowBytes;   // one V stage
  static constexpr int kSmemBytes = kSmemQBytes + kStages * (kSmemKBytes + kSmemVBytes);
  // combine: one warp per output row
  static constexpr int kCombineWarps = 4;
  static constexpr int kCombineThreads = kCombineWarps * 32;

  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "BLOCK_N must be 32, 64 or 128");
  static_assert(kStages >= 2 && kStages <= 6, "STAGES must be 2 to 6");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

namespace dec {

// Where packed row r of a CTA's tile lives: query head h0 + r / len_q, query r % len_q
// (r clamped to the last real row, so mods never see an index past the end).
struct PackedRow {
  int h, q;
  __device__ __forceinline__ PackedRow(int r, int rows, int h0, int len_q) {
    const int rr = r < rows ? r : rows - 1;
    h = h0 + rr / len_q;
    q = rr - (rr / len_q) * len_q;
  }
};

// Index of output row (b, h, q) among batch x heads_q x len_q.
__device__ __forceinline__ long long out_row(const FaFwdParams& p, int b, int h, int q) {
  return ((long long)b * p.heads_q + h) * p.len_q + q;
}

}  // namespace dec

// ================================ one split of the KV walk ===================================
// p: the CTA's sequence (dp.fwd itself when dense); dp.fwd keeps the launch's layout (the
// longest sequence: grid rows, part rows).
template <typename Cfg, typename Mods>
__device__ __forceinline__ void decode_kernel(const FaDecodeParams& dp, const FaFwdParams& p,
                                              const FaCaptures& cap) {
  using E = typename Cfg::Element;
  using RowQK = typename Cfg::RowQK;
  using RowV = typename Cfg::RowV;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  constexpr int kDV = Cfg::kHeadDimV;

  extern __shared__ __align__(128) unsigned char smem[];
  const LaneCoords lc;
  const int tid = lc.tid, lane = lc.lane, warp = lc.warp, g = lc.g, t = lc.t;
  const FaFwdParams& pm = dp.fwd;
  const int len_q = p.len_q, len_kv = p.len_kv;
  const int packs = p.heads_q / dp.heads_per_cta;  // head packs per batch
  const int b = blockIdx.y / packs, h0 = (blockIdx.y % packs) * dp.heads_per_cta;
  const int hkv = h0 / (p.heads_q / p.heads_kv);
  const int rows = dp.heads_per_cta * len_q;
  const int row_blocks = (dp.heads_per_cta * pm.len_q + kBM - 1) / kBM;
  const int split = blockIdx.x / row_blocks, r0 = (blockIdx.x - split * row_blocks) * kBM;
  allow_dependent_launch();  // the combine grid may take free slots and wait for our parts
  if constexpr (Cfg::kLayout != kDenseLayout)
    if (r0 >= rows) return;  // rows of a shorter sequence than the longest

  constexpr bool kPaged = Cfg::kLayout == kPagedLayout;
  KvTiles<E, kPaged, kBN, RowQK, RowV, kThreads> kv(p, b, hkv);
  const u32 sQ = smem_addr(smem);
  const u32 sK = sQ + Cfg::kSmemQBytes;
  const u32 sV = sK + kStages * Cfg::kSmemKBytes;

  // ---- this split's share of the table row of query block 0 (partial tiles, then full)
  const BlockWalk<kBN> walk(p.mask, b, h0, 0);
  const int per = (walk.n_tiles + dp.splits - 1) / dp.splits;
  const int it0 = split * per;
  const int it_end = min(walk.n_tiles, it0 + per);
  // Tiles it0 .. it_end - 1 (those inside len_kv): a load cursor kStages - 1 tiles ahead of
  // the compute cursor, each moved right after its use (forward.cuh).
  // Paged, the next tile's page ids load as soon as the cursor reaches it.
  TileCursor<kBN> ld(walk, len_kv, it0);
  if (!ld.done(walk, it_end)) kv.prefetch(ld.start, len_kv, tid);
  auto load_kv = [&](int s) {
    if (ld.done(walk, it_end)) return;
    kv.load(sK + s * Cfg::kSmemKBytes, sV + s * Cfg::kSmemVBytes, ld.start, len_kv, tid);
    ld.next(walk, len_kv);
    if (!ld.done(walk, it_end)) kv.prefetch(ld.start, len_kv, tid);
  };

  // ---- prologue: the packed Q rows (gathered over the heads), then STAGES-1 K/V tiles
  const E* qg = static_cast<const E*>(p.q) + b * p.q_stride_b;
  load_rows_async<kBM, RowQK, kThreads>(sQ, tid, [&](int r, bool& valid) {
    valid = r0 + r < rows;
    const dec::PackedRow pr(r0 + r, rows, h0, len_q);
    return qg + pr.h * p.q_stride_h + (long long)pr.q * p.q_stride_m;
  });
  cp_async_commit();
  KvPipeline<kStages>::prime(load_kv);

  // ---- this warp's 16 packed rows; a warp past the last row only loads
  const int warp_row0 = warp * 16;
  const bool active = r0 + warp_row0 < rows;  // warp-uniform
  u32 q_off[4];
  lane_offsets_a<Cfg::kCQ>(q_off, lane);
  constexpr bool kQRegs = Cfg::kQInRegisters;
  u32 qf[kQRegs ? Cfg::kKQ : 1][4];
  if constexpr (kQRegs) {
    if (active) {
#pragma unroll
      for (int kk = 0; kk < Cfg::kKQ; ++kk) ldmatrix_x4(qf[kk], sQ + frag_at<Cfg::kCQ>(q_off, warp, kk));
    }
  }
  int q_idx[1][2], h_idx[1][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const dec::PackedRow pr(r0 + warp_row0 + g + 8 * hh, rows, h0, len_q);
    q_idx[0][hh] = pr.q;
    h_idx[0][hh] = pr.h;
  }
  // The mods split (MmaMods: loads by q and head once, by kv a tile ahead of S, spread over the
  // warp) up to head dim 64; above, the plain calls per element. H200, B4 Hq32 Hkv8, 32k keys, a
  // mask by key (keep[kv]) with and without a bias by key: d64 0.99x / 1.45x at Lq 1, 1.02x /
  // 1.27x at Lq 16; d128 0.987x / 0.962x at Lq 1, 1.03x / 1.05x at Lq 16 (2026-11-28).
  using Split = MmaMods<Mods, Cfg::kHeadDimQK, Cfg::kHeadDimV>;
  ModRows<Split> mod_rows[1];  // the mods' values of those rows (their loads by q and head)
  if (active) mod_rows[0].gather(q_idx[0], b, h_idx[0], cap);

  const float sl2 = softmax_log2_scale(Mods::kHasScoreMod, p.scale);
  float o[Cfg::kDT][4];
  zero_frags(o);
  SoftmaxRows srow;
  srow.init();

  u32 k_off[4], v_off[4];
  lane_offsets_b<Cfg::kCQ>(k_off, lane);
  lane_offsets_a<Cfg::kCV>(v_off, lane);

  int it = 0;
  for (TileCursor<kBN> cur(walk, len_kv, it0); !cur.done(walk, it_end); ++it) {
    KvPipeline<kStages>::advance(it, load_kv);  // tile `it` visible to all

    const int start = cur.start;
    const bool is_full = cur.is_full(walk);
    cur.next(walk, len_kv);  // the next tile's block index loads under this tile's MMAs
    if (!active) continue;
    ModCols<Split, Cfg::kNT> cols;
    cols.gather(start, len_kv, !is_full, b, cap);  // the mods' loads by key, ahead of S
    const u32 sKs = sK + (it % kStages) * Cfg::kSmemKBytes;
    const u32 sVs = sV + (it % kStages) * Cfg::kSmemVBytes;

    // ---- S = Q · Kᵀ (16 packed rows x BLOCK_N keys)
    float s[1][Cfg::kNT][4];
#pragma unroll
    for (int j = 0; j < Cfg::kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[0][j][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk) {
      u32 qa[4];
      if constexpr (kQRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) qa[i] = qf[kQRegs ? kk : 0][i];
      } else {
        ldmatrix_x4(qa, sQ + frag_at<Cfg::kCQ>(q_off, warp, kk));
      }
#pragma unroll
      for (int jp = 0; jp < Cfg::kNT / 2; ++jp) {
        u32 kf[4];
        ldmatrix_x4(kf, sKs + frag_at<Cfg::kCQ>(k_off, jp, kk));
        mma_16816<E>(s[0][2 * jp], qa, kf[0], kf[1]);
        mma_16816<E>(s[0][2 * jp + 1], qa, kf[2], kf[3]);
      }
    }

    // ---- mods (each row with its own head), online softmax, O += P · V
    score_tile<Split, kBN>(s, q_idx, start, t, len_kv, is_full, p.scale, b, h_idx, mod_rows, cols, cap);
    float alpha[2];
    if (srow.step(s[0], alpha, sl2)) scale_rows(o, alpha);
#pragma unroll
    for (int kk = 0; kk < Cfg::kKP; ++kk) {
      u32 pa[4];
      pack_a<E>(pa, s[0], kk);
#pragma unroll
      for (int jp = 0; jp < Cfg::kDT / 2; ++jp) {
        u32 vf[4];
        ldmatrix_x4_trans(vf, sVs + frag_at<Cfg::kCV>(v_off, kk, jp));
        mma_16816<E>(o[2 * jp], pa, vf[0], vf[1]);
        mma_16816<E>(o[2 * jp + 1], pa, vf[2], vf[3]);
      }
    }
  }
  cp_async_wait<0>();
  if (!active) return;

  // ---- this split's part: O / l (fp32) and the LSE of each real row
  float inv[2];
  srow.finish(inv);
  const long long part_rows = (long long)pm.batch * pm.heads_q * pm.len_q;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = r0 + warp_row0 + g + 8 * hh;
    if (r >= rows) continue;
    const long long part = split * part_rows + dec::out_row(pm, b, h_idx[0][hh], q_idx[0][hh]);
    float* dst = dp.o_part + part * kDV + 2 * t;
#pragma unroll
    for (int dj = 0; dj < Cfg::kDT; ++dj)
      if (Cfg::RowV::kUsed == Cfg::RowV::kChunks || dj * 8 < kDV)  // not the zero tail chunk
        st_global_v2_f32(dst + dj * 8, o[dj][2 * hh] * inv[hh], o[dj][2 * hh + 1] * inv[hh]);
    if (t == 0) dp.m_part[part] = srow.m[hh], dp.l_part[part] = srow.log2_sum(hh, sl2);
    if constexpr (kRowMax)
      if (t == 0 && dp.x_part != nullptr) dp.x_part[part] = srow.top[hh];
  }
}

// ================================ combine =====================================================
// Output row R = (b, h, q): with M the largest part max, part s weighs w_s = exp2((m_s - M)·sl2
// + l_s) (its row sum relative to M's reference), O = sum_s w_s O_s / sum_s w_s and LSE =
// (M·sl2 + log2 sum_s w_s)·ln 2, in the element type (O = 0, LSE = -inf where no part saw an
// unmasked score; NaN where a part saw a NaN score); with kRowMax the largest of the parts'
// largest scores (as SoftmaxRows::max_score). One warp per row, lanes over column pairs.
template <typename Cfg, typename Mods>
__device__ __forceinline__ void decode_combine_kernel(const FaDecodeParams& dp) {
  using E = typename Cfg::Element;
  constexpr int kDV = Cfg::kHeadDimV;
  const FaFwdParams& pm = dp.fwd;  // the launch's layout (part rows)
  const LaneCoords lc;
  const int lane = lc.lane;
  const long long part_rows = (long long)pm.batch * pm.heads_q * pm.len_q;
  const long long row = (long long)blockIdx.x * Cfg::kCombineWarps + lc.warp;
  if (row >= part_rows) return;
  const int q = static_cast<int>(row % pm.len_q);
  const int h = static_cast<int>((row / pm.len_q) % pm.heads_q);
  const int b = static_cast<int>(row / ((long long)pm.len_q * pm.heads_q));
  FaFwdParams p = pm;  // where the row's output goes: its sequence's rows when ragged
  if constexpr (Cfg::kLayout != kDenseLayout) {
    rebase_sequence<E>(p, b);
    if (q >= p.len_q) return;
  }
  const float sl2 = softmax_log2_scale(Mods::kHasScoreMod, pm.scale);
  auto part = [&](int s) { return s * part_rows + row; };
  wait_for_prior_grids();  // the parts: written by the decoding grid, which may still run

  // The lanes take the parts s = lane, lane + 32, ... (their loads in parallel, not one
  // dependent load per part): M, and whether any part saw a NaN score.
  float m = -INFINITY, top = -INFINITY;
  bool nan_part = false;  // a part with a NaN score: the row is NaN (out and LSE), as softmax gives
  for (int s = lane; s < dp.splits; s += 32) {
    const float ls = dp.l_part[part(s)];
    m = fmaxf(m, dp.m_part[part(s)]);
    if constexpr (kRowMax)
      if (dp.x_part != nullptr) top = fmaxf(top, dp.x_part[part(s)]);
    nan_part |= ls != ls;
  }
  m = warp_max(m);
  nan_part = __any_sync(0xffffffffu, nan_part);
  auto weight = [&](int s) {  // 0 for a part past the last or that saw nothing (m_s = -inf)
    if (s >= dp.splits) return 0.f;
    const float ms = dp.m_part[part(s)];
    return ms == -INFINITY ? 0.f : ex2(fmaf(ms - m, sl2, dp.l_part[part(s)]));
  };

  // Each lane's column pairs 2 lane + 64 i; 32 parts' weights at a time, one per lane, handed
  // to the others by shuffles, and the parts' rows read a few at a time. Each lane also sums
  // its own parts' weights (parts lane, lane + 32, ...), computed once for both uses.
  constexpr int kPairs = (kDV + 63) / 64;
  float acc[kPairs][2];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) acc[i][0] = acc[i][1] = 0.f;
  float sum = 0.f;
  if (m != -INFINITY)  // warp-uniform (m is the warp's max)
    for (int s0 = 0; s0 < dp.splits; s0 += 32) {
      const float w_lane = weight(s0 + lane);
      sum += w_lane;
      const int n = min(32, dp.splits - s0);
#pragma unroll 4
      for (int j = 0; j < n; ++j) {
        const float w = __shfl_sync(0xffffffffu, w_lane, j);
        const float* src = dp.o_part + part(s0 + j) * kDV;
#pragma unroll
        for (int i = 0; i < kPairs; ++i) {
          const int c = 2 * lane + 64 * i;
          if (c < kDV) {
            const f32x2 v = ld_global_v2_f32(src + c);
            acc[i][0] = fmaf(w, v.x, acc[i][0]);
            acc[i][1] = fmaf(w, v.y, acc[i][1]);
          }
        }
      }
    }
  sum = warp_sum(sum);
  if (nan_part) sum = __int_as_float(0x7fc00000);  // quiet NaN
  const float inv = !(sum <= 0.f) ? 1.f / sum : 0.f;
  E* og = static_cast<E*>(p.o) + b * p.o_stride_b + h * p.o_stride_h + (long long)q * p.o_stride_m;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int c = 2 * lane + 64 * i;
    if (c < kDV) st_global_b32(og + c, pack2<E>(acc[i][0] * inv, acc[i][1] * inv));
  }
  if (p.lse != nullptr && lane == 0)
    p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] =
        !(sum <= 0.f) ? SoftmaxRows::natural_lse(m, lg2(sum), sl2) : -INFINITY;
  if constexpr (kRowMax) {
    top = warp_max(top);
    if (p.max_scores != nullptr && lane == 0)
      p.max_scores[b * p.max_stride_b + h * p.max_stride_h + q] =
          SoftmaxRows::natural_max(top, nan_part, natural_scale(Mods::kHasScoreMod, pm.scale));
  }
}

// The kernel for a layout: dense as is; ragged / paged on the CTA's sequence.
template <typename Cfg, typename Mods>
__device__ __forceinline__ void decode_entry(const FaDecodeParams& dp, const FaCaptures& cap) {
  if constexpr (Cfg::kLayout == kDenseLayout) {
    decode_kernel<Cfg, Mods>(dp, dp.fwd, cap);
  } else {
    FaFwdParams seq = dp.fwd;
    rebase_sequence<typename Cfg::Element>(seq, blockIdx.y / (dp.fwd.heads_q / dp.heads_per_cta));
    decode_kernel<Cfg, Mods>(dp, seq, cap);
  }
}

}  // namespace fa

// Defines the extern "C" kernels name and name##_combine (single identifiers); min_ctas: the
// CTAs per SM the host's split count assumes (KernelSpec::decode_ctas_per_sm), guaranteed here.
#define FAJIT_DEFINE_DECODE(name, Config, Mods, min_ctas)                  \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, min_ctas) \
      name(const FaDecodeParams p, const FaCaptures cap) {                 \
    fa::decode_entry<Config, Mods>(p, cap);                                \
  }                                                                        \
  extern "C" __global__ void __launch_bounds__(Config::kCombineThreads)    \
      name##_combine(const FaDecodeParams p) {                             \
    fa::decode_combine_kernel<Config, Mods>(p);                            \
  }

#endif  // FAJIT_DECODE_CUH
