// fajit forward attention kernel for Hopper (sm_90a): wgmma + warp specialisation.
// Same FaMods, kernel arguments and semantics as fajit/forward.cuh (the sm_80 FA-2 kernel):
// codegen switches by including this header and naming the config and macro below.
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ... };                                   // see templates/README.md
//   #include "fajit/forward_sm90.cuh"
//   using FaConfig = fa::DefaultSm90FwdConfig<fa::bf16_t, 128, 128, FaMods::kHasScoreMod>;
//                                                              // or fa::Sm90FwdConfig<...>
//   FAJIT_DEFINE_FORWARD_SM90(fajit_fwd, FaConfig, FaMods)
// NVRTC: --gpu-architecture=sm_90a (wgmma and setmaxnreg exist only there). Macro arguments
// must be single identifiers (name the config with a `using` first). The kernel is extern "C".
//
// ---- Config (fa::Sm90FwdConfig<Element, DQK, DV, BLOCK_N, STAGES, OVERLAP, PINGPONG>) -----
//   Element   fa::f16_t or fa::bf16_t (Q, K, V, O); LSE is fp32
//   DQK, DV   head dims of Q·Kᵀ and of V/O: 64 or 128, independently
//   BLOCK_N   key/value rows per pipeline tile: 64 or 128 (the wgmma N of S = Q·Kᵀ)
//   STAGES    K/V shared-memory stages (2..4, within 227 KiB)
//   OVERLAP   issue S_{j+1} = Q·K_{j+1}ᵀ before the softmax of S_{j+1} runs against P_j·V_j
//             (FA-3 intra-warpgroup pipelining); false: S, softmax, P·V strictly in turn
//   PINGPONG  the two consumer warpgroups take turns issuing their GEMMs (named barriers 3, 4),
//             so one's softmax runs while the other's GEMMs use the tensor cores
//   BLOCK_M is fixed at 128: 2 consumer warpgroups of 64 query rows each.
//
// ---- Launch (host mirrors these; the constants are spelled out) --------------------------
//   grid  = ( ceil(len_q / 128), batch * heads_q, 1 )         (same as forward.cuh, BLOCK_M 128)
//   block = ( 384, 1, 1 )                                      == Config::kThreads
//   dynamic shared memory bytes                                == Config::kSmemBytes
//         = 1024 (alignment slack) + 2 * (128 * max(DQK, DV) + STAGES * BLOCK_N * (DQK + DV))
//           + 8 * (1 + 3 * STAGES)                             (mbarriers)
//   always > 48 KiB: cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, n).
//   Kernel arguments: (const FaFwdParams p, const FaCaptures cap), by value.
//   Host-validated preconditions (as forward.cuh): scale > 0; heads_q % heads_kv == 0;
//   len_q, len_kv >= 1; head dim contiguous; Q/K/V/O base pointers and row strides 16-byte
//   aligned (row strides multiples of 8 elements); mask.q_block % 128 == 0,
//   mask.kv_block % BLOCK_N == 0; table indices < ceil(len_kv / kv_block). A compute
//   capability 9.0 device (sm_90a code loads on nothing else).
//
// ---- Semantics (flex_attention; identical to forward.cuh) --------------------------------
//   score = q·k · scale, then FaMods::score_mod(score, b, h, q, kv); for partial blocks also
//   FaMods::mask_mod(b, h, q, kv) (false -> -inf). Partial blocks first, then full blocks
//   (score_mod only); empty blocks are never read. Any tile whose kv range crosses len_kv is
//   bounds-masked, whatever its class. Query rows past len_q are computed with a clamped q
//   index (mods never see q >= len_q or kv >= len_kv) and never stored. GQA: q head h reads
//   kv head h / (heads_q / heads_kv). A row with no unmasked score gets O = 0, LSE = -inf.
//
// ---- Structure ----------------------------------------------------------------------------
//   Warpgroup 0 (producer, setmaxnreg down to 40): cp.async of the Q tile, then of each K/V
//   tile into STAGES 128B-swizzled stages; completion reaches the consumers through mbarriers
//   (cp.async.mbarrier.arrive.noinc: full_k[s], full_v[s]); it waits on empty[s] before
//   reusing a stage. Warpgroups 1, 2 (consumers, setmaxnreg up to 232): 64 query rows each;
//   S = Q·Kᵀ by wgmma m64n{BLOCK_N}k16 with Q and K from shared memory; score_mod/mask_mod and
//   the online softmax (exp2, scale·log2e folded) on the accumulator registers; P converted
//   to 16-bit in registers and used as the A operand of O += P·V (wgmma m64n{DV}k16, V
//   MN-major from shared memory); each warp arrives on empty[s] once its P·V has completed.
//   Epilogue: O / l staged through the warpgroup's own rows of the Q region, 16-byte stores.
#ifndef FAJIT_FORWARD_SM90_CUH
#define FAJIT_FORWARD_SM90_CUH

#include "fajit/params.h"
#include "fajit/prelude.cuh"
#include "fajit/wgmma_sm90.cuh"
#include "fajit/block_walk.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockN_ = 128, int kStages_ = 2,
          bool kOverlap_ = true, bool kPingPong_ = false>
struct Sm90FwdConfig {
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kPingPong = kPingPong_;

  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;   // 128 * 40 + 256 * 232 <= 65536
  static constexpr int kMaxHeadDim = kHeadDimQK > kHeadDimV ? kHeadDimQK : kHeadDimV;
  static constexpr int kSmemQOBytes = kBlockM * kMaxHeadDim * 2;   // Q tile, then O staging
  static constexpr int kSmemKBytes = kBlockN * kHeadDimQK * 2;     // one K stage
  static constexpr int kSmemVBytes = kBlockN * kHeadDimV * 2;      // one V stage
  static constexpr int kSmemBarOffset = kSmemQOBytes + kStages * (kSmemKBytes + kSmemVBytes);
  static constexpr int kNumBarriers = 1 + 3 * kStages;             // q, full_k, full_v, empty
  static constexpr int kSmemBytes = 1024 + kSmemBarOffset + 8 * kNumBarriers;

  static_assert(kHeadDimQK == 64 || kHeadDimQK == 128, "DQK must be 64 or 128");
  static_assert(kHeadDimV == 64 || kHeadDimV == 128, "DV must be 64 or 128");
  static_assert(kBlockN == 64 || kBlockN == 128, "BLOCK_N must be 64 or 128 (sm90 kernel)");
  static_assert(kStages >= 2 && kStages <= 4, "STAGES must be 2, 3 or 4");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

// Default tiles, measured on H200 (templates/NOTES-sm90.md): BLOCK_N 128, overlap and
// ping-pong on; 3 stages when a head dim is 128 (d128 full 531 vs 501 TFLOP/s with 2),
// 2 at 64/64 (same speed, 83 KB less shared memory). kHasScoreMod does not change the choice
// (alibi/softcap were fastest or within 1 % on the same config); it is kept for symmetry with
// fa::DefaultFwdConfig.
template <typename Element, int kHeadDimQK, int kHeadDimV, bool kHasScoreMod = false>
using DefaultSm90FwdConfig =
    Sm90FwdConfig<Element, kHeadDimQK, kHeadDimV, 128, (kHeadDimQK > 64 || kHeadDimV > 64) ? 3 : 2, true,
                  true>;

namespace sm90 {
namespace detail {

// cp.async a tile of kRows rows x kChunks 16-byte chunks from global rows row0.. (row stride
// `stride` elements) into kChunks/8 swizzled column blocks of kRows x 128 B (wgmma_sm90.cuh);
// rows >= len are zero-filled. Consecutive threads take consecutive chunks of a row.
template <int kRows, int kChunks, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_sw128(u32 dst, const Element* src, long long stride,
                                                int row0, int len, int tid) {
  static_assert(kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0,
                "tile chunks must divide evenly among threads");
  constexpr int kRowStep = kThreads / kChunks;   // rows per pass; a thread keeps its chunk
  const int c = tid % kChunks, r0 = tid / kChunks;
  // Running pointer/address (few live registers: the producer runs on 40).
  const Element* g = src + (long long)(row0 + r0) * stride + c * 8;
  const long long step = (long long)kRowStep * stride;
  u32 d = dst + (c / 8) * (kRows * 128) + r0 * 128 + (((c % 8) ^ (r0 % 8)) << 4);
  // kRowStep is a multiple of 8 (128 threads, <= 16 chunks), so r % 8 == r0 % 8 throughout.
  static_assert(kRowStep % 8 == 0, "row step must keep the swizzle phase");
  int left = len - row0 - r0;   // rows of this thread still in range, counting down
#pragma unroll 4
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const bool valid = left > 0;
    cp_async_16(d, valid ? g : src, valid);
    g += step;
    d += kRowStep * 128;
    left -= kRowStep;
  }
}

// Byte offset of chunk c (16 bytes) of row r in a tile of kRows rows stored as 128B-swizzled
// column blocks (the Q/O region layout).
template <int kRows>
__device__ __forceinline__ u32 blocked_offset(int r, int c) {
  return static_cast<u32>((c / 8) * (kRows * 128) + r * 128 + (((c % 8) ^ (r % 8)) << 4));
}

// score_mod / mask_mod on an S accumulator of one warpgroup: element (j, i) of this thread is
// (row q_idx[i/2], column kv0 + 8j + i%2), kv0 = tile start + 2*(lane%4).
// kMask: also apply mask_mod (unless the block is full) and the kv < len_kv bound.
template <typename Mods, bool kMask, int kNT>
__device__ __forceinline__ void apply_mods(float (&s)[kNT][4], const int (&q_idx)[2], int kv0,
                                           int len_kv, bool is_full, float scale, int b, int h,
                                           const FaCaptures& cap) {
  if constexpr (Mods::kHasScoreMod || kMask) {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kv = kv0 + j * 8 + (i & 1);
        const int kv_c = kv < len_kv ? kv : len_kv - 1;   // mods never see kv >= len_kv
        float x = s[j][i];
        if constexpr (Mods::kHasScoreMod)
          x = Mods::score_mod(x * scale, b, h, q_idx[i >> 1], kv_c, cap);
        if constexpr (kMask) {
          bool keep = kv < len_kv;
          if constexpr (Mods::kHasMaskMod)
            keep = keep & (is_full | Mods::mask_mod(b, h, q_idx[i >> 1], kv_c, cap));
          if (!keep) x = -INFINITY;
        }
        s[j][i] = x;
      }
  }
}

// Online softmax step on one S tile (base 2, x * sl2 is the exponent): updates the running
// max m and sum l of this thread's two rows, turns s into probabilities, returns the factor
// O must be rescaled by.
template <int kNT>
__device__ __forceinline__ void softmax_step(float (&s)[kNT][4], float (&m)[2], float (&l)[2],
                                             float (&alpha)[2], float sl2) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float mx = m[hh];
#pragma unroll
    for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * hh], s[j][2 * hh + 1]));
    mx = quad_max(mx);
    // A row with nothing unmasked yet keeps m = -inf: subtract 0, not -inf (no NaN).
    const float sub = mx == -INFINITY ? 0.f : mx * sl2;
    alpha[hh] = ex2(m[hh] * sl2 - sub);
    m[hh] = mx;
    float rs = 0.f;
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = ex2(fmaf(s[j][2 * hh + e], sl2, -sub));
        s[j][2 * hh + e] = pv;
        rs += pv;
      }
    l[hh] = l[hh] * alpha[hh] + rs;   // per-thread partial; quad-reduced at the end
  }
}

// P (probabilities in S accumulator layout) -> 16-bit A fragments of P·V, one per 16 kv.
template <typename E, int kNT>
__device__ __forceinline__ void pack_p(u32 (&pa)[kNT / 2][4], const float (&s)[kNT][4]) {
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) {
    pa[kk][0] = pack2<E>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack2<E>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

template <int kDT>
__device__ __forceinline__ void rescale_o(float (&o)[kDT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int dj = 0; dj < kDT; ++dj) {
    o[dj][0] *= alpha[0];
    o[dj][1] *= alpha[0];
    o[dj][2] *= alpha[1];
    o[dj][3] *= alpha[1];
  }
}

}  // namespace detail

template <typename Cfg, typename Mods>
__device__ __forceinline__ void forward_kernel(const FaFwdParams& p, const FaCaptures& cap) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kNT = kBN / 8;                  // 8-column n-tiles of S
  constexpr int kKQ = Cfg::kHeadDimQK / 16;     // k-steps of Q·Kᵀ
  constexpr int kKP = kBN / 16;                 // k-steps of P·V
  constexpr int kDT = Cfg::kHeadDimV / 8;       // 8-column n-tiles of O
  constexpr int kCQ = Cfg::kHeadDimQK / 8;      // 16-byte chunks per Q/K row
  constexpr int kCV = Cfg::kHeadDimV / 8;       // 16-byte chunks per V/O row

  extern __shared__ unsigned char smem_raw[];
  // 1024-byte aligned base: every swizzle atom starts on a 1024 B boundary (base offset 0).
  const u32 sQ = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const u32 sK = sQ + Cfg::kSmemQOBytes;
  const u32 sV = sK + kStages * Cfg::kSmemKBytes;
  const u32 bar_q = sQ + Cfg::kSmemBarOffset;
  auto bar_full_k = [&](int s) { return bar_q + 8u + 8u * s; };
  auto bar_full_v = [&](int s) { return bar_q + 8u + 8u * (kStages + s); };
  auto bar_empty = [&](int s) { return bar_q + 8u + 8u * (2 * kStages + s); };

  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;
  const int q0 = blockIdx.x * kBM;
  const int b = blockIdx.y / p.heads_q, h = blockIdx.y % p.heads_q;
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int len_q = p.len_q, len_kv = p.len_kv;

  // ---- block-sparse walk: partial blocks, then full blocks, kv_block / BLOCK_N tiles each
  const KvWalk<kBN> walk(p.mask, b, h, q0);
  const int n_tiles = walk.n_tiles;
  auto tile_start = [&](int it) { return walk.tile_start(it); };

  if (tid == 0) {
    sm90::mbar_init(bar_q, 128);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(bar_full_k(s), 128);      // one cp.async arrive per producer thread
      sm90::mbar_init(bar_full_v(s), 128);
      sm90::mbar_init(bar_empty(s), 4 * Cfg::kConsumerWarpgroups);   // one per consumer warp
    }
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ================= producer: cp.async Q, then K/V tiles through the stages =============
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    const E* qg = static_cast<const E*>(p.q) + b * p.q_stride_b + h * p.q_stride_h;
    const E* kg = static_cast<const E*>(p.k) + b * p.k_stride_b + hkv * p.k_stride_h;
    const E* vg = static_cast<const E*>(p.v) + b * p.v_stride_b + hkv * p.v_stride_h;
    sm90::detail::load_tile_sw128<kBM, kCQ, 128>(sQ, qg, p.q_stride_m, q0, len_q, tid);
    sm90::mbar_arrive_cp_async(bar_q);
    int stage = 0;
    u32 phase = 0;
    for (int it = 0; it < n_tiles; ++it) {
      const int start = tile_start(it);
      if (start >= len_kv) continue;   // a sub-tile past the end of a tail block: never read
      sm90::mbar_wait(bar_empty(stage), phase ^ 1u);
      sm90::detail::load_tile_sw128<kBN, kCQ, 128>(sK + stage * Cfg::kSmemKBytes, kg, p.k_stride_n,
                                                   start, len_kv, tid);
      sm90::mbar_arrive_cp_async(bar_full_k(stage));
      sm90::detail::load_tile_sw128<kBN, kCV, 128>(sV + stage * Cfg::kSmemVBytes, vg, p.v_stride_n,
                                                   start, len_kv, tid);
      sm90::mbar_arrive_cp_async(bar_full_v(stage));
      if (++stage == kStages) stage = 0, phase ^= 1u;
    }
    sm90::cp_async_wait_all();
  } else {
    // ================= consumers: 64 query rows per warpgroup ===============================
    sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const int cw = warpgroup - 1;
    const int wtid = tid - 128 * warpgroup;
    const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int row_base = cw * 64 + warp * 16 + g;   // this thread's rows: row_base, row_base + 8
    int q_idx[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + row_base + 8 * hh;
      q_idx[hh] = q < len_q ? q : len_q - 1;
    }
    // Softmax works in base 2: x * sl2 is the exponent. Without score_mod the raw q·k is kept
    // and scale·log2(e) folds into the exp2's FFMA; with it, the modded score gets log2(e).
    const float sl2 = Mods::kHasScoreMod ? kLog2e : p.scale * kLog2e;
    float o[kDT][4];
#pragma unroll
    for (int dj = 0; dj < kDT; ++dj)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[dj][i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    u32 pa[kKP][4];

    // Descriptors: Q (K-major, this warpgroup's 64 rows), K (K-major), V (MN-major).
    const u64 dq = sm90::desc_sw128(sQ + cw * 64 * 128, 16, 1024);
    const u64 dk = sm90::desc_sw128(sK, 16, 1024);
    const u64 dv = sm90::desc_sw128(sV, kBN * 128, 1024);
    auto s_gemm = [&](float (&s)[kNT][4], int stage) {
#pragma unroll
      for (int kk = 0; kk < kKQ; ++kk)
        sm90::wgmma_ss<E, kBN>(s, dq + (((kk / 4) * kBM * 128 + (kk % 4) * 32) >> 4),
                               dk + ((stage * Cfg::kSmemKBytes + (kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4),
                               kk > 0);
    };
    auto pv_gemm = [&](int stage) {
#pragma unroll
      for (int kk = 0; kk < kKP; ++kk)
        sm90::wgmma_rs<E, Cfg::kHeadDimV>(o, pa[kk], dv + ((stage * Cfg::kSmemVBytes + kk * 2048) >> 4), 1);
    };
    auto mods = [&](float (&s)[kNT][4], int start, bool is_full) {
      if ((Mods::kHasMaskMod && !is_full) || start + kBN > len_kv)
        sm90::detail::apply_mods<Mods, true>(s, q_idx, start + 2 * t, len_kv, is_full, p.scale, b, h, cap);
      else
        sm90::detail::apply_mods<Mods, false>(s, q_idx, start + 2 * t, len_kv, is_full, p.scale, b, h, cap);
    };
    auto release = [&](int stage) {
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(bar_empty(stage));
    };
    // Ping-pong: a warpgroup waits for its turn (barrier 3 + cw) before issuing a block of
    // GEMMs and hands the turn over (arrive on the other's barrier) after issuing it. Both
    // warpgroups issue the same number of blocks (same tiles); warpgroup 1 hands the first
    // turn over up front and warpgroup 0 takes one extra turn at the end, so every bar.sync
    // of 256 meets exactly one bar.arrive of the other warpgroup.
    auto turn_wait = [&]() {
      if constexpr (Cfg::kPingPong) sm90::named_barrier(3 + cw, 256);
    };
    auto turn_pass = [&]() {
      if constexpr (Cfg::kPingPong) sm90::named_barrier_arrive(4 - cw, 256);
    };
    if (Cfg::kPingPong && cw == 1) sm90::named_barrier_arrive(3, 256);
    auto next_tile = [&](int it) {   // first tile >= it that starts inside len_kv
      while (it < n_tiles && tile_start(it) >= len_kv) ++it;
      return it;
    };

    sm90::mbar_wait(bar_q, 0);   // also before an empty walk: O staging reuses the Q region
    int stage = 0;
    u32 phase = 0;
    if constexpr (!Cfg::kOverlap) {
      for (int it = next_tile(0); it < n_tiles; it = next_tile(it + 1)) {
        const int start = tile_start(it);
        const bool is_full = walk.is_full(it);
        sm90::mbar_wait(bar_full_k(stage), phase);
        sm90::fence_proxy_async();
        float s[kNT][4];
        turn_wait();
        sm90::wgmma_fence();
        s_gemm(s, stage);
        sm90::wgmma_commit();
        turn_pass();
        sm90::wgmma_wait<0>();
        sm90::pin(s);
        mods(s, start, is_full);
        float alpha[2];
        sm90::detail::softmax_step(s, m, l, alpha, sl2);
        sm90::detail::rescale_o(o, alpha);
        sm90::detail::pack_p<E>(pa, s);
        sm90::mbar_wait(bar_full_v(stage), phase);
        sm90::fence_proxy_async();
        turn_wait();
        sm90::wgmma_fence();
        pv_gemm(stage);
        sm90::wgmma_commit();
        turn_pass();
        sm90::wgmma_wait<0>();
        sm90::pin(o);
        sm90::pin(pa);
        release(stage);
        if (++stage == kStages) stage = 0, phase ^= 1u;
      }
    } else {
      int it = next_tile(0);
      if (it < n_tiles) {
        {   // first tile: S_0, softmax_0 (O is still 0: no rescale)
          float s[kNT][4];
          sm90::mbar_wait(bar_full_k(stage), phase);
          sm90::fence_proxy_async();
          turn_wait();
          sm90::wgmma_fence();
          s_gemm(s, stage);
          sm90::wgmma_commit();
          turn_pass();
          sm90::wgmma_wait<0>();
          sm90::pin(s);
          mods(s, tile_start(it), walk.is_full(it));
          float alpha[2];
          sm90::detail::softmax_step(s, m, l, alpha, sl2);
          sm90::detail::pack_p<E>(pa, s);
        }
        int prev_stage = stage;
        u32 prev_phase = phase;
        for (it = next_tile(it + 1); it < n_tiles; it = next_tile(it + 1)) {
          if (++stage == kStages) stage = 0, phase ^= 1u;
          const int start = tile_start(it);
          const bool is_full = walk.is_full(it);
          float s[kNT][4];
          // The producer arrives on full_v[prev] before full_k[stage] and each arrive covers
          // all of that thread's earlier copies, so both waits pass together: one fence.
          sm90::mbar_wait(bar_full_k(stage), phase);
          sm90::mbar_wait(bar_full_v(prev_stage), prev_phase);
          sm90::fence_proxy_async();
          turn_wait();
          sm90::wgmma_fence();
          s_gemm(s, stage);                 // S_j = Q·K_jᵀ
          sm90::wgmma_commit();
          pv_gemm(prev_stage);              // O += P_{j-1}·V_{j-1}, overlapping the softmax below
          sm90::wgmma_commit();
          turn_pass();
          sm90::wgmma_wait<1>();            // S_j done
          sm90::pin(s);
          mods(s, start, is_full);
          float alpha[2];
          sm90::detail::softmax_step(s, m, l, alpha, sl2);
          sm90::wgmma_wait<0>();            // P_{j-1}·V_{j-1} done: O and P free again
          sm90::pin(o);
          sm90::pin(pa);
          release(prev_stage);
          sm90::detail::rescale_o(o, alpha);
          sm90::detail::pack_p<E>(pa, s);
          prev_stage = stage, prev_phase = phase;
        }
        sm90::mbar_wait(bar_full_v(prev_stage), prev_phase);
        sm90::fence_proxy_async();
        turn_wait();
        sm90::wgmma_fence();
        pv_gemm(prev_stage);
        sm90::wgmma_commit();
        turn_pass();
        sm90::wgmma_wait<0>();
        sm90::pin(o);
        sm90::pin(pa);
        release(prev_stage);
      }
    }

    if (Cfg::kPingPong && cw == 0) turn_wait();   // the turn warpgroup 1 handed over last

    // ---- epilogue: O / l staged in this warpgroup's rows of the Q region (same blocked
    // swizzled layout as Q, so the other warpgroup's Q rows are untouched), 16-byte stores.
    E* og = static_cast<E*>(p.o) + b * p.o_stride_b + h * p.o_stride_h;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float lsum = quad_sum(l[hh]);
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
      const int r = row_base + 8 * hh;
#pragma unroll
      for (int dj = 0; dj < kDT; ++dj)
        st_shared_b32(sQ + sm90::detail::blocked_offset<kBM>(r, dj) + t * 4,
                      pack2<E>(o[dj][2 * hh] * inv, o[dj][2 * hh + 1] * inv));
      if (p.lse != nullptr && t == 0 && q0 + r < len_q) {
        const float lse = lsum > 0.f ? (m[hh] * sl2 + lg2(lsum)) * kLn2 : -INFINITY;
        p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q0 + r] = lse;
      }
    }
    sm90::named_barrier(1 + cw, 128);
    constexpr int kOutChunks = 64 * kCV;
#pragma unroll
    for (int i = 0; i < kOutChunks / 128; ++i) {
      const int idx = wtid + i * 128;
      const int r = cw * 64 + idx / kCV, c = idx % kCV;
      if (q0 + r < len_q)
        st_global_v4(og + (long long)(q0 + r) * p.o_stride_m + c * 8,
                     ld_shared_v4(sQ + sm90::detail::blocked_offset<kBM>(r, c)));
    }
  }
}

}  // namespace sm90
}  // namespace fa

// Defines the extern "C" kernel `name` for a config and mods struct (single identifiers).
// __launch_bounds__(384, 1) caps registers at entry (168) so setmaxnreg can redistribute.
#define FAJIT_DEFINE_FORWARD_SM90(name, Config, Mods)                     \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)      \
      name(const FaFwdParams p, const FaCaptures cap) {                   \
    fa::sm90::forward_kernel<Config, Mods>(p, cap);                       \
  }

#endif  // FAJIT_FORWARD_SM90_CUH
