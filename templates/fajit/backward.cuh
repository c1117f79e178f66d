// fajit backward attention kernels (FlashAttention-2 loop order, mma.sync, sm_80+).
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ...forward members...; kScoreGrad; score_grad(...) };   // see below
//   #include "fajit/backward.cuh"
//   using FaBwdCfg = fa::BwdConfig<fa::bf16_t, 128, 128, 64, 8>;   // tile: fa::default_tile()
//   FAJIT_DEFINE_BACKWARD(fajit_bwd, FaBwdCfg, FaMods)
// defines three extern "C" kernels, launched in this order on one stream:
//   fajit_bwd_pre   delta = rowsum(dO * O) - dLSE (dLSE dropped on a row with no key); zeroes
//                   dq_accum
//   fajit_bwd_dkdv  one CTA per (KV tile, batch x KV head[, part]): dK, dV; dQ partials into
//                   dq_accum
//   fajit_bwd_dq    dQ = scale * dq_accum, in the element type
// The host launches dK/dV and dQ as programmatic dependents (rt::launch_dependent): each grid
// lets the next start at once (allow_dependent_launch), and a thread waits for the grid before
// (wait_for_prior_grids) where it first needs what that grid writes: the dK/dV kernel's K/V
// loads and set-up overlap the preprocess, and each kernel's launch the previous one's end.
//
// ---- What FaMods adds for the backward ----------------------------------------------------
//   static constexpr bool kScoreGrad;   false: dS = dT (no score_mod, or one whose derivative
//                                       is exactly dT and which reads no float buffer, e.g.
//                                       ALiBi from the head count); codegen decides from the
//                                       fa.score_grad the differentiation pass made
//   static __device__ float score_grad(float score, int b, int h, int q, int kv, float dt,
//                                      const FaCaptures& cap, const FaGradBuffers& grads);
//     returns dS = dt * d(score_mod)/d(score) at `score` (already scaled) and adds
//     dt * d(score_mod)/d(buf[idx]) into grads.buffers[slot] for each buffer read it has.
//   static constexpr bool kMaskReadsBuffers;   whether mask_mod reads a captured buffer (a
//                                       document mask): a hint for backward_sm90.cuh's walk
//
// ---- Algorithm (per CTA: BLOCK_N keys of one KV head; notation of KERNELS.md) -------------
// K, V tiles stay in shared memory, dK, dV accumulate in registers. For each query head of the
// GQA group and each query tile the transposed block tables list (partial tiles, then full):
//   Sᵀ = K·Qᵀ (rows = keys, so P and dS land in registers as A operands), mods, then
//   Pᵀ = exp(Tᵀ·sn - LSE);  dPᵀ = V·dOᵀ;  dTᵀ = Pᵀ∘(dPᵀ - Δ);  dSᵀ = grad(dTᵀ)
//   dV += Pᵀ·dO;  dK += dSᵀ·Q;  dSᵀ to shared memory; dQ += dS·K with fp32 reductions.
// dS is zero wherever P is (masked, out of range, underflow) and score_grad is not called
// there: a branch, never a product, so a score_mod whose derivative is inf/NaN where it is
// masked leaks NaN neither into dS nor into a buffer gradient. Without score_grad dS = dT is a
// product, 0 where P is: dP is finite and so is Δ (the preprocess drops dLSE on a row with no
// key).
// At the end dK·scale and dV are stored (zero for a KV tile no query sees).
// Wide heads (DQK + DV above 256 columns, e.g. 192/128, 256/256): dK and dV of a warp's keys do
// not fit in registers together, so the dK/dV grid has two parts (kDkDvParts, blockIdx.z): part 0
// computes Sᵀ, Pᵀ and dV only; part 1 everything else (dPᵀ, dSᵀ, dK, dQ, buffer gradients).
// Sᵀ is computed twice: 6 of the 5 matmuls' work instead of 5, and twice the CTAs.
//
// ---- Config (fa::BwdConfig<Element, DQK, DV, BLOCK_M, WARPS, STAGES>) ---------------------
//   BLOCK_M   query rows per step (64 or 128): columns of Sᵀ
//   WARPS     warps per CTA (4 or 8); each owns 16 keys, so BLOCK_N = 16 * WARPS
//   STAGES    query-tile stages (Q, dO, LSE, Δ) of the cp.async pipeline (2)
// Sparse block sizes must be multiples of BLOCK_M (q_block) and BLOCK_N (kv_block).
//
// ---- Launch (host mirrors these) -----------------------------------------------------------
//   pre:   grid (ceil(len_q / kPreRows), batch * heads_q), block kPreThreads
//   dkdv:  grid (ceil(len_kv / BLOCK_N), batch * heads_kv, kDkDvParts), block kThreads,
//          smem kSmemBytes
//   dq:    grid (ceil(len_q / kDqRows), batch * heads_q), block kPreThreads
//   Arguments: (const FaBwdParams p, const FaCaptures cap, const FaGradBuffers grads).
#ifndef FAJIT_BACKWARD_CUH
#define FAJIT_BACKWARD_CUH

#include "fajit/attention_tile.cuh"
#include "fajit/block_walk.cuh"
#include "fajit/mma.cuh"
#include "fajit/params.h"
#include "fajit/prelude.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockM_, int kWarps_, int kStages_ = 2,
          bool kDeterministic_ = false>
struct BwdConfig : AttentionTileShape<16 * kWarps_, kHeadDimQK_, kHeadDimV_> {
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kBlockN = 16 * kWarps;
  static constexpr int kStages = kStages_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kThreads = kWarps * 32;

  using Shape = AttentionTileShape<16 * kWarps_, kHeadDimQK_, kHeadDimV_>;
  using RowQK = typename Shape::RowQK;
  using RowV = typename Shape::RowV;
  static constexpr int kQT = kBlockM / 8;         // 8-column n-tiles of Sᵀ (query columns)
  static constexpr int kKV = RowV::kSteps;        // k-steps of V·dOᵀ
  static constexpr int kDQKTiles = RowQK::kUsed;  // 8-column n-tiles of dK (and of dQ)
  static constexpr int kMK = kBlockM / 16;        // k-steps over queries (dV, dK)
  static constexpr int kCM = kBlockM / 8;         // 16-byte chunks per dSᵀ row
  // dQ tile (BLOCK_M x DQK) split over the warps: 16-row m-tiles x kDqSplit column parts.
  static constexpr int kDqSplit = kWarps / (kBlockM / 16) > 0 ? kWarps / (kBlockM / 16) : 1;
  static constexpr int kDqCols = RowQK::kUsed * 8 / kDqSplit;
  // dK and dV of a warp's 16 keys in registers together up to 256 columns; wider heads split
  // the dK/dV grid in a dV part and a dK (+ dQ) part, and dQ goes in 64-column chunks.
  static constexpr int kDkDvParts = RowQK::kUsed + RowV::kUsed > 32 ? 2 : 1;
  static constexpr int kDqChunkTiles = kDkDvParts == 2 && kDqCols > 64 ? 8 : kDqCols / 8;

  static constexpr int kSmemKBytes = kBlockN * RowQK::kRowBytes;
  static constexpr int kSmemVBytes = kBlockN * RowV::kRowBytes;
  static constexpr int kSmemQBytes = kBlockM * RowQK::kRowBytes;  // one stage
  static constexpr int kSmemDoBytes = kBlockM * RowV::kRowBytes;  // one stage
  static constexpr int kSmemRowBytes = kBlockM * 4;               // LSE or Δ of one stage
  static constexpr int kSmemStageBytes = kSmemQBytes + kSmemDoBytes + 2 * kSmemRowBytes;
  static constexpr int kSmemDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kSmemBytes = kSmemKBytes + kSmemVBytes + kStages * kSmemStageBytes + kSmemDsBytes;

  // Deterministic dQ kernel: BLOCK_M query rows per CTA (16 per warp), keys in tiles of 64
  // (kv_block % BLOCK_N == 0 implies kv_block % 64 == 0), 2 K/V stages.
  static constexpr int kDetWarps = kBlockM / 16;
  static constexpr int kDetThreads = kDetWarps * 32;
  static constexpr int kDetKvTile = 64;
  static constexpr int kDetSmemBytes = (kBlockM + 2 * kDetKvTile) * (RowQK::kRowBytes + RowV::kRowBytes);

  // Preprocess / dQ conversion: kPreThreads threads, one 16-byte chunk of a row each, in
  // groups of a power of two lanes per row (lanes past the row's chunks idle).
  static constexpr int kPreThreads = 128;
  static constexpr int kPreLanes = pow2_at_least(RowV::kChunks);
  static constexpr int kDqLanes = pow2_at_least(RowQK::kChunks);
  static constexpr int kPreRows = kPreThreads / kPreLanes;
  static constexpr int kDqRows = kPreThreads / kDqLanes;

  static_assert(kHeadDimQK % 8 == 0 && kHeadDimQK >= 32 && kHeadDimQK <= 256,
                "DQK must be a multiple of 8 from 32 to 256");
  static_assert(kHeadDimV % 8 == 0 && kHeadDimV >= 32 && kHeadDimV <= 256,
                "DV must be a multiple of 8 from 32 to 256");
  static_assert(kBlockM == 64 || kBlockM == 128, "BLOCK_M must be 64 or 128");
  static_assert(kWarps == 4 || kWarps == 8, "WARPS must be 4 or 8");
  static_assert(kWarps % (kBlockM / 16) == 0 || (kBlockM / 16) % kWarps == 0,
                "the dQ tile must split evenly over the warps");
  static_assert((kBlockM / 16) <= kWarps, "every warp owns at least one 16-row m-tile of dQ");
  static_assert(RowQK::kUsed % (2 * kDqSplit) == 0, "dQ column parts must be whole 16-column pairs");
  static_assert(kStages == 2, "STAGES must be 2");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
  static_assert(kDetSmemBytes <= 227 * 1024,
                "deterministic dQ tile needs more than 227 KiB of shared memory");
};

namespace bwd {

// The first delta / dq_accum row of query head hq of sequence b (FaBwdParams::delta_stride_*):
// row q of it is this + q, of Dqk floats in dq_accum.
__device__ __forceinline__ long long stat_row(const FaBwdParams& p, int b, int hq) {
  return b * p.delta_stride_b + hq * p.delta_stride_h;
}
// Row (b, h) offsets of a [B, H, L, D]-strided tensor.
template <typename E>
__device__ __forceinline__ const E* row_base(const void* p, long long sb, long long sh, int b, int h) {
  return static_cast<const E*>(p) + b * sb + h * sh;
}

// acc[kNT][4] += A(16 x 16k, fragments from `a_tile` rows a_row0..) · B where B's n = the rows
// of b_tile (B = b_tileᵀ): C = A·Bᵀ, both operands K-contiguous (S = Q·Kᵀ shape).
template <typename E, int kNT, int kKSteps, int kChunksA, int kChunksB>
__device__ __forceinline__ void mma_abt(float (&acc)[kNT][4], u32 a_tile, int a_rb, u32 b_tile,
                                        const u32 (&a_off)[4], const u32 (&b_off)[4]) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    u32 a[4];
    ldmatrix_x4(a, a_tile + frag_at<kChunksA>(a_off, a_rb, kk));
#pragma unroll
    for (int jp = 0; jp < kNT / 2; ++jp) {
      u32 bf[4];
      ldmatrix_x4(bf, b_tile + frag_at<kChunksB>(b_off, jp, kk));
      mma_16816<E>(acc[2 * jp], a, bf[0], bf[1]);
      mma_16816<E>(acc[2 * jp + 1], a, bf[2], bf[3]);
    }
  }
}

// acc[kNT][4] += A · B with A in registers (kKSteps packed fragments) and B (rows = k,
// n contiguous) from b_tile, loaded with ldmatrix.trans (O += P·V shape).
template <typename E, int kNT, int kKSteps, int kChunksB>
__device__ __forceinline__ void mma_rb(float (&acc)[kNT][4], const u32 (&a)[kKSteps][4], u32 b_tile,
                                       const u32 (&bt_off)[4]) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
    for (int jp = 0; jp < kNT / 2; ++jp) {
      u32 bf[4];
      ldmatrix_x4_trans(bf, b_tile + frag_at<kChunksB>(bt_off, kk, jp));
      mma_16816<E>(acc[2 * jp], a[kk], bf[0], bf[1]);
      mma_16816<E>(acc[2 * jp + 1], a[kk], bf[2], bf[3]);
    }
}

// The softmax statistics the backward needs of query row q of (b, hq): the LSE in natural units
// (+inf for a row with no key or past len_q, so P = 0 there) and Δ (0 past len_q).
struct RowStats {
  float lse, delta;
};
__device__ __forceinline__ RowStats row_stats(const FaBwdParams& p, int b, int hq, int q) {
  if (q >= p.len_q) return {INFINITY, 0.f};
  const float lse = p.lse[b * p.lse_stride_b + hq * p.lse_stride_h + q];
  return {lse == -INFINITY ? INFINITY : lse, p.delta[stat_row(p, b, hq) + q]};
}
// P = exp(x·sn - LSE) of one element, as exp2(fma(x, sn, -LSE)·log2e): the difference is
// rounded once, so P keeps its precision at any |LSE| (x·sl2 - LSE·log2e did not: past
// |LSE| ~ 2^17 the rounding of LSE·log2e alone moved P by more than the gradients' tolerance,
// and scores of 3e7 moved it by a factor of 4). 0 for a query with no key or past len_q
// (LSE = +inf) whatever its score is: a padded row's score may be NaN (0/0 of a zero Q row)
// and must reach neither dK/dV nor a buffer gradient. Without a score_mod (kChecked false) x is
// q·k or -inf (masked), finite for finite inputs (a zero Q row scores 0), and exp2(x·sn - inf)
// is 0 by itself: the test would cost two instructions an element for nothing.
template <bool kChecked = true>
__device__ __forceinline__ float prob(float x, float sn, float lse) {
  if constexpr (!kChecked) return ex2(fmaf(x, sn, -lse) * kLog2e);
  return lse == INFINITY ? 0.f : ex2(fmaf(x, sn, -lse) * kLog2e);
}
// Rows q0..q0+kRows-1 of them into shared memory (fp32: LSE at s_lse, Δ at s_delta) by
// kThreads threads (`tid` among them); plain stores (a row may not fill a 16-byte chunk).
template <int kRows, int kThreads>
__device__ __forceinline__ void stage_row_stats(u32 s_lse, u32 s_delta, const FaBwdParams& p, int b, int hq,
                                                int q0, int tid) {
  for (int r = tid; r < kRows; r += kThreads) {
    const RowStats st = row_stats(p, b, hq, q0 + r);
    st_shared_f32(s_lse + r * 4, st.lse);
    st_shared_f32(s_delta + r * 4, st.delta);
  }
}

// ---- the element-wise middle of a transposed tile (shared by every dK/dV kernel) ------------
// A thread holds two key rows of Sᵀ (rows = keys, columns = queries, the m16n8 C layout): key
// kv_row[hh] (clamped to kv_c[hh] for the mods) for row half hh, query q0 + 8j + 2t + i%2 for
// element [j][i].
struct KeyRows {
  int kv_row[2], kv_c[2];
  __device__ __forceinline__ KeyRows(int first_row, int len_kv) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      kv_row[hh] = first_row + 8 * hh;
      kv_c[hh] = kv_row[hh] < len_kv ? kv_row[hh] : len_kv - 1;
    }
  }
};

// A kv-linear score_mod whose rate does not read q (KvLinear, !kScoreKvRateByQ: ALiBi's slope by
// head) on a transposed tile: query column q0 + 8j + 2t + c of key row kv gets the bias
// a·(kv − q) as fmaf(−a, 8j, r[hh][c]), r = a·(kv − q0 − 2t − c), as the forward's
// kv_linear_terms. `make` is false where the plain form must run: a rate not kv_linear_rate_ok
// over the tile's 8·kQT queries (large, inf or NaN: the reference's ±inf and NaN), or a tile whose
// queries cross len_q (the mods see the last query there, clamped). Warp-uniform: one vote.
struct KeyLinear {
  float na;
  float r[2][2];
  template <typename Mods, int kQT>
  __device__ __forceinline__ bool make(const KeyRows& kr, int q0, int t, int len_q, int b, int h,
                                       const FaCaptures& cap) {
    const float a = Mods::score_kv_rate(b, h, min(q0, len_q - 1), cap);
    na = -a;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int c = 0; c < 2; ++c) r[hh][c] = a * static_cast<float>(kr.kv_c[hh] - (q0 + 2 * t + c));
    return __all_sync(0xffffffffu, kv_linear_rate_ok<kQT>(a) && q0 + 8 * kQT <= len_q);
  }
  __device__ __forceinline__ float score(float x, float scale, int j, int c, int hh) const {
    return fmaf(x, scale, fmaf(na, static_cast<float>(8 * j), r[hh][c]));
  }
};
template <typename Mods, bool = KvLinear<Mods>::value>
struct KeyLinearOf {
  static constexpr bool value = false;
};
template <typename Mods>
struct KeyLinearOf<Mods, true> {
  static constexpr bool value = !Mods::kScoreKvRateByQ;
};

// The mods' split parts on a transposed tile (the Hopper dK/dV kernel; SplitMods): the column
// values (by kv: codegen's *_col, a document id by kv) of a thread's two key rows, once per
// CTA, and the row values (by q: *_row, a document id by q) of a tile's 8·kQT query columns,
// spread over the warp (ModSpread) and gathered while Sᵀ runs.
template <typename Mods>
struct ModKeys {
  typename Mods::ScoreCol score[2];
  typename Mods::MaskCol mask[2];
  __device__ __forceinline__ ModKeys(const KeyRows& kr, int b, const FaCaptures& cap) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if constexpr (Mods::kHasScoreMod) score[hh] = Mods::score_col(b, kr.kv_c[hh], cap);
      if constexpr (Mods::kHasMaskMod) mask[hh] = Mods::mask_col(b, kr.kv_c[hh], cap);
    }
  }
};
template <typename Mods, int kQT>
struct ModQueries : ModSpread<Mods, typename Mods::ScoreRow, typename Mods::MaskRow, kQT> {
  __device__ __forceinline__ void gather(int q0, int len_q, int b, int hq, const FaCaptures& cap) {
    if constexpr (Mods::kHasScoreMod)
      this->score.gather(q0, len_q, [&](int q) { return Mods::score_row(b, hq, q, cap); });
    if constexpr (Mods::kHasMaskMod)
      this->mask.gather(q0, len_q, [&](int q) { return Mods::mask_row(b, hq, q, cap); });
  }
};

// Sᵀ (q·k, unscaled) -> Pᵀ = exp(mod(s)·sn - LSE) in place (prob); sc keeps the scores
// score_mod saw when the backward needs them (score_grad): q·k · scale rounded, where the
// forward may have fused the product into the score's first add (codegen's plain `score + x`).
// lse(j, col): the LSE of columns col, col + 1 (n-tile j), +inf for a query with no key or past
// len_q (P = 0 there). The mods per element are the caller's: mod(x, q, hh, at) -> the modded
// score of key row hh and query q, with at = cols_at(j, c), what the caller gathered of the
// element's query column (n-tile j, column c of the pair), if anything. Callers run mask_mod on
// every tile, straight-line (a full block's is_full keeps every score, inside `mod`): a choice
// per element was if-converted into predicated code that issued the mask on every tile anyway,
// with the captures loaded per element (896 instructions a tile at d64 for a document mask), and
// a branch per tile spilled (bench/RESULTS.md, sixteenth session). Key rows past len_kv (only
// when key_tail: the CTA's keys cross the end) get P = 0 in a pass of their own.
// With kLinear the score_mod is kv-linear with a rate that does not read q (KeyLinear below): x
// reaches `mod` as score + rate·(kv − q) already, by its FMAs, and `mod` runs mask_mod alone.
template <typename Mods, bool kLinear = false, int kQT, int kSC, typename Lse, typename ColsAt, typename Mod>
__device__ __forceinline__ void probs_t(float (&s)[kQT][4], float (&sc)[kSC][4], const KeyRows& kr, int q0,
                                        int t, int len_q, int len_kv, bool key_tail, float scale, float sn,
                                        Lse&& lse, ColsAt&& cols_at, Mod&& mod,
                                        const KeyLinear* linear = nullptr) {
#pragma unroll
  for (int j = 0; j < kQT; ++j) {
    const int col0 = 8 * j + 2 * t;
    const f32x2 l2 = lse(j, col0);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int q = q0 + col0 + c < len_q ? q0 + col0 + c : len_q - 1;
      const auto at = cols_at(j, c);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i = 2 * hh + c;
        if constexpr (Mods::kScoreGrad) sc[j][i] = s[j][i] * scale;
        float x = s[j][i];
        if constexpr (kLinear) x = linear->score(x, scale, j, c, hh);
        s[j][i] = prob<Mods::kHasScoreMod>(mod(x, q, hh, at), sn, c ? l2.y : l2.x);
      }
    }
  }
  if (key_tail) {
#pragma unroll
    for (int j = 0; j < kQT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (kr.kv_row[i >> 1] >= len_kv) s[j][i] = 0.f;
  }
}

// dPᵀ -> dSᵀ = grad(Pᵀ∘(dPᵀ - Δ)) in place, zero where P is: masked, out-of-range and
// underflowed elements reach neither dS nor a buffer gradient (score_grad's reductions),
// whatever the derivative is there — a branch, never a product (with score_grad; without it dS
// is dT, a product: dP and Δ are finite, so 0 where P is). delta(j, col): Δ of columns col,
// col + 1 (n-tile j).
template <typename Mods, int kQT, int kSC, typename Delta>
__device__ __forceinline__ void dscores_t(float (&dp)[kQT][4], const float (&pt)[kQT][4],
                                          const float (&sc)[kSC][4], const KeyRows& kr, int q0, int t,
                                          int len_q, int b, int hq, const FaCaptures& cap,
                                          const FaGradBuffers& grads, Delta&& delta) {
#pragma unroll
  for (int j = 0; j < kQT; ++j) {
    const int col0 = 8 * j + 2 * t;
    const f32x2 dl = delta(j, col0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float dt = pt[j][i] * (dp[j][i] - ((i & 1) ? dl.y : dl.x));
      if constexpr (!Mods::kScoreGrad) {
        dp[j][i] = dt;  // dS is dT, 0 where P is (dP and Δ are finite: a product suffices)
      } else {
        float ds = 0.f;  // score_grad only where P is not 0: a branch
        if (pt[j][i] != 0.f) {
          const int col = col0 + (i & 1);
          const int q = q0 + col < len_q ? q0 + col : len_q - 1;
          ds = Mods::score_grad(sc[j][i], b, hq, q, kr.kv_c[i >> 1], dt, cap, grads);
        }
        dp[j][i] = ds;
      }
    }
  }
}

// ---- the element-wise middle of a tile with rows = queries (the deterministic dQ kernel, the
// wide-head Hopper dK/dV kernel): a thread holds query rows q_idx[hh] (clamped to len_q - 1;
// their LSE and Δ) and keys start + 8j + 2t + i%2 of kTileN from `start`.

// S (q·k, unscaled) -> P = exp(mod(s)·sn - LSE) in place (score_tile: mods, mask_mod on a partial
// block, -inf past len_kv); sc keeps the scores score_mod saw when score_grad needs them.
template <typename Mods, int kTileN, int kNT, int kSC>
__device__ __forceinline__ void probs_rows(float (&s)[kNT][4], float (&sc)[kSC][4], const int (&q_idx)[2],
                                           const float (&lse)[2], int start, int t, int len_kv, bool is_full,
                                           float scale, float sn, int b, int h, const FaCaptures& cap) {
  if constexpr (Mods::kScoreGrad) {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) sc[j][i] = s[j][i] * scale;
  }
  using Plain = PlainMods<Mods>;  // (nothing gathered: the plain calls per element)
  ModRows<Plain> rows;
  rows.gather(q_idx, b, h, cap);
  score_tile<Plain, kTileN>(s, q_idx, start, t, len_kv, is_full, scale, b, h, rows, ModCols<Plain, kNT>{},
                            cap);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[j][i] = prob<Mods::kHasScoreMod>(s[j][i], sn, lse[i >> 1]);
}

// dP -> dS = grad(P∘(dP - Δ)) in place, zero where P is (as dscores_t); buffer gradients into
// `grads` (none: FaGradBuffers{}).
template <typename Mods, int kNT, int kSC>
__device__ __forceinline__ void dscores_rows(float (&dp)[kNT][4], const float (&pr)[kNT][4],
                                             const float (&sc)[kSC][4], const int (&q_idx)[2],
                                             const float (&delta)[2], int start, int t, int len_kv, int b,
                                             int h, const FaCaptures& cap, const FaGradBuffers& grads) {
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float dt = pr[j][i] * (dp[j][i] - delta[i >> 1]);
      if constexpr (!Mods::kScoreGrad) {
        dp[j][i] = dt;  // (as dscores_t)
      } else {
        float ds = 0.f;
        if (pr[j][i] != 0.f) {
          const int kv = start + 8 * j + 2 * t + (i & 1);
          ds = Mods::score_grad(sc[j][i], b, h, q_idx[i >> 1], kv < len_kv ? kv : len_kv - 1, dt, cap, grads);
        }
        dp[j][i] = ds;
      }
    }
}

// dQ(BLOCK_M x DQK) += dS·K of one query tile, as fp32 reductions into dq_accum rows (dqa):
// dSᵀ [keys][queries] at sDs, K at sK. Warp -> (16-row m-tile, column part); the part's
// columns in chunks of kDqChunkTiles n-tiles (a wide head's chunks bound the registers).
template <typename Cfg>
__device__ __forceinline__ void add_dq(float* dqa, u32 sDs, u32 sK, int q0, int len_q, int warp, int g, int t,
                                       const u32 (&offA_q)[4], const u32 (&offB_m)[4]) {
  using E = typename Cfg::Element;
  using RowQK = typename Cfg::RowQK;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kCQ = Cfg::kCQ, kCM = Cfg::kCM;
  constexpr int kNQ = Cfg::kDqCols / 8, kNC = Cfg::kDqChunkTiles;
  const int mt = warp % (kBM / 16), part = warp / (kBM / 16);
#pragma unroll
  for (int c0 = 0; c0 < kNQ; c0 += kNC) {
    float dq[kNC][4];
    zero_frags(dq);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {  // over keys
      u32 a[4];
      // A = dS (rows = queries mt*16.., k = keys kk*16..) from dSᵀ [keys][queries]: .trans
      ldmatrix_x4_trans(a, sDs + frag_at<kCM>(offB_m, kk, mt));
#pragma unroll
      for (int jp = 0; jp < kNC / 2; ++jp) {
        if (c0 + 2 * jp >= kNQ) continue;  // a last, shorter chunk
        u32 bf[4];
        ldmatrix_x4_trans(bf, sK + frag_at<kCQ>(offA_q, kk, part * (kNQ / 2) + c0 / 2 + jp));
        mma_16816<E>(dq[2 * jp], a, bf[0], bf[1]);
        mma_16816<E>(dq[2 * jp + 1], a, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + mt * 16 + g + 8 * hh;
      if (q >= len_q) continue;
      float* row = dqa + (long long)q * Cfg::kHeadDimQK + part * Cfg::kDqCols + 2 * t;
#pragma unroll
      for (int j = 0; j < kNC; ++j) {
        const int col = part * Cfg::kDqCols + 8 * (c0 + j);
        if (c0 + j >= kNQ) continue;
        // the zero chunk after an odd chunk count is computed, never stored
        if (RowQK::kUsed != RowQK::kChunks && col >= Cfg::kHeadDimQK) continue;
        red_add_f32(row + 8 * (c0 + j), dq[j][2 * hh]);
        red_add_f32(row + 8 * (c0 + j) + 1, dq[j][2 * hh + 1]);
      }
    }
  }
}

}  // namespace bwd

// ---- the ragged layout (WithLayout<Config, kRaggedLayout>: FaBwdParams' cu_seqlens) --------
// p rebased on sequence b of a packed batch: q, o, dout, dq at its first query row, lse, dlse,
// delta and dq_accum at its first entry (row); k, v, dk, dv at its first key row where the keys
// are packed; len_q / len_kv its own, clamped to [0, the launch's longest] (as the forward's
// rebase_sequence: tables that break the contract cannot make a kernel read past the views).
template <typename Cfg>
__device__ __forceinline__ void rebase_sequence(FaBwdParams& p, int b) {
  using E = typename Cfg::Element;
  auto clamp_len = [](int n, int hi) { return n < 0 ? 0 : n > hi ? hi : n; };
  if (p.cu_seqlens_q != nullptr) {
    const int first = p.cu_seqlens_q[b];
    p.len_q = clamp_len(p.cu_seqlens_q[b + 1] - first, p.len_q);
    p.q = static_cast<const E*>(p.q) + (long long)first * p.q_stride_m;
    p.o = static_cast<const E*>(p.o) + (long long)first * p.o_stride_m;
    p.dout = static_cast<const E*>(p.dout) + (long long)first * p.do_stride_m;
    p.dq = static_cast<E*>(p.dq) + (long long)first * p.dq_stride_m;
    p.lse += first;
    if (p.dlse != nullptr) p.dlse += first;
    p.delta += first;
    if (p.dq_accum != nullptr) p.dq_accum += (long long)first * Cfg::kHeadDimQK;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int first = p.cu_seqlens_k[b];
    p.len_kv = clamp_len(p.cu_seqlens_k[b + 1] - first, p.len_kv);
    p.k = static_cast<const E*>(p.k) + (long long)first * p.k_stride_n;
    p.v = static_cast<const E*>(p.v) + (long long)first * p.v_stride_n;
    p.dk = static_cast<E*>(p.dk) + (long long)first * p.dk_stride_n;
    p.dv = static_cast<E*>(p.dv) + (long long)first * p.dv_stride_n;
  }
}
// Runs kernel(params) for a CTA of sequence b whose first row is row0 (a query row; with kKeys a
// key row): on p itself in the dense layout; ragged on p rebased on sequence b, and not at all
// where row0 lies past that sequence's end (the grid covers the longest). A dK/dV CTA of a
// sequence without queries runs, and stores zeros. A CTA with nothing to do still waits for the
// grid before it (the chain below): no grid of the chain may end before the one it follows.
template <typename Cfg, bool kKeys, typename Kernel>
__device__ __forceinline__ void on_bwd_sequence(const FaBwdParams& p, int b, int row0, Kernel&& kernel) {
  if constexpr (Cfg::kLayout == kDenseLayout) {
    kernel(p);
  } else {
    static_assert(Cfg::kLayout == kRaggedLayout, "the backward takes dense or ragged operands");
    FaBwdParams seq = p;
    rebase_sequence<Cfg>(seq, b);
    if (row0 >= (kKeys ? seq.len_kv : seq.len_q)) {
      wait_for_prior_grids();
      return;
    }
    kernel(seq);
  }
}

// ================================ preprocess =================================================
// delta[b, h, q] = sum_d dO·O (fp32) - dLSE (dLSE dropped where the LSE is -inf: no key);
// dq_accum rows zeroed. kPreLanes threads per row, one 16-byte chunk each.
template <typename Cfg>
__device__ __forceinline__ void backward_pre_kernel(const FaBwdParams& p) {
  using E = typename Cfg::Element;
  constexpr int kLanes = Cfg::kPreLanes;
  constexpr int kCQ4 = Cfg::kHeadDimQK / 4;  // 16-byte fp32 chunks of a dq_accum row
  const int b = blockIdx.y / p.heads_q, h = blockIdx.y % p.heads_q;
  const int q = blockIdx.x * Cfg::kPreRows + threadIdx.x / kLanes, c = threadIdx.x % kLanes;
  const bool in = q < p.len_q;
  float acc = 0.f;
  if (in && c < Cfg::RowV::kChunks) {
    const u32x4 o = ld_global_v4(bwd::row_base<E>(p.o, p.o_stride_b, p.o_stride_h, b, h) +
                                 (long long)q * p.o_stride_m + c * 8);
    const u32x4 d = ld_global_v4(bwd::row_base<E>(p.dout, p.do_stride_b, p.do_stride_h, b, h) +
                                 (long long)q * p.do_stride_m + c * 8);
    const u32 ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float o0, o1, d0, d1;
      unpack2<E>(ow[i], o0, o1);
      unpack2<E>(dw[i], d0, d1);
      acc = fmaf(o0, d0, fmaf(o1, d1, acc));
    }
  }
#pragma unroll
  for (int m = kLanes / 2; m > 0; m /= 2) acc += shfl_xor(acc, m);  // the row's lanes
  if (!in) return;
  const long long row = bwd::stat_row(p, b, h) + q;
  if (c == 0) {
    // a row with no key (LSE -inf, O = 0) has P = 0 on all of it: Δ = 0 there whatever dLSE is,
    // so a NaN dLSE (0 · NaN of a torch.where that guarded the -inf LSE upstream) stays out of
    // dS = P·(dP - Δ), which the kernels form as a product where there is no score_grad
    const float dlse = p.dlse && p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] != -INFINITY
                           ? p.dlse[b * p.dlse_stride_b + h * p.dlse_stride_h + q]
                           : 0.f;
    p.delta[row] = acc - dlse;
  }
  if (p.dq_accum == nullptr) return;  // deterministic mode: dQ is written directly
  float* dqa = p.dq_accum + row * Cfg::kHeadDimQK;
  for (int cc = c; cc < kCQ4; cc += kLanes) st_global_v4(dqa + cc * 4, u32x4{0u, 0u, 0u, 0u});
}

// ================================ dQ conversion ==============================================
template <typename Cfg>
__device__ __forceinline__ void backward_dq_kernel(const FaBwdParams& p) {
  using E = typename Cfg::Element;
  constexpr int kLanes = Cfg::kDqLanes;
  const int b = blockIdx.y / p.heads_q, h = blockIdx.y % p.heads_q;
  const int q = blockIdx.x * Cfg::kDqRows + threadIdx.x / kLanes, c = threadIdx.x % kLanes;
  if (q >= p.len_q || c >= Cfg::RowQK::kChunks) return;
  const float* src = p.dq_accum + (bwd::stat_row(p, b, h) + q) * Cfg::kHeadDimQK + c * 8;
  const u32x4 lo = ld_global_v4(src), hi = ld_global_v4(src + 4);
  const u32 w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  u32 out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    out[i] = pack2<E>(__uint_as_float(w[2 * i]) * p.scale, __uint_as_float(w[2 * i + 1]) * p.scale);
  E* dst = static_cast<E*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h + (long long)q * p.dq_stride_m;
  st_global_v4(dst + c * 8, u32x4{out[0], out[1], out[2], out[3]});
}

// ================================ dK / dV ====================================================
// What one dK/dV CTA computes: everything, or one part of a wide head's split grid.
enum class DkDvPart { kAll, kDv, kDk };

template <typename Cfg, typename Mods, DkDvPart kPart>
__device__ __forceinline__ void backward_dkdv_part(const FaBwdParams& p, const FaCaptures& cap,
                                                   const FaGradBuffers& grads) {
  constexpr bool kDoDv = kPart != DkDvPart::kDk, kDoDk = kPart != DkDvPart::kDv;
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kQT = Cfg::kQT;  // n-tiles of Sᵀ (query columns)
  constexpr int kCQ = Cfg::kCQ, kCV = Cfg::kCV, kCM = Cfg::kCM;
  using RowQK = typename Cfg::RowQK;
  using RowV = typename Cfg::RowV;

  extern __shared__ __align__(128) unsigned char smem[];
  const LaneCoords lc;
  const int tid = lc.tid, lane = lc.lane, warp = lc.warp, g = lc.g, t = lc.t;

  const KeyBlockCta cta(kBN, p.heads_kv);
  const int kv0 = cta.kv0, b = cta.b, hkv = cta.hkv;
  const int group = p.heads_q / p.heads_kv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  const u32 sK = smem_addr(smem);
  const u32 sV = sK + Cfg::kSmemKBytes;
  const u32 sStage0 = sV + Cfg::kSmemVBytes;
  const u32 sDs = sStage0 + Cfg::kStages * Cfg::kSmemStageBytes;
  auto sQ = [&](int s) { return sStage0 + s * Cfg::kSmemStageBytes; };
  auto sDo = [&](int s) { return sQ(s) + Cfg::kSmemQBytes; };
  auto sLse = [&](int s) { return sDo(s) + Cfg::kSmemDoBytes; };  // LSE (+inf: no keys)
  auto sDelta = [&](int s) { return sLse(s) + Cfg::kSmemRowBytes; };

  // ---- K and V of this CTA, once
  load_tile_async<kBN, RowQK, kThreads>(sK, bwd::row_base<E>(p.k, p.k_stride_b, p.k_stride_h, b, hkv),
                                        p.k_stride_n, kv0, len_kv, tid);
  if constexpr (kDoDk)  // V only for dPᵀ
    load_tile_async<kBN, RowV, kThreads>(sV, bwd::row_base<E>(p.v, p.v_stride_b, p.v_stride_h, b, hkv),
                                         p.v_stride_n, kv0, len_kv, tid);
  cp_async_commit();

  // Lane offsets: K, V rows of this warp as A operands; Q, dO as B (n = queries) and as B with
  // .trans (k = queries); K as B with .trans (k = keys) and dSᵀ as A with .trans for dQ.
  u32 offA_q[4], offA_v[4], offB_q[4], offB_v[4], offB_m[4];
  lane_offsets_a<kCQ>(offA_q, lane);
  lane_offsets_a<kCV>(offA_v, lane);
  lane_offsets_b<kCQ>(offB_q, lane);
  lane_offsets_b<kCV>(offB_v, lane);
  lane_offsets_b<kCM>(offB_m, lane);

  // This thread's key rows (Sᵀ rows): kv0 + 16 warp + g (+8), clamped for the mods.
  const bwd::KeyRows kr(kv0 + warp * 16 + g, len_kv);
  const bool key_tail = kv0 + kBN > len_kv;
  const float sn = natural_scale(Mods::kHasScoreMod, p.scale);

  constexpr int kDkTiles = kDoDk ? Cfg::kDQKTiles : 1, kDvTiles = kDoDv ? Cfg::kDT : 1;
  float dk[kDkTiles][4], dv[kDvTiles][4];
  zero_frags(dk);
  zero_frags(dv);

  for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
    const E* qg = bwd::row_base<E>(p.q, p.q_stride_b, p.q_stride_h, b, hq);
    const E* dog = bwd::row_base<E>(p.dout, p.do_stride_b, p.do_stride_h, b, hq);
    float* dqa = p.dq_accum + bwd::stat_row(p, b, hq) * Cfg::kHeadDimQK;
    // The query tiles that see these keys (none past len_q): a load cursor one tile ahead of
    // the compute cursor, each moved right after its use, so the next block index loads under
    // the tile's MMAs (forward.cuh).
    const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
    TileCursor<kBM> ld(walk, len_q);

    // Q, dO by cp.async; LSE and Δ through registers (rows may not fill a 16-byte chunk).
    auto load_q_tile = [&](int s) {
      if (ld.done(walk)) return;
      const int q0 = ld.start;
      load_tile_async<kBM, RowQK, kThreads>(sQ(s), qg, p.q_stride_m, q0, len_q, tid);
      load_tile_async<kBM, RowV, kThreads>(sDo(s), dog, p.do_stride_m, q0, len_q, tid);
      bwd::stage_row_stats<kBM, kThreads>(sLse(s), sDelta(s), p, b, hq, q0, tid);
      ld.next(walk, len_q);
    };
    load_q_tile(0);
    cp_async_commit();

    int it = 0;
    for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); ++it) {
      const int stage = it % 2;
      cp_async_wait<0>();
      __syncthreads();  // tile `it` (and K, V) visible to all; the other stage is free
      load_q_tile(stage ^ 1);
      cp_async_commit();

      const int q0 = cur.start;
      const bool is_full = cur.is_full(walk);
      cur.next(walk, len_q);

      // ---- Sᵀ = K·Qᵀ, this warp's 16 keys x BLOCK_M queries
      float s[kQT][4];
      zero_frags(s);
      bwd::mma_abt<E, kQT, Cfg::kKQ, kCQ, kCQ>(s, sK, warp, sQ(stage), offA_q, offB_q);

      // ---- mods, then Pᵀ (scores as score_mod saw them kept for score_grad). The plain mods per
      // element: gathered here as in the Hopper kernel (ModKeys, ModQueries ahead of Sᵀ), a
      // document mask ran 0.995x (H200, d64 and d128, 2026-11-28).
      float sc[Mods::kScoreGrad ? kQT : 1][4];
      bwd::probs_t<Mods>(
          s, sc, kr, q0, t, len_q, len_kv, key_tail, p.scale, sn,
          [&](int, int col) { return ld_shared_v2_f32(sLse(stage) + col * 4); }, [](int, int) { return 0; },
          [&](float x, int q, int hh, int) {
            return mod_score<Mods, true>(x, q, kr.kv_c[hh], is_full, p.scale, b, hq, cap);
          });

      // ---- dV += Pᵀ·dO (P packed to 16 bits as A fragments)
      if constexpr (kDoDv) {
        u32 pa[Cfg::kMK][4];
        pack_a<E>(pa, s);
        bwd::mma_rb<E, Cfg::kDT, Cfg::kMK, kCV>(dv, pa, sDo(stage), offA_v);
      }
      if constexpr (kDoDk) {
        // ---- dPᵀ = V·dOᵀ
        float dp[kQT][4];
        zero_frags(dp);
        bwd::mma_abt<E, kQT, Cfg::kKV, kCV, kCV>(dp, sV, warp, sDo(stage), offA_v, offB_v);

        // ---- dSᵀ = grad(Pᵀ∘(dPᵀ - Δ)), zero where P is
        bwd::dscores_t<Mods>(dp, s, sc, kr, q0, t, len_q, b, hq, cap, grads,
                             [&](int, int col) { return ld_shared_v2_f32(sDelta(stage) + col * 4); });

        // ---- dK += dSᵀ·Q (dS packed to 16 bits as A fragments)
        u32 da[Cfg::kMK][4];
        pack_a<E>(da, dp);
        bwd::mma_rb<E, Cfg::kDQKTiles, Cfg::kMK, kCQ>(dk, da, sQ(stage), offA_q);
        if constexpr (!Cfg::kDeterministic) {  // else dQ comes from backward_dq_det_kernel
          // dSᵀ to shared memory (this warp's 16 key rows), then dQ += dS·K
          stage_packed<SwizzledRows<kCM>>(sDs, da, warp * 16 + g, t);
          __syncthreads();
          bwd::add_dq<Cfg>(dqa, sDs, sK, q0, len_q, warp, g, t, offA_q, offB_m);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next head's first tile reuses stage 0 and dSᵀ
  }

  // ---- epilogue: dK·scale and dV staged in the K / V tiles (every warp is done with them),
  // 16-byte stores of this warp's rows; rows past len_kv are not written.
  const float kscale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  const int row0 = warp * 16 + g;
  if constexpr (kDoDk) stage_rows<E, SwizzledRows<kCQ>>(sK, dk, kscale, row0, t);
  if constexpr (kDoDv) stage_rows<E, SwizzledRows<kCV>>(sV, dv, one, row0, t);
  __syncwarp();
  E* dkg = static_cast<E*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  E* dvg = static_cast<E*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
  if constexpr (kDoDk)
    store_rows<16, RowQK::kChunks, 32, SwizzledRows<kCQ>>(dkg, p.dk_stride_n, sK, warp * 16, kv0, len_kv,
                                                          lane);
  if constexpr (kDoDv)
    store_rows<16, RowV::kChunks, 32, SwizzledRows<kCV>>(dvg, p.dv_stride_n, sV, warp * 16, kv0, len_kv,
                                                         lane);
}

// One CTA of the dK/dV grid: all of it, or (a wide head) the part blockIdx.z names.
template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dkdv_kernel(const FaBwdParams& p, const FaCaptures& cap,
                                                     const FaGradBuffers& grads) {
  if constexpr (Cfg::kDkDvParts == 1)
    backward_dkdv_part<Cfg, Mods, DkDvPart::kAll>(p, cap, grads);
  else if (blockIdx.z == 0)
    backward_dkdv_part<Cfg, Mods, DkDvPart::kDv>(p, cap, grads);
  else
    backward_dkdv_part<Cfg, Mods, DkDvPart::kDk>(p, cap, grads);
}

// ================================ dQ, deterministic =========================================
// dQ without reductions: one CTA per (BLOCK_M queries, batch x query head) walks the forward's
// block tables (partial KV tiles, then full ones) in a fixed order and recomputes, per 64-key
// tile, S = Q·Kᵀ, P, dP = dO·Vᵀ and dS, accumulating dQ += dS·K in registers; dQ·scale is
// written once. Buffer gradients are not accumulated here (the dK/dV kernel does that).
template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dq_det_kernel(const FaBwdParams& p, const FaCaptures& cap) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kDetKvTile, kThreads = Cfg::kDetThreads;
  constexpr int kCQ = Cfg::kCQ, kCV = Cfg::kCV;
  constexpr int kNT = kBN / 8;  // n-tiles of S (keys)
  constexpr int kDQ = Cfg::kDQKTiles;
  using RowQK = typename Cfg::RowQK;
  using RowV = typename Cfg::RowV;

  extern __shared__ __align__(128) unsigned char smem[];
  const LaneCoords lc;
  const int tid = lc.tid, lane = lc.lane, warp = lc.warp, g = lc.g, t = lc.t;
  const QueryBlockCta cta(kBM, p.heads_q, p.heads_kv);
  const int q0 = cta.q0, b = cta.b, h = cta.h, hkv = cta.hkv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  const u32 sQ = smem_addr(smem);
  const u32 sDo = sQ + kBM * RowQK::kRowBytes;
  const u32 sKV0 = sDo + kBM * RowV::kRowBytes;
  constexpr int kStageBytes = kBN * (RowQK::kRowBytes + RowV::kRowBytes);
  auto sK = [&](int s) { return sKV0 + s * kStageBytes; };
  auto sV = [&](int s) { return sK(s) + kBN * RowQK::kRowBytes; };

  const E* kg = bwd::row_base<E>(p.k, p.k_stride_b, p.k_stride_h, b, hkv);
  const E* vg = bwd::row_base<E>(p.v, p.v_stride_b, p.v_stride_h, b, hkv);
  // The key tiles (none past len_kv), a load cursor one tile ahead of the compute cursor.
  const BlockWalk<kBN> walk(p.mask, b, h, q0);
  TileCursor<kBN> ld(walk, len_kv);
  auto load_kv = [&](int s) {
    if (ld.done(walk)) return;
    load_tile_async<kBN, RowQK, kThreads>(sK(s), kg, p.k_stride_n, ld.start, len_kv, tid);
    load_tile_async<kBN, RowV, kThreads>(sV(s), vg, p.v_stride_n, ld.start, len_kv, tid);
    ld.next(walk, len_kv);
  };
  load_tile_async<kBM, RowQK, kThreads>(sQ, bwd::row_base<E>(p.q, p.q_stride_b, p.q_stride_h, b, h),
                                        p.q_stride_m, q0, len_q, tid);
  load_tile_async<kBM, RowV, kThreads>(sDo, bwd::row_base<E>(p.dout, p.do_stride_b, p.do_stride_h, b, h),
                                       p.do_stride_m, q0, len_q, tid);
  load_kv(0);
  cp_async_commit();

  // This thread's query rows: LSE (+inf: no key, or past the end) and Δ.
  int q_idx[2];
  float lse[2], delta[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int q = q0 + warp * 16 + g + 8 * hh;
    q_idx[hh] = q < len_q ? q : len_q - 1;
    const bwd::RowStats st = bwd::row_stats(p, b, h, q);
    lse[hh] = st.lse;
    delta[hh] = st.delta;
  }
  const float sn = natural_scale(Mods::kHasScoreMod, p.scale);

  u32 offA_q[4], offA_v[4], offB_q[4], offB_v[4];
  lane_offsets_a<kCQ>(offA_q, lane);
  lane_offsets_a<kCV>(offA_v, lane);
  lane_offsets_b<kCQ>(offB_q, lane);
  lane_offsets_b<kCV>(offB_v, lane);

  float dq[kDQ][4];
  zero_frags(dq);

  int it = 0;
  for (TileCursor<kBN> cur(walk, len_kv); !cur.done(walk); ++it) {
    const int stage = it % 2;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` visible to all; the other stage is free
    load_kv(stage ^ 1);
    cp_async_commit();
    const int start = cur.start;
    const bool is_full = cur.is_full(walk);
    cur.next(walk, len_kv);

    // ---- S = Q·Kᵀ (this warp's 16 queries x 64 keys), mods, P
    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[j][i] = dp[j][i] = 0.f;
    bwd::mma_abt<E, kNT, Cfg::kKQ, kCQ, kCQ>(s, sQ, warp, sK(stage), offA_q, offB_q);
    float sc[Mods::kScoreGrad ? kNT : 1][4];
    bwd::probs_rows<Mods, kBN>(s, sc, q_idx, lse, start, t, len_kv, is_full, p.scale, sn, b, h, cap);

    // ---- dP = dO·Vᵀ, dS = grad(P∘(dP - Δ)), zero where P is (buffer gradients: the dK/dV kernel's)
    bwd::mma_abt<E, kNT, Cfg::kKV, kCV, kCV>(dp, sDo, warp, sV(stage), offA_v, offB_v);
    bwd::dscores_rows<Mods>(dp, s, sc, q_idx, delta, start, t, len_kv, b, h, cap, FaGradBuffers{});

    // ---- dQ += dS·K (dS packed as A fragments; K rows = keys, read with .trans)
    u32 da[kBN / 16][4];
    pack_a<E>(da, dp);
    bwd::mma_rb<E, kDQ, kBN / 16, kCQ>(dq, da, sK(stage), offA_q);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with Q before dQ is staged over it

  const float kscale[2] = {p.scale, p.scale};
  stage_rows<E, SwizzledRows<kCQ>>(sQ, dq, kscale, warp * 16 + g, t);
  __syncwarp();
  E* dqg = static_cast<E*>(p.dq) + b * p.dq_stride_b + h * p.dq_stride_h;
  store_rows<16, RowQK::kChunks, 32, SwizzledRows<kCQ>>(dqg, p.dq_stride_m, sQ, warp * 16, q0, len_q, lane);
}

// ---- the kernels' entries: each CTA on its sequence (on_bwd_sequence) -----------------------
template <typename Cfg>
__device__ __forceinline__ void backward_pre(const FaBwdParams& p) {
  on_bwd_sequence<Cfg, false>(p, blockIdx.y / p.heads_q, blockIdx.x * Cfg::kPreRows,
                              [&](const FaBwdParams& s) { backward_pre_kernel<Cfg>(s); });
}
template <typename Cfg>
__device__ __forceinline__ void backward_dq(const FaBwdParams& p) {
  on_bwd_sequence<Cfg, false>(p, blockIdx.y / p.heads_q, blockIdx.x * Cfg::kDqRows,
                              [&](const FaBwdParams& s) { backward_dq_kernel<Cfg>(s); });
}
template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dq_det(const FaBwdParams& p, const FaCaptures& cap) {
  const QueryBlockCta cta(Cfg::kBlockM, p.heads_q, p.heads_kv);
  on_bwd_sequence<Cfg, false>(p, cta.b, cta.q0,
                              [&](const FaBwdParams& s) { backward_dq_det_kernel<Cfg, Mods>(s, cap); });
}

}  // namespace fa

// Defines the extern "C" kernels name##_pre, name##_dkdv, name##_dq (single identifiers).
#define FAJIT_DEFINE_BACKWARD(name, Config, Mods)                                                     \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_pre(const FaBwdParams p) { \
    fa::allow_dependent_launch();                                                                     \
    fa::backward_pre<Config>(p);                                                                      \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)                                   \
      name##_dkdv(const FaBwdParams p, const FaCaptures cap, const FaGradBuffers grads) {             \
    fa::allow_dependent_launch();                                                                     \
    fa::wait_for_prior_grids(); /* Δ and the zeroed dq_accum */                                      \
    const fa::KeyBlockCta cta(Config::kBlockN, p.heads_kv);                                           \
    fa::on_bwd_sequence<Config, true>(p, cta.b, cta.kv0, [&](const FaBwdParams& s) {                  \
      fa::backward_dkdv_kernel<Config, Mods>(s, cap, grads);                                          \
    });                                                                                               \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_dq(const FaBwdParams p) {  \
    fa::wait_for_prior_grids();                                                                       \
    fa::backward_dq<Config>(p);                                                                       \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kDetThreads)                                   \
      name##_dq_det(const FaBwdParams p, const FaCaptures cap) {                                      \
    fa::wait_for_prior_grids();                                                                       \
    if constexpr (Config::kDeterministic) fa::backward_dq_det<Config, Mods>(p, cap);                  \
  }

#endif  // FAJIT_BACKWARD_CUH
