// fajit backward attention for Hopper (sm_90a): the dK/dV kernel with wgmma and warp
// specialisation (FlashAttention-3's layout); the preprocess, dQ conversion and deterministic
// dQ kernels are fajit/backward.cuh's (same arguments, same scratch).
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ...forward members...; kScoreGrad; score_grad(...); kMaskReadsBuffers };  // backward.cuh
//   #include "fajit/backward_sm90.cuh"
//   using FaBwdCfg = fa::Sm90BwdConfig<fa::bf16_t, 128, 128, 64, 3, false>;  // fa::default_tile()
//   FAJIT_DEFINE_BACKWARD_SM90(fajit_bwd, FaBwdCfg, FaMods)
// defines fajit_bwd_pre, fajit_bwd_dkdv, fajit_bwd_dq and fajit_bwd_dq_det as
// FAJIT_DEFINE_BACKWARD does (a chain of programmatic dependent launches); only the dK/dV
// kernel differs: its producer loads K and V before it waits for the preprocess, and only the
// threads that read Δ (the producer) or reduce into dq_accum wait. NVRTC: --gpu-architecture=sm_90a.
//
// ---- Config (fa::Sm90BwdConfig<Element, DQK, DV, BLOCK_M, STAGES, DETERMINISTIC>) ---------
//   DQK, DV   head dims of Q, K and of V, O, dO: multiples of 8 from 32 to 128. Shared rows are
//             whole 64-column blocks (HeadRow::kPitch: 80 -> 128, K zero-filled past DQK), the
//             dK / dV accumulators each head dim up to a 16-column k-step (72 -> 80)
//   BLOCK_M   query rows per step (64 or 128; 128 only up to 64 / 64: the dK/dV accumulators of 128
//             keys x 128 and Sᵀ/dPᵀ of 128 queries do not fit the registers together)
//   STAGES    Q/dO/LSE/Δ stages (2..3; 3 where shared memory allows: codegen's default_tile)
//   BLOCK_N is fixed at 128 keys per CTA: two consumer warpgroups of 64 keys each.
// ---- Config above a head dim of 128 (fa::Sm90WideBwdConfig<Element, DQK, DV, STAGES, DET>) --
//   DQK, DV up to 256 each; BLOCK_M 64, BLOCK_N 64 (32 keys per consumer warpgroup); the
//   wide-head kernel (backward_dkdv_wide_kernel, described above it). The macro picks the kernel
//   by Config::kWide; launch, parameters and scratch as below with 64 for 128.
//
// ---- Launch (host mirrors these) -----------------------------------------------------------
//   dkdv:  grid (ceil(len_kv / BLOCK_N), batch * heads_kv), block 384 (kThreads),
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
//   writers of consumer warpgroups 1, 2 (FlashAttention-3's; by turns warp 2 alone takes the
//   parts of both): each staged dQ part goes to
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
//   The dQ tile (BLOCK_M x DQK) is split between the warpgroups: by rows at BLOCK_M 128, at
//   BLOCK_M 64 up to DQK 64 by keys (each sums over its own 64 keys; both parts are reduced into
//   the same rows), and above DQK 64 by tiles (kDqByTurns, cuDNN's way: the whole m64 n DQK
//   part over both warpgroups' 128 keys by one warpgroup, the two in turn, issued once its dK
//   and dV have completed rather than beside them, staged into one staging for warp 2; with
//   a score_mod that has its own derivative above DQK 96, by 64-column blocks instead, each
//   warpgroup its block of every tile, the second block's columns past DQK dropped).
//   Epilogue: dK·scale and dV staged in the K / V tiles, 16-byte stores (zero for keys no
//   query sees).
//   Deterministic mode (kDqOrdered): the same parts, added into dq_accum in a fixed order. Each
//   64 query rows of a (b, query head) have a counter (FaBwdParams::dq_order); a writer finds its
//   part's place among the CTAs that add into those rows (their key blocks, ascending, counted
//   in the forward's tables: dq_order_place), waits until the counter reaches it, reduces, waits
//   for the reduction to complete and counts one more. The wait is bounded (dq_order_wait):
//   tables that break the order cost half a second or more a part and lose the fixed order, not
//   the sum. A CTA waits only on CTAs of lower key blocks of its own head, which the grid starts
//   first (grid_tile), so the waits cannot close a cycle. The wide-head kernel's deterministic
//   mode leaves dQ to backward.cuh's dq_det kernel.
#ifndef FAJIT_BACKWARD_SM90_CUH
#define FAJIT_BACKWARD_SM90_CUH

#include "fajit/backward.cuh"
#include "fajit/wgmma_sm90.cuh"

namespace fa {

// What both Hopper dK/dV configs share: the tile's shape, the preprocess / dQ conversion /
// deterministic dQ kernels' config, the warp roles and registers, and the shared-memory places
// BwdSmem, init_bwd_barriers and produce_bwd_tiles read (K, V, stages of Q and dO, LSE / Δ rows
// per stage at kSmemRowsOffset, mbarriers at kSmemBarOffset: those two each config places).
template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockM_, int kBlockN_, int kStages_,
          bool kDeterministic_>
struct Sm90BwdTile : AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_> {
  using Shape = AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_>;
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
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
  static constexpr int kKeysPerWarpgroup = kBlockN / kConsumerWarpgroups;
  static constexpr int kThreads = sm90::kWarpgroupThreads * (1 + kConsumerWarpgroups);
  static constexpr int kDkDvParts = 1;  // dK and dV of one CTA together
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;        // 128 * 24 + 256 * 240 <= 65536
  static constexpr int kLoadThreads = 64;          // producer warps 0, 1 load; warps 2, 3 write dQ (if any)
  static constexpr int kKV = Shape::RowV::kSteps;  // k-steps of dP (kKQ: of S)

  static constexpr int kSmemKBytes = kBlockN * Shape::RowQK::kRowBytes;
  static constexpr int kSmemVBytes = kBlockN * Shape::RowV::kRowBytes;
  static constexpr int kSmemQBytes = kBlockM * Shape::RowQK::kRowBytes;  // per stage
  static constexpr int kSmemDoBytes = kBlockM * Shape::RowV::kRowBytes;  // per stage
  static constexpr int kSmemRowsBytes = kBlockM * 4 * 2 + 16;            // LSE, Δ, TileInfo per stage
  static constexpr int kNumBarriers = 1 + 2 * kStages;                   // kv, full, empty
  // The first byte past K, V and the stages: the config's own tiles (BwdSmem::own).
  static constexpr int kSmemOwnOffset = kSmemKBytes + kSmemVBytes + kStages * (kSmemQBytes + kSmemDoBytes);

  static_assert(kStages >= 2 && kStages <= 3, "STAGES must be 2 or 3");
};

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockM_, int kStages_ = 2,
          bool kDeterministic_ = false>
struct Sm90BwdConfig
    : Sm90BwdTile<Element_, kHeadDimQK_, kHeadDimV_, kBlockM_, 128, kStages_, kDeterministic_> {
  using Base = Sm90BwdTile<Element_, kHeadDimQK_, kHeadDimV_, kBlockM_, 128, kStages_, kDeterministic_>;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDimQK, Base::kHeadDimV, Base::kStages, Base::kNumBarriers,
      Base::kConsumerWarpgroups, Base::kSmemOwnOffset, Base::kSmemRowsBytes;
  using typename Base::Shape;
  static constexpr bool kWide = false;  // backward_dkdv_kernel (not the wide-head one)
  // Deterministic mode: dQ by the writers in a fixed order (above), not by the dq_det kernel.
  static constexpr bool kDqOrdered = kDeterministic_;
  // Whether the consumers may take each tile from its stage's TileInfo: at BLOCK_M 128, for a
  // mask_mod that reads buffers (backward_dkdv_kernel: Mods::kMaskReadsBuffers). At BLOCK_M 64
  // they walk the tables themselves (there d128 causal ran 0.97x, softcap 0.98x published).
  static constexpr bool kPublishTiles = kBlockM == 128;
  // 64 keys per consumer warpgroup: one wgmma M. Columns of the dK and dV accumulators (the N
  // of dK += dSᵀ·Q, dV += Pᵀ·dO): each head dim up to a whole 16-column k-step; at 72 the last
  // 8 come from zero-filled chunks and are never stored.
  static constexpr int kHeadDimNQK = Shape::RowQK::kUsed * 8;
  static constexpr int kHeadDimNV = Shape::RowV::kUsed * 8;
  // K's rows zero-filled to the whole pitch: dQ's B operand reads K's columns up to kDqN
  // (those past DQK land in dQ columns that are never written back).
  struct RowKPitch : Shape::RowQK {
    static constexpr int kUsed = Shape::RowQK::kPitch;
  };

  static constexpr int kQT = kBlockM / 8;   // 8-column n-tiles of Sᵀ (queries)
  static constexpr int kMK = kBlockM / 16;  // k-steps over queries (dV, dK)
  // dQ split: rows (BLOCK_M 128: 64 query rows each, every tile), keys (BLOCK_M 64 up to DQK
  // 64: each warpgroup's sum over its own 64 keys, both reduced into the same dQ rows, every
  // tile), or tiles (above DQK 64, kDqByTurns: a tile's whole m64 n DQK part over both
  // warpgroups' 128 keys by one warpgroup, the two in turn, as cuDNN's d128 kernel does: 48 KB of
  // operand reads per tile against 64 KB for two m64n64 halves). Each part is m64 n kDqN. A
  // part by turns is issued, waited for and staged inside its branch once dK and dV have
  // completed: with a wgmma in flight across a branch ptxas serializes every wgmma of the
  // kernel (C7520).
  static constexpr bool kTwoBlocks = kHeadDimQK > 64;
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr bool kDqSplitKeys = kBlockM == 64 && !kTwoBlocks;
  // Above DQK 64 by turns (kDqByTurns), or by 64-column blocks (each warpgroup block cw of every
  // tile, the second one's columns past DQK dropped: an MN-major operand splits only at a block)
  // where the mods hold too many registers for a whole part (backward_dkdv_kernel's kDqByTurns;
  // kDqNFor is a part's width, the kernel's kDqN, which the comments here call kDqN too).
  template <bool kByTurns>
  static constexpr int kDqNFor = kTwoBlocks && !kByTurns ? 64 : kHeadDimNQK;
  static constexpr bool kDqMayTurn = kBlockM == 64 && kTwoBlocks;

  static constexpr int kSmemDsBytes = kBlockN * kBlockM * 2;  // per buffer (2)
  // dQ parts staged for the writer warps: fp32, per consumer warpgroup 64 rows of kDqN values,
  // either two boxes of 64 rows x 32 values in the tensor map's 128B swizzle (16 KiB,
  // conflict-free for the consumers' 8-byte stores), or rows for row-by-row reductions (no
  // tensor map), padded to 288 B (conflict-free) where shared memory allows, else 256 B (the
  // stores then conflict 8-way: the fallback path of 3 stages at D 128 only). By turns, one
  // staging of both regions for the whole part: up to four boxes, or rows of kDqTurnRowBytes.
  static constexpr int kSmemDqOffset = kSmemOwnOffset + 2 * kSmemDsBytes;
  static constexpr int kSmemOtherBytes =
      sm90::kSwizzleAtomBytes + kSmemDqOffset + kStages * kSmemRowsBytes + sm90::kMbarBytes * kNumBarriers;
  static constexpr int kDqRowBytes =
      kSmemOtherBytes + kConsumerWarpgroups * 64 * 288 <= 227 * 1024 ? 288 : 256;
  static constexpr int kDqBoxBytes = 64 * sm90::kSw128RowBytes;  // 64 rows x 32 fp32
  static constexpr int kSmemDqBytes = 64 * kDqRowBytes;          // per consumer warpgroup (1 KiB multiple)
  static constexpr int kDqTurnRowBytes = 64 * (kHeadDimNQK * 4 + 32) <= kConsumerWarpgroups * kSmemDqBytes
                                             ? kHeadDimNQK * 4 + 32
                                             : kHeadDimNQK * 4;
  static_assert(!kDqMayTurn || ((kHeadDimNQK + 31) / 32 * kDqBoxBytes <= kConsumerWarpgroups * kSmemDqBytes &&
                                64 * kDqTurnRowBytes <= kConsumerWarpgroups * kSmemDqBytes),
                "a part by turns must fit both stagings");
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
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

// The wide-head dK/dV kernel (backward_dkdv_wide_kernel): a head dim above 128 (up to 256 each,
// any multiples of 8). 64 keys per CTA, 32 per consumer warpgroup, 64 query rows per step; dK
// and dV accumulate transposed (M = head dim, N = the warpgroup's 32 keys: 16 registers per
// 64-column block each), so 256 / 256 holds 128 accumulator registers. No dQ writer warps.
template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kStages_ = 2, bool kDeterministic_ = false>
struct Sm90WideBwdConfig : Sm90BwdTile<Element_, kHeadDimQK_, kHeadDimV_, 64, 64, kStages_, kDeterministic_> {
  using Base = Sm90BwdTile<Element_, kHeadDimQK_, kHeadDimV_, 64, 64, kStages_, kDeterministic_>;
  using Base::kBlockM, Base::kBlockN, Base::kHeadDimQK, Base::kHeadDimV, Base::kStages, Base::kNumBarriers,
      Base::kSmemOwnOffset, Base::kSmemRowsBytes;
  using typename Base::Shape;
  static constexpr bool kWide = true;
  static constexpr bool kDqOrdered = false;  // deterministic: dQ by backward.cuh's dq_det kernel
  using RowKPitch = typename Shape::RowQK;   // (K's pitch padding is never read for a stored column)

  // 64-column blocks of a Q / K row and of a V / dO row: the m64 blocks of dKᵀ and dVᵀ (rows
  // past the head dim come from pitch padding and are never stored).
  static constexpr int kBlocksQK = Shape::RowQK::kPitch / 8;
  static constexpr int kBlocksV = Shape::RowV::kPitch / 8;
  // dQ (64 query rows x DQK) split by 64-column blocks: warpgroup cw takes kDqBlocks from block
  // cw·kDqBlocks (at 192: blocks 0-1 and 2-3, the last past K's pitch, computed and dropped).
  static constexpr int kDqBlocks = (kBlocksQK + 1) / 2;
  static constexpr int kDqN = 64 * kDqBlocks;

  static constexpr int kSmemPBytes = kBlockN * kBlockM * 2;   // Pᵀ [keys][queries]
  static constexpr int kSmemDsBytes = kBlockN * kBlockM * 2;  // dSᵀ, per buffer (2)
  static constexpr int kSmemRowsOffset = kSmemOwnOffset + kSmemPBytes + 2 * kSmemDsBytes;
  static constexpr int kSmemBarOffset = kSmemRowsOffset + kStages * kSmemRowsBytes;
  static constexpr int kSmemBytes =
      sm90::kSwizzleAtomBytes + kSmemBarOffset + sm90::kMbarBytes * kNumBarriers;

  static_assert(kHeadDimQK % 8 == 0 && kHeadDimQK >= 32 && kHeadDimQK <= 256 && kHeadDimV % 8 == 0 &&
                    kHeadDimV >= 32 && kHeadDimV <= 256,
                "head dims must be multiples of 8, 32..256");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

namespace sm90 {

// Named barriers of the backward's consumers (0 is __syncthreads).
constexpr int kBarDkdvDone = 2;  // both warpgroups done with K, V (256 threads)
constexpr int kBarStaged = 3;    // + consumer index: that warpgroup's dK, dV staged (128)
constexpr int kBarDqFull = 5;    // + consumer index: its dQ part staged (128 + its writer warp)
constexpr int kBarDqFree = 7;    // + consumer index: its staging read by the writer (128 + 32)
// + consumer index (the wide-head kernel, which has no dQ writer): its Pᵀ or dSᵀ rows staged (128)
constexpr int kBarWideStaged = kBarDqFull;
// + 2 · consumer index + (tile & 1): that warpgroup has ended a tile (its dSᵀ staged, its dQ
// part of the tile before read out, if it formed one); arrived on by it, waited on by the other
// (256 threads).
// Two ids per warpgroup by tile parity: a warpgroup may end tile n + 1 before the other has
// waited for tile n, and one id would then count both arrivals as the 256.
constexpr int kBarTileEnded = 9;
// Warpgroup 1 starts once warpgroup 0 has issued its first tile's dK: half a tile apart, one's
// softmax runs under the other's GEMMs from the start (256 threads).
constexpr int kBarStagger = 13;

// ---- shared by the dK/dV kernels: shared-memory places, barriers, the producer -------------
// Every backward config lays out, from a 1024-byte aligned base: K, V (kBlockN rows), kStages x
// (Q, dO of kBlockM rows), then tiles of its own; LSE / Δ rows per stage at kSmemRowsOffset and
// the mbarriers (kv, full[stages], empty[stages]) at kSmemBarOffset.
template <typename Cfg>
struct BwdSmem {
  u32 k, v, stages;
  __device__ __forceinline__ explicit BwdSmem(const unsigned char* raw)
      : k((smem_addr(raw) + (kSwizzleAtomBytes - 1)) & ~u32(kSwizzleAtomBytes - 1)),
        v(k + Cfg::kSmemKBytes),
        stages(v + Cfg::kSmemVBytes) {}
  __device__ __forceinline__ u32 q(int s) const {
    return stages + s * (Cfg::kSmemQBytes + Cfg::kSmemDoBytes);
  }
  __device__ __forceinline__ u32 dout(int s) const { return q(s) + Cfg::kSmemQBytes; }
  __device__ __forceinline__ u32 own() const { return k + Cfg::kSmemOwnOffset; }  // the config's own tiles
  __device__ __forceinline__ u32 lse(int s) const {
    return k + Cfg::kSmemRowsOffset + s * Cfg::kSmemRowsBytes;
  }
  __device__ __forceinline__ u32 delta(int s) const { return lse(s) + Cfg::kBlockM * 4; }
  __device__ __forceinline__ u32 tile_info(int s) const { return delta(s) + Cfg::kBlockM * 4; }
  __device__ __forceinline__ u32 bar_kv() const { return k + Cfg::kSmemBarOffset; }
  __device__ __forceinline__ u32 bar_full(int s) const { return bar_kv() + kMbarBytes * (1 + s); }
  __device__ __forceinline__ u32 bar_empty(int s) const {
    return bar_kv() + kMbarBytes * (1 + Cfg::kStages + s);
  }
};

// The mbarriers, by thread 0, before the CTA's first __syncthreads.
template <typename Cfg>
__device__ __forceinline__ void init_bwd_barriers(const BwdSmem<Cfg>& sm, bool tma) {
  mbar_init(sm.bar_kv(), Cfg::kLoadThreads);
  for (int s = 0; s < Cfg::kStages; ++s) {
    // cp.async (or two expect_tx arrivals with TMA: a cp.async tile among TMA ones makes them
    // plainly, its copies tracked without counting) + plain arrivals of the loader threads
    mbar_init(sm.bar_full(s), (tma ? 2 : Cfg::kLoadThreads) + Cfg::kLoadThreads);
    // every consumer thread arrives: the producer overwrites the stage's LSE/Δ rows with plain
    // stores, so each reader's own arrival orders its reads before them (a warp leader's
    // arrival after __syncwarp does too, but racecheck cannot see that and reports hazards)
    mbar_init(sm.bar_empty(s), Cfg::kConsumerWarpgroups * kWarpgroupThreads);
  }
}

// Where a CTA's query-row boxes (Q, dO by TMA; dQ parts into dq_accum) start in their tensor
// maps: dense queries at (row q0, batch b); packed ones (ragged layout, cu_seqlens_q) in one
// [1, Hq, total_q, D] map at row cu_seqlens_q[b] + q0. A box must not pass a packed sequence's
// end (it would read or add into the next sequence's rows; past total_q, or a dense tensor's
// L, the map clips it): fits() says whether rows q0 .. q0 + rows - 1 may go as one box.
template <typename Cfg>
struct QueryBoxes {
  int row0, b;
  bool packed;
  __device__ __forceinline__ QueryBoxes(const FaBwdParams& p, int b_) {
    packed = Cfg::kLayout != kDenseLayout && p.cu_seqlens_q != nullptr;
    row0 = packed ? p.cu_seqlens_q[b_] : 0;
    b = packed ? 0 : b_;
  }
  __device__ __forceinline__ int row(int q0) const { return row0 + q0; }
  __device__ __forceinline__ bool fits(int q0, int rows, int len_q) const {
    return !packed || q0 + rows <= len_q;
  }
};

// Which query tile a stage holds, published by the producer beside its LSE / Δ rows (plain
// stores, ordered for the consumers by the stage's full barrier like those rows): its first
// query row and query head and whether it lies in a full block; a stage with q0 < 0 ends the
// walk. The consumers read it after their wait instead of walking the block tables themselves,
// so no global load of the next block index sits on their path.
struct TileInfo {
  int q0, hq;
  bool full;
  __device__ __forceinline__ static void publish(u32 at, int q0, int hq, bool full) {
    st_shared_b32(at, static_cast<u32>(q0));
    st_shared_b32(at + 4, static_cast<u32>(2 * hq + (full ? 1 : 0)));
  }
  __device__ __forceinline__ static TileInfo read(u32 at) {
    const int q0 = static_cast<int>(ld_shared_b32(at));
    const int w = static_cast<int>(ld_shared_b32(at + 4));
    return TileInfo{q0, w >> 1, (w & 1) != 0};
  }
  __device__ __forceinline__ bool end() const { return q0 < 0; }
};

// The consumers' walk where the producer publishes each tile (TileInfo): nothing to walk; the
// cursor never ends by itself (the end marker does).
struct PublishedWalk {
  __device__ __forceinline__ PublishedWalk(const FaBlockTables&, int, int, int) {}
  struct Cursor {
    int start = 0;
    __device__ __forceinline__ Cursor(const PublishedWalk&, int) {}
    __device__ __forceinline__ bool done(const PublishedWalk&) const { return false; }
    __device__ __forceinline__ bool is_full(const PublishedWalk&) const { return false; }
    __device__ __forceinline__ void next(const PublishedWalk&, int) {}
  };
};

// Deterministic mode's walk of a dK/dV CTA (kDqOrdered), f(hq, q0, full) per query tile: each
// query head's tiles from the last query block down (DescendingCursor); with a mask the same
// for every head (mask_t.row_stride_h 0) the GQA group's heads one after the other at each tile.
// Its dQ parts go in ascending key-block order (dq_order_place), so a CTA reaches each tile about
// when the CTA of the key block below it has added its part there: at the same step on a full or
// causal mask (all start at the last query block), a step after it on a sliding window (whose
// lower key blocks' walks start lower). Walked as the TileCursor order (all heads' tiles of head
// 0 first, partial blocks before full ones), causal CTAs waited a tile a key block and ran 2x.
template <int kBM, typename F>
__device__ __forceinline__ void for_each_ordered_tile(const FaBwdParams& p, int b, int hkv, int kv0, F&& f) {
  const int group = p.heads_q / p.heads_kv;
  for (GroupTileWalk<kBM> w(p.mask_t, b, hkv * group, group, kv0, p.len_q, p.mask_t.row_stride_h == 0);
       !w.done(); w.next())
    f(w.hq, w.start(), w.is_full());
}

// Producer warps 0, 1 (tid < kLoadThreads): cp.async K and V once (bar_kv), then for each query
// head of the GQA group and each query tile the transposed tables list, Q and dO by TMA from
// one thread (cp.async from both warps where the driver refuses a map, or FAJIT_TMA=0, and for
// a packed sequence's last partial tile: QueryBoxes) and LSE, Δ by plain stores into a stage
// (full[s]), once the consumers have released it (empty[s]).
// kPublish: each stage also carries its TileInfo, and a last stage with none ends the consumers'
// walk; else the consumers walk the same tiles in the same order (TileCursor over len_q).
template <typename Cfg, bool kPublish = false>
__device__ __forceinline__ void produce_bwd_tiles(const BwdSmem<Cfg>& sm, const FaBwdParams& p,
                                                  const FaTmaPair& qdo, int b, int hkv, int kv0, int tid) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM;
  const int group = p.heads_q / p.heads_kv;
  const int len_q = p.len_q, len_kv = p.len_kv;
  load_tile_sw128<Cfg::kBlockN, typename Cfg::RowKPitch, Cfg::kLoadThreads>(
      sm.k, bwd::row_base<E>(p.k, p.k_stride_b, p.k_stride_h, b, hkv), p.k_stride_n, kv0, len_kv, tid);
  load_tile_sw128<Cfg::kBlockN, typename Cfg::RowV, Cfg::kLoadThreads>(
      sm.v, bwd::row_base<E>(p.v, p.v_stride_b, p.v_stride_h, b, hkv), p.v_stride_n, kv0, len_kv, tid);
  mbar_arrive_cp_async(sm.bar_kv());
  wait_for_prior_grids();  // the preprocess's Δ (K and V above are loaded while it ends)
  // (with the dQ writers' branch beside it ptxas spills 100-160 instructions in the producer's
  // 24 registers)
  const QueryBoxes<Cfg> boxes(p, b);
  StageRing<Cfg::kStages> ring;
  auto load = [&](int hq, int q0, bool full, const E* qg, const E* dog) {
    mbar_wait(sm.bar_empty(ring.stage), ring.phase ^ 1u);
    if (qdo.enabled && boxes.fits(q0, kBM, len_q)) {  // Q and dO by TMA, boxes of 64 columns x
      if (tid == 0) {  // BLOCK_M rows, one thread; each arms the stage's barrier with its bytes
        tma_load_tile<kBM, typename Cfg::RowQK>(sm.q(ring.stage), &qdo.a, boxes.row(q0), hq, boxes.b,
                                                sm.bar_full(ring.stage));
        tma_load_tile<kBM, typename Cfg::RowV>(sm.dout(ring.stage), &qdo.b, boxes.row(q0), hq, boxes.b,
                                               sm.bar_full(ring.stage));
      }
    } else {
      load_tile_sw128<kBM, typename Cfg::RowQK, Cfg::kLoadThreads>(sm.q(ring.stage), qg, p.q_stride_m, q0,
                                                                   len_q, tid);
      load_tile_sw128<kBM, typename Cfg::RowV, Cfg::kLoadThreads>(sm.dout(ring.stage), dog, p.do_stride_m, q0,
                                                                  len_q, tid);
      if (Cfg::kLayout != kDenseLayout && qdo.enabled) {
        // a packed sequence's last tile where the barrier expects TMA's two arrivals: the
        // copies hold the phase open, thread 0 makes the two arrivals
        mbar_track_cp_async(sm.bar_full(ring.stage));
        if (tid == 0) mbar_arrive(sm.bar_full(ring.stage)), mbar_arrive(sm.bar_full(ring.stage));
      } else {
        mbar_arrive_cp_async(sm.bar_full(ring.stage));
      }
    }
    bwd::stage_row_stats<kBM, Cfg::kLoadThreads>(sm.lse(ring.stage), sm.delta(ring.stage), p, b, hq, q0, tid);
    if (kPublish && tid == 0) TileInfo::publish(sm.tile_info(ring.stage), q0, hq, full);
    mbar_arrive(sm.bar_full(ring.stage));
    ring.advance();
  };
  auto q_of = [&](int hq) { return bwd::row_base<E>(p.q, p.q_stride_b, p.q_stride_h, b, hq); };
  auto do_of = [&](int hq) { return bwd::row_base<E>(p.dout, p.do_stride_b, p.do_stride_h, b, hq); };
  if constexpr (Cfg::kDqOrdered) {
    for_each_ordered_tile<kBM>(p, b, hkv, kv0,
                               [&](int hq, int q0, bool full) { load(hq, q0, full, q_of(hq), do_of(hq)); });
  } else {
    for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
      const E *qg = q_of(hq), *dog = do_of(hq);
      const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
      for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); cur.next(walk, len_q))
        load(hq, cur.start, cur.is_full(walk), qg, dog);
    }
  }
  if constexpr (kPublish) {  // the end: a stage with no tile, completed by plain arrivals alone
    mbar_wait(sm.bar_empty(ring.stage), ring.phase ^ 1u);
    if (tid == 0) TileInfo::publish(sm.tile_info(ring.stage), -1, 0, false);
    if (qdo.enabled) {
      if (tid == 0) mbar_arrive(sm.bar_full(ring.stage)), mbar_arrive(sm.bar_full(ring.stage));
    } else {
      mbar_arrive(sm.bar_full(ring.stage));
    }
    mbar_arrive(sm.bar_full(ring.stage));
  }
  cp_async_wait_all();
}

// Both dK/dV kernels' last step: this warpgroup's kKeys rows of dK and dV, staged in the K / V
// tiles (kBarStaged), to global memory by 16-byte stores (rows past len_kv are not written).
template <typename Cfg, int kKeys>
__device__ __forceinline__ void store_dk_dv(const FaBwdParams& p, u32 sk, u32 sv, int b, int hkv, int cw,
                                            int kv0, int wtid) {
  using E = typename Cfg::Element;
  using Tile = Sw128Blocks<Cfg::kBlockN>;
  E* dkg = static_cast<E*>(p.dk) + b * p.dk_stride_b + hkv * p.dk_stride_h;
  E* dvg = static_cast<E*>(p.dv) + b * p.dv_stride_b + hkv * p.dv_stride_h;
  store_rows<kKeys, Cfg::RowQK::kChunks, kWarpgroupThreads, Tile>(dkg, p.dk_stride_n, sk, cw * kKeys, kv0,
                                                                  p.len_kv, wtid);
  store_rows<kKeys, Cfg::RowV::kChunks, kWarpgroupThreads, Tile>(dvg, p.dv_stride_n, sv, cw * kKeys, kv0,
                                                                 p.len_kv, wtid);
}

// Deterministic mode's fixed order of the dQ parts added into 64 query rows (kDqOrdered): the
// CTAs whose key blocks the forward's tables list for those rows' query block, ascending; a CTA
// of 128 keys (kBN) is one place, `parts` writers of it take `parts` places in a row. The
// place of this CTA's part: the listed key blocks below its own (each kv_block / kBN CTAs), then
// the CTAs of its own block before it. Counted by the writer warp, a lane per entry.
template <int kBM, int kBN>
__device__ __forceinline__ int dq_order_place(const FaBlockTables& fm, int b, int hq, int q0, int kv0,
                                              int lane) {
  const long long row = BlockWalk<kBM>::row_of(fm, b, hq, q0);
  const int kb = kv0 / fm.kv_block;
  const int n_partial = fm.kv_num_blocks[row];
  const int n_full = fm.full_kv_num_blocks != nullptr ? fm.full_kv_num_blocks[row] : 0;
  const int* partial = fm.kv_indices + row * fm.num_kv_blocks;
  const int* full = fm.full_kv_indices + row * fm.num_kv_blocks;
  int below = 0;
  for (int i = lane; i < n_partial; i += 32) below += partial[i] < kb ? 1 : 0;
  for (int i = lane; i < n_full; i += 32) below += full[i] < kb ? 1 : 0;
  below = __reduce_add_sync(0xffffffffu, below);
  return below * (fm.kv_block / kBN) + (kv0 % fm.kv_block) / kBN;
}
// The writer warp until `count` (acquired by lane 0) has reached `place`. A bound on the wait
// (2^22 naps of up to 128 ns: ~0.5 s and more) keeps tables that break the order from hanging
// the GPU: past it the part goes unordered (still summed right).
__device__ __forceinline__ void dq_order_wait(const int* count, int place, int lane) {
  if (lane == 0) {
    unsigned nap = 32;
    for (int spins = 0; spins < (1 << 22); ++spins) {
      int now;
      asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(now) : "l"(count) : "memory");
      if (now >= place) break;
      __nanosleep(nap);
      if (nap < 128) nap *= 2;
    }
  }
  __syncwarp();
  asm volatile("fence.proxy.async.global;" ::: "memory");  // the count acquired before this lane's reductions
}
// After the warp's bulk reductions of a part: once they have been performed (not just read
// their staging), the next place's writer may go (lane 0 releases the count). The writer passes
// a part on at its next part's staging handshake, or after its last.
__device__ __forceinline__ void dq_order_pass(int* count, int lane) {
  bulk_wait<0>();
  asm volatile("fence.proxy.async.global;" ::: "memory");  // each lane's reductions before the release
  __syncwarp();
  if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(count) : "memory");
}

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
  // dQ above DQK 64 at BLOCK_M 64: by turns, unless a score_mod with its own derivative keeps
  // its scores (sc) through the tile above DQK 96; there the whole part's 64 accumulators spill
  // (H200 bf16 d128 softcap by turns 0.95x) and each warpgroup forms a 64-column block instead.
  constexpr bool kDqByTurns = Cfg::kDqMayTurn && !(Mods::kScoreGrad && Cfg::kHeadDimQK > 96);
  constexpr bool kDqSplitCols = Cfg::kDqMayTurn && !kDqByTurns;
  constexpr int kDqN = Cfg::template kDqNFor<kDqByTurns>;
  // Deterministic mode: the places a CTA's parts take in their rows' order (split by keys or by
  // columns its two warpgroups' parts go into the same rows).
  constexpr int kDqOrderParts = Cfg::kDqSplitKeys || kDqSplitCols ? 2 : 1;

  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Cfg> sm(smem_raw);
  const u32 sK = sm.k, sV = sm.v;
  auto sQ = [&](int s) { return sm.q(s); };
  auto sDo = [&](int s) { return sm.dout(s); };
  auto sDs = [&](int buf) { return sm.own() + buf * Cfg::kSmemDsBytes; };
  auto sLse = [&](int s) { return sm.lse(s); };
  auto sDelta = [&](int s) { return sm.delta(s); };
  // warpgroup cw's dQ staging (by turns both warpgroups stage into one) and its row pitch
  auto sDqPart = [&](int cw) { return sK + Cfg::kSmemDqOffset + (kDqByTurns ? 0 : cw * Cfg::kSmemDqBytes); };
  constexpr int kDqRowPitch = kDqByTurns ? Cfg::kDqTurnRowBytes : Cfg::kDqRowBytes;
  // The rows and columns of dQ's tile that consumer warpgroup cw's m64 n kDqN part covers.
  auto dq_row0 = [](int cw) { return Cfg::kDqSplitRows ? 64 * cw : 0; };
  auto dq_col0 = [](int cw) { return kDqSplitCols ? 64 * cw : 0; };

  const int tid = threadIdx.x;
  const int warpgroup = warpgroup_index();
  const KeyBlockCta cta(kBN, p.heads_kv);
  const int kv0 = cta.kv0, b = cta.b, hkv = cta.hkv;
  const int group = p.heads_q / p.heads_kv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  if (tid == 0) init_bwd_barriers(sm, qdo.enabled);
  __syncthreads();

  // Every role below takes, per query head hq, the query tiles that see this CTA's keys in one
  // order (sub-tiles past len_q skipped alike): the producer and the dQ writers walk them with a
  // TileCursor over len_q, the consumers too, or (kPublished) from the producer's TileInfo in
  // each stage. Published only where mask_mod reads buffers: there a CTA's walk is a few tiles
  // and the consumers' own block-index loads weigh (H200, bf16 B4 H16 S4096 d64: document
  // 1.06x); on an affine mask (causal, sliding 0.985x) the loads hide under the GEMMs and the
  // TileInfo's shared load after the wait costs more.
  // Deterministic mode (kDqOrdered) publishes every tile: its walk (for_each_ordered_tile) is the
  // producer's and the writers' alone.
  constexpr bool kPublished = (Cfg::kPublishTiles && Mods::kMaskReadsBuffers) || Cfg::kDqOrdered;
  if (warpgroup == 0) {
    // ================= producer ==============================================================
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid >= Cfg::kLoadThreads) {  // warps 2, 3
      // dQ writer of consumer warpgroup `part`: walks the tables as the consumers do (the
      // place of each part: no data from the consumers but the part itself); for each of its
      // parts hands the staging back once the previous part's bulk reductions have read it,
      // waits for the part, then reduces it into dq_accum: two tensor-map boxes from one
      // lane, else one bulk reduction per row (rows past len_q skipped). The consumers never
      // wait on the reductions themselves (FlashAttention-3's dQ writer).
      const int part = tid / 32 - 2, lane = tid & 31;
      // By turns warp 2 reduces every part, each from the one staging, in the barriers of the
      // warpgroup that formed it (tile k's part: warpgroup (k + 1) % 2, during tile k + 1);
      // warp 3 has nothing to do.
      if (kDqByTurns && part == 1) return;
      const int row0 = dq_row0(part), col0 = dq_col0(part);
      // dQ's columns in this part: those past DQK (the second block's, or 72's zero chunk) are
      // computed but not reduced
      const int cols = Cfg::kHeadDimQK - col0 < kDqN ? Cfg::kHeadDimQK - col0 : kDqN;
      const QueryBoxes<Cfg> boxes(p, b);
      wait_for_prior_grids();  // dq_accum (and deterministic mode's counters) zeroed
      int former = part;       // the warpgroup whose part comes next
      // deterministic: the counter of the part reduced last, passed on once that part has been
      // performed: before the next staging handshake where that is a sync (by turns), else
      // right after it (so the consumers get the staging back as soon as it has been read)
      int* pending = nullptr;
      auto pass_pending = [&] {
        if constexpr (Cfg::kDqOrdered)
          if (pending != nullptr) dq_order_pass(pending, lane), pending = nullptr;
      };
      auto write = [&](int hq, int tile_q0) {
        const int q0 = tile_q0 + row0;
        if (kDqByTurns) former ^= 1;  // (tile 0's part: warpgroup 1)
        bulk_wait_read<0>();
        __syncwarp();
        // (by turns a sync, not an arrive: the two warpgroups write one staging, and
        // racecheck orders stores only through barriers every side waits on)
        if (kDqByTurns) {
          pass_pending();
          named_barrier(kBarDqFree + former, kWG + 32);
        } else {
          named_barrier_arrive(kBarDqFree + former, kWG + 32);
          pass_pending();
        }
        // deterministic: this part's place in its rows' order (both writers' parts of one
        // CTA into the same rows, split by keys or columns, take two places, warp 2's first),
        // its table loads while the consumers stage the part
        int* order = nullptr;
        int place = 0;
        if constexpr (Cfg::kDqOrdered) {
          order = p.dq_order + (static_cast<long long>(b) * p.heads_q + hq) * p.dq_order_units + q0 / 64;
          place = kDqOrderParts * dq_order_place<kBM, kBN>(p.mask, b, hq, tile_q0, kv0, lane) +
                  (kDqOrderParts == 2 ? part : 0);
        }
        named_barrier(kBarDqFull + former, kWG + 32);
        if constexpr (Cfg::kDqOrdered) dq_order_wait(order, place, lane);
        if (dq_map.enabled && boxes.fits(q0, 64, len_q)) {
          if (lane == 0) {
#pragma unroll
            for (int blk = 0; blk < (kDqN + 31) / 32; ++blk)
              if (32 * blk < cols)  // (a box's columns past D are clipped by the map)
                tma_reduce_add_4d(&dq_map.map, sDqPart(former) + blk * Cfg::kDqBoxBytes, col0 + 32 * blk,
                                  boxes.row(q0), hq, boxes.b);
            bulk_commit();
          }
        } else {  // (a packed sequence's last part comes staged as rows: stage_dq)
          float* dqa = p.dq_accum + (bwd::stat_row(p, b, hq) + q0) * Cfg::kHeadDimQK + col0;
#pragma unroll
          for (int r = lane; r < 64; r += 32)
            if (q0 + r < len_q)
              bulk_reduce_add_f32(dqa + r * Cfg::kHeadDimQK, sDqPart(former) + r * kDqRowPitch, cols * 4);
          bulk_commit();
        }
        if constexpr (Cfg::kDqOrdered) pending = order;
      };
      if constexpr (Cfg::kDqOrdered) {  // the producer's order (the consumers take its TileInfo)
        for_each_ordered_tile<kBM>(p, b, hkv, kv0, [&](int hq, int q0, bool) { write(hq, q0); });
      } else {
        for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
          const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
          for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); cur.next(walk, len_q)) write(hq, cur.start);
        }
      }
      pass_pending();
      bulk_wait<0>();  // done before the CTA's shared memory goes
      return;
    }
    produce_bwd_tiles<Cfg, kPublished>(sm, p, qdo, b, hkv, kv0, tid);
    return;
  }

  // ================= consumers: keys kv0 + 64·cw .. + 63 =========================================
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int cw = warpgroup - 1;
  const int wtid = tid - kWG * warpgroup;
  const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const bwd::KeyRows kr(kv0 + cw * kKeys + warp * 16 + g, len_kv);
  // The mods' loads by key once per CTA and by query ahead of Sᵀ (split mods), except beside
  // score_grad's kept scores at head dims from 128, where the gathered values cost spills (d128
  // document + softcap: 316 -> 376 B, not measured on a GPU): there the plain mods per element.
  constexpr bool kGatherMods = !(Mods::kScoreGrad && Cfg::kHeadDimQK >= 128);
  using Split = typename PickType<kGatherMods, SplitMods<Mods>, PlainMods<Mods>>::Type;
  const bwd::ModKeys<Split> mod_keys(kr, b, cap);  // the mods' values of this thread's keys
  const bool key_tail = kv0 + kBN > len_kv;
  const float sn = natural_scale(Mods::kHasScoreMod, p.scale);

  float dk[Cfg::kHeadDimNQK / 8][4], dv[Cfg::kHeadDimNV / 8][4];
  zero_frags(dk);
  zero_frags(dv);

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
    const u64 dqs = desc_advance(dq_b, stage * kStageBytes), ddos = desc_advance(ddo_b, stage * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk)
      wgmma_ss<E, kBM>(s, desc_advance(dk_a, kmajor_kstep_offset<kBN>(kk)),
                       desc_advance(dqs, kmajor_kstep_offset<kBM>(kk)), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKV; ++kk)
      wgmma_ss<E, kBM>(dp, desc_advance(dv_a, kmajor_kstep_offset<kBN>(kk)),
                       desc_advance(ddos, kmajor_kstep_offset<kBM>(kk)), kk > 0);
    wgmma_commit();
  };
  // dV += Pᵀ·dO, then dK += dSᵀ·Q: a commit group each.
  auto issue_dv = [&](const u32(&pa)[Cfg::kMK][4], int stage) {
    const u64 ddos = desc_advance(ddo_bt, stage * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kMK; ++kk)
      wgmma_rs<E, Cfg::kHeadDimNV>(dv, pa[kk], desc_advance(ddos, mnmajor_kstep_offset(kk)), 1);
    wgmma_commit();
  };
  auto issue_dk = [&](const u32(&da)[Cfg::kMK][4], int stage) {
    const u64 dqs = desc_advance(dq_bt, stage * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kMK; ++kk)
      wgmma_rs<E, Cfg::kHeadDimNQK>(dk, da[kk], desc_advance(dqs, mnmajor_kstep_offset(kk)), 1);
    wgmma_commit();
  };
  // This warpgroup's m64 n kDqN part of dQ = dS·K (rows row0.., keys key0..; by turns, N spans
  // both 64-column blocks of K): one commit group.
  const int row0 = dq_row0(cw), col0 = dq_col0(cw);
  constexpr int kDqKSteps = (Cfg::kDqSplitKeys ? kKeys : kBN) / 16;
  const u32 key0 = mnmajor_kstep_offset(Cfg::kDqSplitKeys ? cw * (kKeys / 16) : 0);
  auto issue_dq = [&](float(&dq)[kDqN / 8][4], int buf) {
    const u64 dss = desc_advance(dds_at, buf * Cfg::kSmemDsBytes + (row0 / 64) * kTileBlock + key0);
#pragma unroll
    for (int kk = 0; kk < kDqKSteps; ++kk)
      wgmma_ss_mn<E, kDqN>(dq, desc_advance(dss, mnmajor_kstep_offset(kk)),
                           desc_advance(dkk_bt, (col0 / 64) * kTileBlock + key0 + mnmajor_kstep_offset(kk)),
                           kk > 0);
    wgmma_commit();
  };
  // The part to the staging, once the writer warp has read the previous one: as the tensor
  // map's boxes, or as rows for the writer's row-by-row reductions (no map; a packed
  // sequence's part that passes its end: QueryBoxes).
  const QueryBoxes<Cfg> boxes(p, b);
  auto stage_dq = [&](const float(&dq)[kDqN / 8][4], int part_q0) {
    const bool fits = boxes.fits(part_q0 + dq_row0(cw), 64, len_q);
    named_barrier(kBarDqFree + cw, kWG + 32);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int j = 0; j < kDqN / 8; ++j) {
        // row r (r % 8 == g), columns 8j + 2t, 8j + 2t + 1: in swizzled box j / 4, 16-byte
        // chunk (2 (j % 4) + t / 2) ^ g of row r; or at 4 (8j + 2t) of a padded row
        const int r = warp * 16 + g + 8 * hh;
        const u32 off = dq_map.enabled && fits ? (j / 4) * Cfg::kDqBoxBytes + r * kSw128RowBytes +
                                                     ((((j % 4) * 2 + (t >> 1)) ^ g) << 4) + (t & 1) * 8
                                               : r * kDqRowPitch + (8 * j + 2 * t) * 4;
        st_shared_v2_f32(sDqPart(cw) + off, dq[j][2 * hh], dq[j][2 * hh + 1]);
      }
    fence_proxy_async();
    if constexpr (kDqByTurns)  // (a sync: the writer waits here already; see the writer)
      named_barrier(kBarDqFull + cw, kWG + 32);
    else
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

  mbar_wait(sm.bar_kv(), 0);
  fence_proxy_async();
  if (cw == 1) named_barrier(kBarStagger, 2 * kWG);
  StageRing<kStages> ring;
  int n_done = 0;  // query tiles done: picks the dSᵀ buffer and the tile-end barrier
  int dq_q0 = 0;   // the first query row of the tile whose dQ part is staged next
  // The tiles in the producer's order: published (kPublished), each named by its stage's
  // TileInfo until a stage ends the walk (one pass of the outer loop; the walk and cursor unused);
  // else walked here too, per query head of the GQA group, with a TileCursor over the tables.
  using Walk = typename PickType<kPublished, PublishedWalk, BlockWalk<kBM>>::Type;
  using Cursor = typename PickType<kPublished, PublishedWalk::Cursor, TileCursor<kBM>>::Type;
  for (int walk_hq = hkv * group; walk_hq < (kPublished ? hkv * group + 1 : (hkv + 1) * group); ++walk_hq) {
    const Walk walk(p.mask_t, b, walk_hq, kv0);
    for (Cursor cur(walk, len_q); !cur.done(walk); ++n_done) {
      const int stage = ring.stage;
      int q0 = cur.start, hq = walk_hq;
      bool is_full = cur.is_full(walk);
      mbar_wait(sm.bar_full(stage), ring.phase);
      if constexpr (kPublished) {
        const TileInfo tile = TileInfo::read(sm.tile_info(stage));
        if (tile.end()) break;
        q0 = tile.q0, hq = tile.hq, is_full = tile.full;
      }
      const int buf = n_done & 1;

      // cp.async Q/dO (always possible in the ragged layout: a sequence's last tile); TMA's need
      // only the mbarrier
      if (Cfg::kLayout != kDenseLayout || !qdo.enabled) fence_proxy_async();
      float s[kQT][4], dp[kQT][4];
      wgmma_fence();
      issue_s_dp(s, dp, stage);
      cur.next(walk, len_q);                    // the next tile's block index loads while Sᵀ and dPᵀ run
      bwd::ModQueries<Split, kQT> mod_queries;  // and the mods' loads by query
      mod_queries.gather(q0, len_q, b, hq, cap);

      // ---- Pᵀ from Sᵀ while dPᵀ is still on the tensor cores. At BLOCK_M 64, dV += Pᵀ·dO is
      // queued behind dPᵀ and dSᵀ formed while it runs; at BLOCK_M 128 the registers do not hold
      // Pᵀ, dPᵀ and the in-flight P operand together (ptxas serializes), so dV waits for dSᵀ.
      // (at BLOCK_M 64 the tile's LSE, then its Δ, are loaded into registers before the waits
      // for Sᵀ and dPᵀ, so their latency passes under the GEMMs; at 128, or beside score_grad's
      // scores, the registers do not hold them (ptxas spills): loaded where used. Δ with the
      // LSE before the first wait, together with a shfl-fed block cursor, was 0.91-1.02x on the
      // H100 (2026-11-27; not separated))
      constexpr bool kDvEarly = kBM == 64;
      constexpr bool kEarlyStats = kDvEarly && !Mods::kScoreGrad;
      f32x2 stats[kEarlyStats ? kQT : 1];
      auto load_stats = [&](u32 rows) {
        if constexpr (kEarlyStats) {
#pragma unroll
          for (int j = 0; j < kQT; ++j) stats[j] = ld_shared_v2_f32(rows + (8 * j + 2 * t) * 4);
        }
      };
      auto stat = [&](u32 rows) {
        return [&, rows](int j, int col) {
          if constexpr (kEarlyStats)
            return stats[j];
          else
            return ld_shared_v2_f32(rows + col * 4);
        };
      };
      load_stats(sLse(stage));
      wgmma_wait<1>();
      pin(s);
      float sc[Mods::kScoreGrad ? kQT : 1][4];
      auto probs = [&](auto linear_tag, const bwd::KeyLinear* linear) {
        constexpr bool kLinear = decltype(linear_tag)::value;
        bwd::probs_t<Mods, kLinear>(
            s, sc, kr, q0, t, len_q, len_kv, key_tail, p.scale, sn, stat(sLse(stage)),
            [&](int j, int c) { return mod_queries.at(j, c, t); },
            [&](float x, int q, int hh, const auto& at) {
              return mod_score<Split, true, !kLinear>(x, q, kr.kv_c[hh], is_full, p.scale, b, hq, at.score,
                                                      mod_keys.score[hh], at.mask, mod_keys.mask[hh], cap);
            },
            linear);
      };
      if constexpr (bwd::KeyLinearOf<Mods>::value) {
        bwd::KeyLinear linear;
        if (linear.make<Mods, kQT>(kr, q0, t, len_q, b, hq, cap))
          probs(BoolTag<true>{}, &linear);
        else
          probs(BoolTag<false>{}, nullptr);
      } else {
        probs(BoolTag<false>{}, nullptr);
      }
      u32 pa[Cfg::kMK][4];
      if constexpr (kDvEarly) {
        pack_a<E>(pa, s);
        wgmma_fence();
        issue_dv(pa, stage);
        load_stats(sDelta(stage));
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }

      // ---- dSᵀ from dPᵀ, then dK += dSᵀ·Q
      pin(dp);
      bwd::dscores_t<Mods>(dp, s, sc, kr, q0, t, len_q, b, hq, cap, grads, stat(sDelta(stage)));
      u32 da[Cfg::kMK][4];
      if constexpr (!kDvEarly) pack_a<E>(pa, s);
      pack_a<E>(da, dp);
      wgmma_fence();
      if constexpr (!kDvEarly) issue_dv(pa, stage);
      issue_dk(da, stage);
      if (cw == 0 && n_done == 0) named_barrier_arrive(kBarStagger, 2 * kWG);

      // ---- dSᵀ (this warpgroup's 64 key rows) to shared memory, then this warpgroup's part
      // of the previous tile's dQ = dS·K, by turns the whole part when it is this one's turn.
      // One tile late, so a warpgroup waits only for the other to have ended the previous
      // tile, not for it to reach this point of this one: the two need not run in lockstep.
      bool mine = false;
      float dq[kDqN / 8][4];
      // this tile's buffer held dSᵀ of tile n - 2, which the other warpgroup's dQ read in tile
      // n - 1; that tile's end also has its dSᵀ of tile n - 1 staged
      if (n_done > 0) wait_tile_ended(n_done - 1);
      stage_packed_x4<Sw128Blocks<kBN>>(sDs(buf), da, cw * kKeys + warp * 16);
      fence_proxy_async();
      if constexpr (kDqByTurns) {  // the previous tile's part, if it is this one's turn
        mine = n_done > 0 && ((n_done ^ cw) & 1) == 0;
      } else {
        // (at the first tile a product of the unused buffer, never staged: a branch around
        // the wgmma would make ptxas serialize every wgmma of the kernel)
        issue_dq(dq, buf ^ 1);
        mine = n_done > 0;
      }
      // dV and dK done: the stage goes back to the producer (dQ reads no stage), then dQ
      wgmma_wait<kDqByTurns ? 0 : 1>();
      pin(dk);
      pin(dv);
      pin(pa);
      pin(da);
      mbar_arrive(sm.bar_empty(stage));
      if constexpr (kDqByTurns) {
        if (mine) {  // nothing in flight: the branch holds the whole wgmma (fence to wait)
          wgmma_fence();
          issue_dq(dq, buf ^ 1);
          wgmma_wait<0>();
          pin(dq);
          stage_dq(dq, dq_q0);
        }
      } else {
        wgmma_wait<0>();
        pin(dq);
        if (mine) stage_dq(dq, dq_q0);
      }
      dq_q0 = q0;
      if constexpr (kDqReadsBoth) named_barrier_arrive(kBarTileEnded + 2 * cw + (n_done & 1), 2 * kWG);
      ring.advance();
    }
  }
  if (cw == 0 && n_done == 0) named_barrier_arrive(kBarStagger, 2 * kWG);  // no tiles at all
  if (n_done > 0) {                                                        // the last tile's dQ part
    wait_tile_ended(n_done - 1);
    if (!kDqByTurns || (n_done & 1) == cw) {  // by turns: the warpgroup whose turn it is
      float dq[kDqN / 8][4];
      wgmma_fence();
      issue_dq(dq, (n_done - 1) & 1);
      wgmma_wait<0>();
      pin(dq);
      stage_dq(dq, dq_q0);
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
  store_dk_dv<Cfg, kKeys>(p, sK, sV, b, hkv, cw, kv0, wtid);
}

// ---- the wide-head dK/dV kernel (Sm90WideBwdConfig: a head dim above 128) --------------------
// FlashAttention-3's layout for wide heads: the keys of a warpgroup are the N of every GEMM,
// so that dK and dV of 32 keys x up to 256 columns each fit its registers.
//   Warpgroup 0: the producer (produce_bwd_tiles, warps 0, 1).
//   Warpgroups 1, 2 (consumers): keys kv0 + 32·cw .. + 31, per query tile (64 rows)
//     S = Q·K_cwᵀ and dP = dO·V_cwᵀ        SS-wgmma m64n32, both issued at once
//     P in registers                       (score_tile, prob: rows = queries), while dP runs
//     Pᵀ -> shared memory (its 32 key rows), dVᵀ += dOᵀ·P   SS-wgmma m64n32 per 64-column block
//     dS in registers                      (score_grad, buffer gradients), while dVᵀ runs
//     dSᵀ -> shared memory (double-buffered), dKᵀ += Qᵀ·dS  SS-wgmma m64n32 per block
//     dQ_part = dS·K of the PREVIOUS tile  SS-wgmma m64 n kDqN (both warpgroups' dSᵀ: named
//                                          barriers by tile parity, as the kernel above), its
//                                          columns from block cw·kDqBlocks, reduced into
//                                          dq_accum by red.global.add.v2.f32 (no staging: the
//                                          shared memory holds K, V and the stages)
//     (the stage goes back to the producer once dVᵀ and dKᵀ are done)
//   Epilogue: dK·scale and dV transposed into the K / V tiles, 16-byte stores.
template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dkdv_wide_kernel(const FaBwdParams& p, const FaCaptures& cap,
                                                          const FaGradBuffers& grads, const FaTmaPair& qdo) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kKeys = Cfg::kKeysPerWarpgroup;
  constexpr int kWG = kWarpgroupThreads;
  constexpr int kNT = kKeys / 8;                 // n-tiles of S, dP, dKᵀ, dVᵀ
  constexpr int kQBlock = kBM * kSw128RowBytes;  // one 64-column block of a Q / dO stage
  constexpr int kKBlock = kBN * kSw128RowBytes;  // one 64-column block of K / V
  constexpr int kStageBytes = Cfg::kSmemQBytes + Cfg::kSmemDoBytes;

  extern __shared__ unsigned char smem_raw[];
  const BwdSmem<Cfg> sm(smem_raw);
  const u32 sP = sm.own();  // Pᵀ, [keys][queries] (Sw128Blocks<kBN>: one 128-byte row per key)
  auto sDs = [&](int buf) { return sP + Cfg::kSmemPBytes + buf * Cfg::kSmemDsBytes; };

  const int tid = threadIdx.x;
  const int warpgroup = warpgroup_index();
  const KeyBlockCta cta(kBN, p.heads_kv);
  const int kv0 = cta.kv0, b = cta.b, hkv = cta.hkv;
  const int group = p.heads_q / p.heads_kv;
  const int len_q = p.len_q, len_kv = p.len_kv;

  if (tid == 0) init_bwd_barriers(sm, qdo.enabled);
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid < Cfg::kLoadThreads) produce_bwd_tiles(sm, p, qdo, b, hkv, kv0, tid);
    return;
  }

  // ================= consumers: keys kv0 + 32·cw .. + 31 =========================================
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  wait_for_prior_grids();  // they reduce into dq_accum, zeroed by the preprocess
  const int cw = warpgroup - 1;
  const int wtid = tid - kWG * warpgroup;
  const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int key0 = kv0 + cw * kKeys;  // this warpgroup's first key
  const int row = warp * 16 + g;      // this thread's first query row of a tile (and row + 8)
  const float sn = natural_scale(Mods::kHasScoreMod, p.scale);

  float dkt[Cfg::kBlocksQK][kNT][4], dvt[Cfg::kBlocksV][kNT][4];
#pragma unroll
  for (int mb = 0; mb < Cfg::kBlocksQK; ++mb)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) dkt[mb][j][i] = 0.f;
#pragma unroll
  for (int mb = 0; mb < Cfg::kBlocksV; ++mb)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) dvt[mb][j][i] = 0.f;

  // Operand descriptors. Q, dO (a stage) as K-major A of S, dP and as MN-major A (Qᵀ, dOᵀ, one
  // 64-column block = one m64) of dKᵀ, dVᵀ; this warpgroup's K, V rows as K-major B of S, dP;
  // its Pᵀ, dSᵀ rows as K-major B of dVᵀ, dKᵀ; dSᵀ (all 64 keys) as MN-major A and K as MN-major
  // B of dQ = dS·K.
  const u64 dq_a = desc_sw128(sm.q(0), 16, kSwizzleAtomBytes);
  const u64 ddo_a = desc_sw128(sm.dout(0), 16, kSwizzleAtomBytes);
  const u64 dq_at = desc_sw128(sm.q(0), kQBlock, kSwizzleAtomBytes);
  const u64 ddo_at = desc_sw128(sm.dout(0), kQBlock, kSwizzleAtomBytes);
  const u64 dk_b = desc_sw128(sm.k + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dv_b = desc_sw128(sm.v + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dp_b = desc_sw128(sP + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dds_b = desc_sw128(sDs(0) + cw * kKeys * kSw128RowBytes, 16, kSwizzleAtomBytes);
  const u64 dds_at = desc_sw128(sDs(0), kKBlock, kSwizzleAtomBytes);
  const u64 dkk_bt = desc_sw128(sm.k + cw * Cfg::kDqBlocks * kKBlock, kKBlock, kSwizzleAtomBytes);

  // S = Q·K_cwᵀ and dP = dO·V_cwᵀ: two commit groups.
  auto issue_s_dp = [&](float(&s)[kNT][4], float(&dp)[kNT][4], int stage) {
    const u64 dqs = desc_advance(dq_a, stage * kStageBytes), ddos = desc_advance(ddo_a, stage * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk)
      wgmma_ss<E, kKeys>(s, desc_advance(dqs, kmajor_kstep_offset<kBM>(kk)),
                         desc_advance(dk_b, kmajor_kstep_offset<kBN>(kk)), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < Cfg::kKV; ++kk)
      wgmma_ss<E, kKeys>(dp, desc_advance(ddos, kmajor_kstep_offset<kBM>(kk)),
                         desc_advance(dv_b, kmajor_kstep_offset<kBN>(kk)), kk > 0);
    wgmma_commit();
  };
  // accᵀ[block] += Xᵀ·B over the tile's 64 queries (X = dO or Q of the stage, B = Pᵀ or dSᵀ rows
  // of this warpgroup's keys): one commit group.
  auto issue_transposed = [&](auto& acc, u64 x_at, u64 b_desc, int stage) {
    constexpr int kBlocks = sizeof(acc) / sizeof(acc[0]);
    const u64 xs = desc_advance(x_at, stage * kStageBytes);
#pragma unroll
    for (int mb = 0; mb < kBlocks; ++mb)
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
        wgmma_ss_amn<E, kKeys>(acc[mb], desc_advance(xs, mb * kQBlock + mnmajor_kstep_offset(kk)),
                               desc_advance(b_desc, kmajor_kstep_offset<kBN>(kk)), 1);
    wgmma_commit();
  };
  // This warpgroup's m64 n kDqN part of dQ = dS·K from dSᵀ buffer `buf`: one commit group.
  auto issue_dq = [&](float(&dq)[Cfg::kDqN / 8][4], int buf) {
    const u64 dss = desc_advance(dds_at, buf * Cfg::kSmemDsBytes);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_ss_mn<E, Cfg::kDqN>(dq, desc_advance(dss, mnmajor_kstep_offset(kk)),
                                desc_advance(dkk_bt, mnmajor_kstep_offset(kk)), kk > 0);
    wgmma_commit();
  };
  // The part into dq_accum rows q0.. of query head hq (columns past DQK and rows past len_q
  // dropped): one row pointer per thread row, the columns as immediate offsets from it, and no
  // column test where both parts lie inside DQK (QK 128, 256). (As 16-byte reductions after a
  // lane-pair swap: 1-2 % slower at d192/d256, H200.)
  auto reduce_dq = [&](const float(&dq)[Cfg::kDqN / 8][4], int hq, int q0) {
    constexpr bool kAllColumns = 2 * Cfg::kDqN <= Cfg::kHeadDimQK;
    float* part = p.dq_accum + bwd::stat_row(p, b, hq) * Cfg::kHeadDimQK + cw * Cfg::kDqN + 2 * t;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + row + 8 * hh;
      if (q >= len_q) continue;
      float* dst = part + (long long)q * Cfg::kHeadDimQK;
#pragma unroll
      for (int j = 0; j < Cfg::kDqN / 8; ++j)
        if (kAllColumns || cw * Cfg::kDqN + 8 * j + 2 * t < Cfg::kHeadDimQK)
          red_add_v2_f32(dst + 8 * j, dq[j][2 * hh], dq[j][2 * hh + 1]);
    }
  };
  // Waits until the other consumer warpgroup has ended its n-th tile (its dSᵀ staged, its dQ
  // read of the buffer before done).
  auto wait_tile_ended = [&](int n) { named_barrier(kBarTileEnded + 2 * (1 - cw) + (n & 1), 2 * kWG); };

  mbar_wait(sm.bar_kv(), 0);
  fence_proxy_async();
  if (cw == 1) named_barrier(kBarStagger, 2 * kWG);
  StageRing<Cfg::kStages> ring;
  int n_done = 0;                // query tiles done: picks the dSᵀ buffer and the tile-end barrier
  int prev_hq = 0, prev_q0 = 0;  // the tile whose dQ part is computed one tile late
  for (int hq = hkv * group; hq < (hkv + 1) * group; ++hq) {
    const BlockWalk<kBM> walk(p.mask_t, b, hq, kv0);
    for (TileCursor<kBM> cur(walk, len_q); !cur.done(walk); ++n_done) {
      const int stage = ring.stage;
      const int q0 = cur.start;
      const bool is_full = cur.is_full(walk);
      const int buf = n_done & 1;

      mbar_wait(sm.bar_full(stage), ring.phase);
      // cp.async Q/dO (always possible in the ragged layout: a sequence's last tile); TMA's need
      // only the mbarrier
      if (Cfg::kLayout != kDenseLayout || !qdo.enabled) fence_proxy_async();
      float s[kNT][4], dp[kNT][4];
      wgmma_fence();
      issue_s_dp(s, dp, stage);
      cur.next(walk, len_q);  // the next tile's block index loads while S and dP run

      // ---- P from S while dP is still on the tensor cores (rows = queries)
      int q_idx[2];
      float lse[2], delta[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int q = q0 + row + 8 * hh;
        q_idx[hh] = q < len_q ? q : len_q - 1;
        lse[hh] = ld_shared_f32(sm.lse(stage) + (row + 8 * hh) * 4);
        delta[hh] = ld_shared_f32(sm.delta(stage) + (row + 8 * hh) * 4);
      }
      wgmma_wait<1>();
      pin(s);
      float sc[Mods::kScoreGrad ? kNT : 1][4];
      bwd::probs_rows<Mods, kKeys>(s, sc, q_idx, lse, key0, t, len_kv, is_full, p.scale, sn, b, hq, cap);

      // ---- Pᵀ to shared memory (this warpgroup's rows; its dVᵀ of the last tile is done), then
      // dVᵀ += dOᵀ·P queued behind dP
      stage_transposed<E, Sw128Blocks<kBN>>(sP, s, 1.f, row, cw * kKeys);
      fence_proxy_async();
      named_barrier(kBarWideStaged + cw, kWG);
      wgmma_fence();
      issue_transposed(dvt, ddo_at, dp_b, stage);

      // ---- dS from dP while dVᵀ runs
      wgmma_wait<1>();
      pin(dp);
      bwd::dscores_rows<Mods>(dp, s, sc, q_idx, delta, key0, t, len_kv, b, hq, cap, grads);

      // ---- dSᵀ to shared memory (this tile's buffer held dSᵀ of tile n - 2, which the other
      // warpgroup's dQ read in tile n - 1), dKᵀ += Qᵀ·dS, then this warpgroup's part of the
      // previous tile's dQ = dS·K (deterministic: dQ is backward.cuh's dq_det kernel's)
      if (!Cfg::kDeterministic && n_done > 0) wait_tile_ended(n_done - 1);
      stage_transposed<E, Sw128Blocks<kBN>>(sDs(buf), dp, 1.f, row, cw * kKeys);
      fence_proxy_async();
      named_barrier(kBarWideStaged + cw, kWG);
      wgmma_fence();
      issue_transposed(dkt, dq_at, desc_advance(dds_b, buf * Cfg::kSmemDsBytes), stage);
      if (cw == 0 && n_done == 0) named_barrier_arrive(kBarStagger, 2 * kWG);
      float dq[Cfg::kDqN / 8][4];
      if constexpr (!Cfg::kDeterministic) issue_dq(dq, buf ^ 1);  // (the first tile's: unused)
      wgmma_wait<Cfg::kDeterministic ? 0 : 1>();
      pin(dkt);
      pin(dvt);
      mbar_arrive(sm.bar_empty(stage));  // dVᵀ, dKᵀ done: the stage goes back to the producer
      if constexpr (!Cfg::kDeterministic) {
        wgmma_wait<0>();
        pin(dq);
        if (n_done > 0) reduce_dq(dq, prev_hq, prev_q0);
        named_barrier_arrive(kBarTileEnded + 2 * cw + (n_done & 1), 2 * kWG);
      }
      prev_hq = hq;
      prev_q0 = q0;
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
      reduce_dq(dq, prev_hq, prev_q0);
    }
  }

  // ---- epilogue: dK·scale and dV, transposed into the K / V tiles once both warpgroups are
  // done with them, 16-byte stores of this warpgroup's rows (rows past len_kv are not written).
  named_barrier(kBarDkdvDone, 2 * kWG);
#pragma unroll
  for (int mb = 0; mb < Cfg::kBlocksQK; ++mb)
    stage_transposed<E, Sw128Blocks<kBN>>(sm.k, dkt[mb], p.scale, 64 * mb + row, cw * kKeys);
#pragma unroll
  for (int mb = 0; mb < Cfg::kBlocksV; ++mb)
    stage_transposed<E, Sw128Blocks<kBN>>(sm.v, dvt[mb], 1.f, 64 * mb + row, cw * kKeys);
  named_barrier(kBarStaged + cw, kWG);
  store_dk_dv<Cfg, kKeys>(p, sm.k, sm.v, b, hkv, cw, kv0, wtid);
}

// The dK/dV kernel a config names, on the CTA's sequence (packed queries: the host's maps are of
// the packed tensors, and QueryBoxes keeps every box inside the CTA's sequence).
template <typename Cfg, typename Mods>
__device__ __forceinline__ void backward_dkdv(const FaBwdParams& p, const FaCaptures& cap,
                                              const FaGradBuffers& grads, const FaTmaMap& dq_map,
                                              const FaTmaPair& qdo) {
  const KeyBlockCta cta(Cfg::kBlockN, p.heads_kv);
  on_bwd_sequence<Cfg, true>(p, cta.b, cta.kv0, [&](const FaBwdParams& s) {
    if constexpr (Cfg::kWide)
      backward_dkdv_wide_kernel<Cfg, Mods>(s, cap, grads, qdo);
    else
      backward_dkdv_kernel<Cfg, Mods>(s, cap, grads, dq_map, qdo);
  });
}

}  // namespace sm90
}  // namespace fa

// Defines the extern "C" kernels name##_pre, name##_dkdv, name##_dq, name##_dq_det (single
// identifiers). __launch_bounds__(384, 1) caps registers at entry so setmaxnreg can redistribute.
#define FAJIT_DEFINE_BACKWARD_SM90(name, Config, Mods)                                                \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_pre(const FaBwdParams p) { \
    fa::allow_dependent_launch();                                                                     \
    fa::backward_pre<fa::WithLayout<typename Config::Aux, Config::kLayout>>(p);                       \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)                                   \
      name##_dkdv(const FaBwdParams p, const FaCaptures cap, const FaGradBuffers grads,               \
                  const __grid_constant__ FaTmaMap dq_map, const __grid_constant__ FaTmaPair qdo) {   \
    fa::allow_dependent_launch(); /* waits: the producer before Δ, whoever writes dq_accum */        \
    fa::sm90::backward_dkdv<Config, Mods>(p, cap, grads, dq_map, qdo);                                \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kPreThreads) name##_dq(const FaBwdParams p) {  \
    fa::wait_for_prior_grids();                                                                       \
    fa::backward_dq<fa::WithLayout<typename Config::Aux, Config::kLayout>>(p);                        \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(Config::kDetThreads)                                   \
      name##_dq_det(const FaBwdParams p, const FaCaptures cap) {                                      \
    fa::wait_for_prior_grids();                                                                       \
    if constexpr (Config::kDeterministic && !Config::kDqOrdered)                                      \
      fa::backward_dq_det<fa::WithLayout<typename Config::Aux, Config::kLayout>, Mods>(p, cap);       \
  }

#endif  // FAJIT_BACKWARD_SM90_CUH
