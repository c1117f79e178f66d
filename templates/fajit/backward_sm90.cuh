// fajit backward attention for Hopper (sm_90a): the dK/dV kernel with wgmma and warp
// specialisation (FlashAttention-3's layout); the preprocess, dQ conversion and deterministic
// dQ kernels are fajit/backward.cuh's (same arguments, same scratch).
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ...forward members...; kScoreGrad; score_grad(...) };   // backward.cuh
//   #include "fajit/backward_sm90.cuh"
//   using FaBwdCfg = fa::Sm90BwdConfig<fa::bf16_t, 128, 128, 64, 3, false>;  // fa::default_tile()
//   FAJIT_DEFINE_BACKWARD_SM90(fajit_bwd, FaBwdCfg, FaMods)
// defines fajit_bwd_pre, fajit_bwd_dkdv, fajit_bwd_dq and fajit_bwd_dq_det as
// FAJIT_DEFINE_BACKWARD does; only the dK/dV kernel differs. NVRTC: --gpu-architecture=sm_90a.
//
// ---- Config (fa::Sm90BwdConfig<Element, DQK, DV, BLOCK_M, STAGES, DETERMINISTIC>) ---------
//   DQK, DV   head dims of Q, K and of V, O, dO: multiples of 8 from 32 to 128. Shared rows are
//             whole 64-column blocks (HeadRow::kPitch: 80 -> 128, K zero-filled past DQK), the
//             dK / dV accumulators each head dim up to a 16-column k-step (72 -> 80)
//   BLOCK_M   query rows per step (64 or 128; 128 only up to 64 / 64: the dK/dV accumulators of 128
//             keys x 128 and Sᵀ/dPᵀ of 128 queries do not fit the registers together)
//   STAGES    Q/dO/LSE/Δ stages (2..3; 3 where shared memory allows: codegen's default_tile)
//   BLOCK_N is fixed at 128 keys per CTA: two consumer warpgroups of 64 keys each.
//
// ---- Launch (host mirrors these) -----------------------------------------------------------
//   dkdv:  grid (ceil(len_kv / 128), batch * heads_kv), block 384 (kThreads),
//          dynamic shared memory kSmemBytes (> 48 KiB: set the function attribute); parameters
//          (FaBwdParams, FaCaptures, FaGradBuffers, FaTmaMap of dq_accum with boxes 32 x 64,
//          FaTmaPair of Q and dO with boxes 64 x BLOCK_M)
//   pre, dq, dq_det: as backward.cuh with BwdConfig<Element, DQK, DV, BLOCK_M, BLOCK_M / 16>.
//   Sparse block sizes must be multiples of BLOCK_M (q_block) and 128 (kv_block).
//
// ---- Structure (notation of KERNELS.md; one CTA = 128 keys of one KV head) -----------------
//   Warpgroup 0 (producer, setmaxnreg down to 24). Warps 0, 1: cp.async K and V once (mbarrier
//   bar_kv), then for each query head of the GQA group and each query tile the transposed
//   block tables list (partial, then full): Q and dO by TMA from one thread (cp.async from both
//   warps where the driver refuses a map, or FAJIT_TMA=0) and LSE, Δ by plain stores into a
//   stage (mbarrier full[s]: two expect_tx arrivals, or 64 cp.async ones, + 64 plain ones),
//   after waiting for the consumers to release it (empty[s], every consumer thread arrives).
//   Warps 2, 3: the dQ
//   writers of consumer warpgroups 1, 2 (FlashAttention-3's): each staged dQ part goes to
//   dq_accum by bulk fp32 reductions (cp.reduce.async.bulk.tensor through the accumulator's
//   tensor map, FaTmaMap; row by row without one), handshaking with its warpgroup through
//   named barriers (staging free / part staged), so no consumer waits on a reduction.
//   Warpgroups 1, 2 (consumers, setmaxnreg up to 240): keys 64·cw.., warpgroup 2 starting
//   once warpgroup 1 has issued its first dK (half a tile apart), per query tile
//     Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ           SS-wgmma m64n{BLOCK_M}, both issued at once
//     Pᵀ in registers                      (bwd::probs_t: mods), while dPᵀ runs
//     dV += Pᵀ·dO                          RS-wgmma (P packed as A), queued behind dPᵀ
//     dSᵀ in registers                     (bwd::dscores_t: score_grad), while dV runs
//     dK += dSᵀ·Q                          RS-wgmma (dS packed as A)
//     dSᵀ -> shared memory (double-buffered)
//     dQ_part = dS·K of the PREVIOUS tile  SS-wgmma, both operands MN-major, m64 n kDqN, once the
//                                          other warpgroup has ended that tile (named barriers
//                                          by tile parity; split by keys, its own dSᵀ only):
//                                          the two stay apart, one's softmax under the other's
//                                          GEMMs
//     (the stage goes back to the producer once dV and dK are done: dQ reads no stage)
//     dQ_part -> staging (fp32) for the writer warp; the last tile's part after the walk
//   The dQ tile (BLOCK_M x DQK) is split between the warpgroups: by rows at BLOCK_M 128, by
//   64-column blocks above DQK 64 (the second block's columns past DQK computed and dropped: an
//   MN-major operand splits only at a block), and at BLOCK_M 64 up to DQK 64 by keys (each sums
//   over its own 64 keys; both parts are reduced into the same rows).
//   Epilogue: dK·scale and dV staged in the K / V tiles, 16-byte stores (zero for keys no
//   query sees). Deterministic mode leaves dQ to backward.cuh's dq_det kernel.
#ifndef FAJIT_BACKWARD_SM90_CUH
#define FAJIT_BACKWARD_SM90_CUH

#include "fajit/backward.cuh"
#include "fajit/wgmma_sm90.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockM_, int kStages_ = 2,
          bool kDeterministic_ = false>
struct Sm90BwdConfig : AttentionTileShape<128, kHeadDimQK_, kHeadDimV_> {
  using Shape = AttentionTileShape<128, kHeadDimQK_, kHeadDimV_>;
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = kStages_;
  static constexpr bool kDeterministic = kDeterministic_;
  // The preprocess, dQ conversion and deterministic dQ kernels (backward.cuh).
  using Aux = BwdConfig<Element, kHeadDimQK, kHeadDimV, kBlockM, kBlockM / 16, 2, kDeterministic>;
  static constexpr int kPreThreads = Aux::kPreThreads;
  static constexpr int kPreRows = Aux::kPreRows;
  static constexpr int kDqRows = Aux::kDqRows;
  static constexpr int kDetThreads = Aux::kDetThreads;
  static constexpr int kDetSmemBytes = Aux::kDetSmemBytes;

  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kKeysPerWarpgroup = kBlockN / kConsumerWarpgroups;  // 64: one wgmma M
  static constexpr int kThreads = sm90::kWarpgroupThreads * (1 + kConsumerWarpgroups);
  static constexpr int kDkDvParts = 1;  // dK and dV of one CTA together (up to 128 / 128)
  // Columns of the dK and dV accumulators (the N of dK += dSᵀ·Q, dV += Pᵀ·dO): each head dim
  // up to a whole 16-column k-step; at 72 the last 8 come from zero-filled chunks and are never
  // stored.
  static constexpr int kHeadDimNQK = Shape::RowQK::kUsed * 8;
  static constexpr int kHeadDimNV = Shape::RowV::kUsed * 8;
  // K's rows zero-filled to the whole pitch: dQ's part of the second 64-column block reads all
  // 64 of its columns (those past DQK land in dQ columns that are never written back).
  struct RowKPitch : Shape::RowQK {
    static constexpr int kUsed = Shape::RowQK::kPitch;
  };
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;  // 128 * 24 + 256 * 240 <= 65536
  static constexpr int kLoadThreads = 64;    // producer warps 0, 1 load; warps 2, 3 write dQ

  static constexpr int kQT = kBlockM / 8;          // 8-column n-tiles of Sᵀ (queries)
  static constexpr int kMK = kBlockM / 16;         // k-steps over queries (dV, dK)
  static constexpr int kKV = Shape::RowV::kSteps;  // k-steps of dPᵀ = V·dOᵀ (kKQ: of Sᵀ)
  // dQ split: rows (BLOCK_M 128: 64 query rows each), 64-column blocks (above DQK 64: block cw
  // each, the second one's columns past DQK dropped), or keys (BLOCK_M 64 up to DQK 64: each
  // warpgroup's sum over its own 64 keys, both reduced into the same dQ rows). Every
  // warpgroup's part is m64 n kDqN, every tile: no branch around a wgmma (whole tiles in turn
  // made ptxas serialize every wgmma of the kernel).
  static constexpr bool kTwoBlocks = kHeadDimQK > 64;
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr bool kDqSplitCols = kBlockM == 64 && kTwoBlocks;
  static constexpr bool kDqSplitKeys = kBlockM == 64 && !kTwoBlocks;
  static constexpr int kDqN = kTwoBlocks ? 64 : kHeadDimNQK;

  static constexpr int kSmemKBytes = kBlockN * Shape::RowQK::kRowBytes;
  static constexpr int kSmemVBytes = kBlockN * Shape::RowV::kRowBytes;
  static constexpr int kSmemQBytes = kBlockM * Shape::RowQK::kRowBytes;  // per stage
  static constexpr int kSmemDoBytes = kBlockM * Shape::RowV::kRowBytes;  // per stage
  static constexpr int kSmemDsBytes = kBlockN * kBlockM * 2;             // per buffer (2)
  static constexpr int kSmemRowsBytes = kBlockM * 4 * 2;                 // LSE, Δ per stage
  static constexpr int kNumBarriers = 1 + 2 * kStages;                   // kv, full, empty
  // dQ parts staged for the writer warps: fp32, per consumer warpgroup 64 rows of kDqN values,
  // either two boxes of 64 rows x 32 values in the tensor map's 128B swizzle (16 KiB,
  // conflict-free for the consumers' 8-byte stores), or rows for row-by-row reductions (no
  // tensor map), padded to 288 B (conflict-free) where shared memory allows, else 256 B (the
  // stores then conflict 8-way: the fallback path of 3 stages at D 128 only).
  static constexpr int kSmemDqOffset =
      kSmemKBytes + kSmemVBytes + kStages * (kSmemQBytes + kSmemDoBytes) + 2 * kSmemDsBytes;
  static constexpr int kSmemOtherBytes =
      sm90::kSwizzleAtomBytes + kSmemDqOffset + kStages * kSmemRowsBytes + sm90::kMbarBytes * kNumBarriers;
  static constexpr int kDqRowBytes =
      kSmemOtherBytes + kConsumerWarpgroups * 64 * 288 <= 227 * 1024 ? 288 : 256;
  static constexpr int kDqBoxBytes = 64 * sm90::kSw128RowBytes;  // 64 rows x 32 fp32
  static constexpr int kSmemDqBytes = 64 * kDqRowBytes;          // per consumer warpgroup (1 KiB multiple)
  static constexpr int kSmemRowsOffset = kSmemDqOffset + kConsumerWarpgroups * kSmemDqBytes;
  static constexpr int kSmemBarOffset = kSmemRowsOffset + kStages * kSmemRowsBytes;
  static constexpr int kSmemBytes =
      sm90::kSwizzleAtomBytes + kSmemBarOffset + sm90::kMbarBytes * kNumBarriers;

  static_assert(kHeadDimQK % 8 == 0 && kHeadDimQK >= 32 && kHeadDimQK <= 128 && kHeadDimV % 8 == 0 &&
                    kHeadDimV >= 32 && kHeadDimV <= 128,
                "head dims must be multiples of 8, 32..128");
  static_assert(kBlockM == 64 || kBlockM == 128, "BLOCK_M must be 64 or 128");
  static_assert(kBlockM == 64 || (kHeadDimQK <= 64 && kHeadDimV <= 64),
                "BLOCK_M 128 needs head dims up to 64 (registers)");
  static_assert(kStages >= 2 && kStages <= 3, "STAGES must be 2 or 3");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

namespace sm90 {

// Named barriers of the backward's consumers (0 is __syncthreads).
constexpr int kBarDkdvDone = 2;  // both warpgroups done with K, V (256 threads)
constexpr int kBarStaged = 3;    // + consumer index: that warpgroup's dK, dV staged (128)
constexpr int kBarDqFull = 5;    // + consumer index: its dQ part staged (128 + its writer warp)
constexpr int kBarDqFree = 7;    // + consumer index: its staging read by the writer (128 + 32)
// + 2 · consumer index + (tile & 1): that warpgroup has ended a tile (its dSᵀ staged, its dQ
// part of the tile before read out); arrived on by it, waited on by the other (256 threads).
// Two ids per warpgroup by tile parity: a warpgroup may end tile n + 1 before the other has
// waited for tile n, and one id would then count both arrivals as the 256.
constexpr int kBarTileEnded = 9;
// Warpgroup 1 starts once warpgroup 0 has issued its first tile's dK: half a tile apart, one's
// softmax runs under the other's GEMMs from the start (256 threads).
constexpr int kBarStagger = 13;

template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dkdv_kernel(const FaBwdParams& p, const FaCaptures& cap,
                                                     const FaGradBuffers& grads, const FaTmaMap& dq_map,
                                                     const FaTmaPair& qdo) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kKeys = Cfg::kKeysPerWarpgroup;
  constexpr int kWG = kWarpgroupThreads;
  constexpr int kQT = Cfg::kQT;
  constexpr int kTileBlock = kBN * kSw128RowBytes;  // one 64-column block of a 128-row tile

  extern __shared__ unsigned char smem_raw[];
  const u32 sK = (smem_addr(smem_raw) + (kSwizzleAtomBytes - 1)) & ~u32(kSwizzleAtomBytes - 1);
  const u32 sV = sK + Cfg::kSmemKBytes;
  const u32 sStages = sV + Cfg::kSmemVBytes;
  auto sQ = [&](int s) { return sStages + s * (Cfg::kSmemQBytes + Cfg::kSmemDoBytes); };
  auto sDo = [&](int s) { return sQ(s) + Cfg::kSmemQBytes; };
  const u32 sDs0 = sStages + kStages * (Cfg::kSmemQBytes + Cfg::kSmemDoBytes);
  auto sDs = [&](int buf) { return sDs0 + buf * Cfg::kSmemDsBytes; };
  auto sLse = [&](int s) { return sK + Cfg::kSmemRowsOffset + s * Cfg::kSmemRowsBytes; };
  auto sDelta = [&](int s) { return sLse(s) + kBM * 4; };
  const u32 bar_kv = sK + Cfg::kSmemBarOffset;
  auto bar_full = [&](int s) { return bar_kv + kMbarBytes * (1 + s); };
  auto bar_empty = [&](int s) { return bar_kv + kMbarBytes * (1 + kStages + s); };
  auto sDqPart = [&](int cw) { return sK + Cfg::kSmemDqOffset + cw * Cfg::kSmemDqBytes; };
  // The rows and columns of dQ's tile that consumer warpgroup cw's m64 n kDqN part covers.
  auto dq_row0 = [](int cw) { return Cfg::kDqSplitRows ? 64 * cw : 0; };
  auto dq_col0 = [](int cw) { return Cfg::kDqSplitCols ? 64 * cw : 0; };

  const int tid = threadIdx.x;
  const int warpgroup = tid / kWG;
  const KeyBlockCta cta(kBN, p.heads_kv);
  const int kv0 = cta.kv0, b = cta.b, hkv = cta.hkv;
  const int group = p.heads_q / p.heads_kv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  if (tid == 0) {
    mbar_init(bar_kv, Cfg::kLoadThreads);
    for (int s = 0; s < kStages; ++s) {
      // cp.async (or two expect_tx arrivals with TMA) + plain arrivals of the loader threads
      mbar_init(bar_full(s), (qdo.enabled ? 2 : Cfg::kLoadThreads) + Cfg::kLoadThreads);
      // every consumer thread arrives: the producer overwrites the stage's LSE/Δ rows with plain
      // stores, so each reader's own arrival orders its reads before them (a warp leader's
      // arrival after __syncwarp does too, but racecheck cannot see that and reports hazards)
      mbar_init(bar_empty(s), 2 * kWG);
    }
  }
  __syncthreads();

  // Every role below walks, per query head hq, the query tiles that see this CTA's keys with a
  // TileCursor over len_q: the same tiles in the same order (sub-tiles past len_q skipped alike).
  if (warpgroup == 0) {
    // ================= producer ==============================================================
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid >= Cfg::kLoadThreads) {  // warps 2, 3
      if constexpr (!Cfg::kDeterministic) {
        // dQ writer of consumer warpgroup `part`: walks the tables as the consumers do (the
        // place of each part: no data from the consumers but the part itself); for each of its
        // parts hands the staging back once the previous part's bulk reductions have read it,
        // waits for the part, then reduces it into dq_accum: two tensor-map boxes from one
        // lane, else one bulk reduction per row (rows past len_q skipped). The consumers never
        // wait on the reductions themselves (FlashAttention-3's dQ writer).
        const int part = tid / 32 - 2, lane = tid & 31;
        const int row0 = dq_row0(part), col0 = dq_col0(part);
        // dQ's columns in this part: those past DQK (the second block above 64, or 72's zero
        // chunk) are computed but not reduced
        const int cols = Cfg::kHeadDimQK - col0 < Cfg::kDqN ? Cfg::kHeadDimQK - col0 : Cfg::kDqN;
        for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
          const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
          for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); cur.next(walk, len_q)) {
            const int q0 = cur.start + row0;
            bulk_wait_read<0>();
            __syncwarp();
            named_barrier_arrive(kBarDqFree + part, kWG + 32);
            named_barrier(kBarDqFull + part, kWG + 32);
            if (dq_map.enabled) {
              if (lane == 0) {
#pragma unroll
                for (int blk = 0; blk < (Cfg::kDqN + 31) / 32; ++blk)
                  if (32 * blk < cols)  // (a box's columns past D are clipped by the map)
                    tma_reduce_add_4d(&dq_map.map, sDqPart(part) + blk * Cfg::kDqBoxBytes, col0 + 32 * blk,
                                      q0, hq, b);
                bulk_commit();
              }
            } else {
              float* dqa =
                  p.dq_accum + (((long long)b * p.heads_q + hq) * len_q + q0) * Cfg::kHeadDimQK + col0;
#pragma unroll
              for (int r = lane; r < 64; r += 32)
                if (q0 + r < len_q)
                  bulk_reduce_add_f32(dqa + r * Cfg::kHeadDimQK, sDqPart(part) + r * Cfg::kDqRowBytes,
                                      cols * 4);
              bulk_commit();
            }
          }
        }
        bulk_wait<0>();  // done before the CTA's shared memory goes
      }
      return;
    }
    load_tile_sw128<kBN, typename Cfg::RowKPitch, Cfg::kLoadThreads>(
        sK, bwd::row_base<E>(p.k, p.k_stride_b, p.k_stride_h, b, hkv), p.k_stride_n, kv0, len_kv, tid);
    load_tile_sw128<kBN, typename Cfg::RowV, Cfg::kLoadThreads>(
        sV, bwd::row_base<E>(p.v, p.v_stride_b, p.v_stride_h, b, hkv), p.v_stride_n, kv0, len_kv, tid);
    mbar_arrive_cp_async(bar_kv);
    // warps 0, 1: Q, dO, LSE and Δ of each query tile into the stages (with the writers'
    // branch beside it ptxas spills 100-160 instructions in the producer's 24 registers)
    StageRing<kStages> ring;
    for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
      const E* qg = bwd::row_base<E>(p.q, p.q_stride_b, p.q_stride_h, b, hq);
      const E* dog = bwd::row_base<E>(p.dout, p.do_stride_b, p.do_stride_h, b, hq);
      const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
      for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); cur.next(walk, len_q)) {
        const int q0 = cur.start;
        mbar_wait(bar_empty(ring.stage), ring.phase ^ 1u);
        if (qdo.enabled) {  // Q and dO by TMA, boxes of 64 columns x BLOCK_M rows, one thread
          if (tid == 0) {   // each arms the stage's barrier with its bytes (an arrival each)
            tma_load_tile<kBM, typename Cfg::RowQK>(sQ(ring.stage), &qdo.a, q0, hq, b, bar_full(ring.stage));
            tma_load_tile<kBM, typename Cfg::RowV>(sDo(ring.stage), &qdo.b, q0, hq, b, bar_full(ring.stage));
          }
        } else {
          load_tile_sw128<kBM, typename Cfg::RowQK, Cfg::kLoadThreads>(sQ(ring.stage), qg, p.q_stride_m, q0,
                                                                       len_q, tid);
          load_tile_sw128<kBM, typename Cfg::RowV, Cfg::kLoadThreads>(sDo(ring.stage), dog, p.do_stride_m, q0,
                                                                      len_q, tid);
          mbar_arrive_cp_async(bar_full(ring.stage));
        }
        bwd::stage_row_stats<kBM, Cfg::kLoadThreads>(sLse(ring.stage), sDelta(ring.stage), p, b, hq, q0, tid);
        mbar_arrive(bar_full(ring.stage));
        ring.advance();
      }
    }
    cp_async_wait_all();
    return;
  }

  // ================= consumers: keys kv0 + 64·cw .. + 63 =========================================
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int cw = warpgroup - 1;
  const int wtid = tid - kWG * warpgroup;
  const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const bwd::KeyRows kr(kv0 + cw * kKeys + warp * 16 + g, len_kv);
  const bool key_tail = kv0 + kBN > len_kv;
  const float sn = natural_scale(Mods::kHasScoreMod, p.scale);

  float dk[Cfg::kHeadDimNQK / 8][4], dv[Cfg::kHeadDimNV / 8][4];
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDimNQK / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[j][i] = 0.f;
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDimNV / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) dv[j][i] = 0.f;

  // Operand descriptors. K, V rows of this warpgroup as K-major A of Sᵀ, dPᵀ; Q, dO (a stage)
  // as K-major B of Sᵀ, dPᵀ and as MN-major B of dK, dV; dSᵀ as MN-major A and K as MN-major B
  // of dQ = dS·K.
  const u64 dk_a = desc_sw128(sK + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dv_a = desc_sw128(sV + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dq_b = desc_sw128(sQ(0), 16, kSwizzleAtomBytes);
  const u64 ddo_b = desc_sw128(sDo(0), 16, kSwizzleAtomBytes);
  const u64 dq_bt = desc_sw128(sQ(0), kBM * kSw128RowBytes, kSwizzleAtomBytes);
  const u64 ddo_bt = desc_sw128(sDo(0), kBM * kSw128RowBytes, kSwizzleAtomBytes);
  const u64 dds_at = desc_sw128(sDs(0), kTileBlock, kSwizzleAtomBytes);
  const u64 dkk_bt = desc_sw128(sK, kTileBlock, kSwizzleAtomBytes);
  constexpr int kStageBytes = Cfg::kSmemQBytes + Cfg::kSmemDoBytes;

  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: two commit groups.
  auto issue_s_dp = [&](float(&s)[kQT][4], float(&dp)[kQT][4], int stage) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk)
      wgmma_ss<E, kBM>(s, desc_advance(dk_a, kmajor_kstep_offset<kBN>(kk)),
                       desc_advance(dq_b, stage * kStageBytes + kmajor_kstep_offset<kBM>(kk)), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKV; ++kk)
      wgmma_ss<E, kBM>(dp, desc_advance(dv_a, kmajor_kstep_offset<kBN>(kk)),
                       desc_advance(ddo_b, stage * kStageBytes + kmajor_kstep_offset<kBM>(kk)), kk > 0);
    wgmma_commit();
  };
  // dV += Pᵀ·dO, then dK += dSᵀ·Q: a commit group each.
  auto issue_dv = [&](const u32(&pa)[Cfg::kMK][4], int stage) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kMK; ++kk)
      wgmma_rs<E, Cfg::kHeadDimNV>(dv, pa[kk],
                                   desc_advance(ddo_bt, stage * kStageBytes + mnmajor_kstep_offset(kk)), 1);
    wgmma_commit();
  };
  auto issue_dk = [&](const u32(&da)[Cfg::kMK][4], int stage) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kMK; ++kk)
      wgmma_rs<E, Cfg::kHeadDimNQK>(dk, da[kk],
                                    desc_advance(dq_bt, stage * kStageBytes + mnmajor_kstep_offset(kk)), 1);
    wgmma_commit();
  };
  // This warpgroup's m64 n kDqN part of dQ = dS·K (rows row0.., columns col0.., keys key0..):
  // one commit group.
  const int row0 = dq_row0(cw), col0 = dq_col0(cw);
  constexpr int kDqKSteps = (Cfg::kDqSplitKeys ? kKeys : kBN) / 16;
  const u32 key0 = mnmajor_kstep_offset(Cfg::kDqSplitKeys ? cw * (kKeys / 16) : 0);
  auto issue_dq = [&](float(&dq)[Cfg::kDqN / 8][4], int buf) {
#pragma unroll
    for (int kk = 0; kk < kDqKSteps; ++kk)
      wgmma_ss_mn<E, Cfg::kDqN>(
          dq,
          desc_advance(dds_at,
                       buf * Cfg::kSmemDsBytes + (row0 / 64) * kTileBlock + key0 + mnmajor_kstep_offset(kk)),
          desc_advance(dkk_bt, (col0 / 64) * kTileBlock + key0 + mnmajor_kstep_offset(kk)), kk > 0);
    wgmma_commit();
  };
  // The part to the staging, once the writer warp has read the previous one.
  auto stage_dq = [&](const float(&dq)[Cfg::kDqN / 8][4]) {
    named_barrier(kBarDqFree + cw, kWG + 32);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int j = 0; j < Cfg::kDqN / 8; ++j) {
        // row r (r % 8 == g), columns 8j + 2t, 8j + 2t + 1: in swizzled box j / 4, 16-byte
        // chunk (2 (j % 4) + t / 2) ^ g of row r; or at 4 (8j + 2t) of a padded row
        const int r = warp * 16 + g + 8 * hh;
        const u32 off = dq_map.enabled ? (j / 4) * Cfg::kDqBoxBytes + r * kSw128RowBytes +
                                             ((((j % 4) * 2 + (t >> 1)) ^ g) << 4) + (t & 1) * 8
                                       : r * Cfg::kDqRowBytes + (8 * j + 2 * t) * 4;
        st_shared_v2_f32(sDqPart(cw) + off, dq[j][2 * hh], dq[j][2 * hh + 1]);
      }
    fence_proxy_async();
    named_barrier_arrive(kBarDqFull + cw, kWG + 32);
  };
  // Waits until the other consumer warpgroup has ended its n-th tile. Split by keys, a
  // warpgroup's dQ reads only its own dSᵀ rows: a barrier of its own 128 threads (their dSᵀ
  // stores of the previous tile before the wgmma reads them).
  constexpr bool kDqReadsBoth = !Cfg::kDqSplitKeys;
  auto wait_tile_ended = [&](int n) {
    if constexpr (kDqReadsBoth)
      named_barrier(kBarTileEnded + 2 * (1 - cw) + (n & 1), 2 * kWG);
    else
      named_barrier(kBarTileEnded + 2 * cw, kWG);
  };

  mbar_wait(bar_kv, 0);
  fence_proxy_async();
  if (cw == 1) named_barrier(kBarStagger, 2 * kWG);
  StageRing<kStages> ring;
  int n_done = 0;  // query tiles done: picks the dSᵀ buffer and the tile-end barrier
  for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
    const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
    for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); ++n_done) {
      const int stage = ring.stage;
      const int q0 = cur.start;
      const bool is_full = cur.is_full(walk);
      const int buf = n_done & 1;

      mbar_wait(bar_full(stage), ring.phase);
      if (!qdo.enabled) fence_proxy_async();  // cp.async Q/dO; TMA's need only the mbarrier
      float s[kQT][4], dp[kQT][4];
      wgmma_fence();
      issue_s_dp(s, dp, stage);
      cur.next(walk, len_q);  // the next tile's block index loads while Sᵀ and dPᵀ run

      // ---- Pᵀ from Sᵀ while dPᵀ is still on the tensor cores. At BLOCK_M 64, dV += Pᵀ·dO is
      // queued behind dPᵀ and dSᵀ formed while it runs; at BLOCK_M 128 the registers do not hold
      // Pᵀ, dPᵀ and the in-flight P operand together (ptxas serializes), so dV waits for dSᵀ.
      wgmma_wait<1>();
      pin(s);
      float sc[Mods::kScoreGrad ? kQT : 1][4];
      bwd::probs_t<Mods>(s, sc, kr, q0, t, len_q, len_kv, key_tail, is_full, p.scale, sn, b, hq, cap,
                         [&](int col) { return ld_shared_v2_f32(sLse(stage) + col * 4); });
      constexpr bool kDvEarly = kBM == 64;
      u32 pa[Cfg::kMK][4];
      if constexpr (kDvEarly) {
        pack_a<E>(pa, s);
        wgmma_fence();
        issue_dv(pa, stage);
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }

      // ---- dSᵀ from dPᵀ, then dK += dSᵀ·Q
      pin(dp);
      bwd::dscores_t<Mods>(dp, s, sc, kr, q0, t, len_q, b, hq, cap, grads,
                           [&](int col) { return ld_shared_v2_f32(sDelta(stage) + col * 4); });
      u32 da[Cfg::kMK][4];
      if constexpr (!kDvEarly) pack_a<E>(pa, s);
      pack_a<E>(da, dp);
      wgmma_fence();
      if constexpr (!kDvEarly) issue_dv(pa, stage);
      issue_dk(da, stage);
      if (cw == 0 && n_done == 0) named_barrier_arrive(kBarStagger, 2 * kWG);

      // ---- dSᵀ (this warpgroup's 64 key rows) to shared memory, then this warpgroup's part
      // of the previous tile's dQ = dS·K (else dQ comes from backward.cuh's dq_det kernel).
      // One tile late, so a warpgroup waits only for the other to have ended the previous
      // tile, not for it to reach this point of this one: the two need not run in lockstep.
      bool mine = false;
      float dq[Cfg::kDqN / 8][4];
      if constexpr (!Cfg::kDeterministic) {
        // this tile's buffer held dSᵀ of tile n - 2, which the other warpgroup's dQ read in tile
        // n - 1; that tile's end also has its dSᵀ of tile n - 1 staged
        if (n_done > 0) wait_tile_ended(n_done - 1);
        stage_packed<Sw128Blocks<kBN>>(sDs(buf), da, cw * kKeys + warp * 16 + g, t);
        fence_proxy_async();
        // (at the first tile a product of the unused buffer, never staged: a branch around
        // the wgmma would make ptxas serialize every wgmma of the kernel)
        issue_dq(dq, buf ^ 1);
        mine = n_done > 0;
      }
      // dV and dK done: the stage goes back to the producer (dQ reads no stage), then dQ
      wgmma_wait<Cfg::kDeterministic ? 0 : 1>();
      pin(dk);
      pin(dv);
      pin(pa);
      pin(da);
      mbar_arrive(bar_empty(stage));
      wgmma_wait<0>();
      pin(dq);
      if (mine) stage_dq(dq);
      if constexpr (!Cfg::kDeterministic && kDqReadsBoth)
        named_barrier_arrive(kBarTileEnded + 2 * cw + (n_done & 1), 2 * kWG);
      ring.advance();
    }
  }
  if (cw == 0 && n_done == 0) named_barrier_arrive(kBarStagger, 2 * kWG);  // no tiles at all
  if constexpr (!Cfg::kDeterministic) {                                    // the last tile's dQ part
    if (n_done > 0) {
      wait_tile_ended(n_done - 1);
      float dq[Cfg::kDqN / 8][4];
      wgmma_fence();
      issue_dq(dq, (n_done - 1) & 1);
      wgmma_wait<0>();
      pin(dq);
      stage_dq(dq);
    }
  }

  // ---- epilogue: dK·scale and dV staged in the K / V tiles once both warpgroups are done with
  // them, 16-byte stores of this warpgroup's rows (rows past len_kv are not written).
  named_barrier(kBarDkdvDone, 2 * kWG);
  {
    const float kscale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
    const int row = cw * kKeys + warp * 16 + g;
    stage_rows<E, Sw128Blocks<kBN>>(sK, dk, kscale, row, t);
    stage_rows<E, Sw128Blocks<kBN>>(sV, dv, one, row, t);
  }
  named_barrier(kBarStaged + cw, kWG);
  E* dkg = static_cast<E*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  E* dvg = static_cast<E*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
  store_rows<kKeys, Cfg::RowQK::kChunks, kWG, Sw128Blocks<kBN>>(dkg, p.dk_stride_n, sK, cw * kKeys, kv0,
                                                                len_kv, wtid);
  store_rows<kKeys, Cfg::RowV::kChunks, kWG, Sw128Blocks<kBN>>(dvg, p.dv_stride_n, sV, cw * kKeys, kv0,
                                                               len_kv, wtid);
}

}  // namespace sm90
}  // namespace fa

// Defines the extern "C" kernels name##_pre, name##_dkdv, name##_dq, name##_dq_det (single
// identifiers). __launch_bounds__(384, 1) caps registers at entry so setmaxnreg can redistribute.
#define FAJIT_DEFINE_BACKWARD_SM90(name, Config, Mods)                                                    \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_pre(const FaBwdParams p) {     \
    fa::backward_pre_kernel<typename Config::Aux>(p);                                                     \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)                                       \
      name##_dkdv(const FaBwdParams p, const FaCaptures cap, const FaGradBuffers grads,                   \
                  const __grid_constant__ FaTmaMap dq_map, const __grid_constant__ FaTmaPair qdo) {       \
    fa::sm90::backward_dkdv_kernel<Config, Mods>(p, cap, grads, dq_map, qdo);                             \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_dq(const FaBwdParams p) {      \
    fa::backward_dq_kernel<typename Config::Aux>(p);                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(Config::kDetThreads)                                       \
      name##_dq_det(const FaBwdParams p, const FaCaptures cap) {                                          \
    if constexpr (Config::kDeterministic) fa::backward_dq_det_kernel<typename Config::Aux, Mods>(p, cap); \
  }

#endif  // FAJIT_BACKWARD_SM90_CUH
