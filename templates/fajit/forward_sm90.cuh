// fajit forward attention kernel for Hopper (sm_90a): wgmma + warp specialisation.
// Same FaMods, kernel arguments and semantics as fajit/forward.cuh (the sm_80 FA-2 kernel):
// codegen switches by including this header and naming the config and macro below.
//
// ---- How codegen uses it ------------------------------------------------------------------
//   #include "fajit/params.h"
//   #include "fajit/prelude.cuh"
//   struct FaMods { ... };                                   // see templates/README.md
//   #include "fajit/forward_sm90.cuh"
//   using FaConfig = fa::Sm90FwdConfig<fa::bf16_t, 128, 128, 128, 3, true, true, false, 2>;
//                          // the tile from the host: fa::default_tile() (kernel_spec.h)
//   FAJIT_DEFINE_FORWARD_SM90(fajit_fwd, FaConfig, FaMods)
// NVRTC: --gpu-architecture=sm_90a (wgmma and setmaxnreg exist only there). Macro arguments
// must be single identifiers (name the config with a `using` first). The kernel is extern "C".
//
// ---- Config (fa::Sm90FwdConfig<Element, DQK, DV, BLOCK_N, STAGES, OVERLAP, PINGPONG, EARLY_K,
//                                 CONSUMERS, CP_ASYNC_KV, PERSISTENT>)
//   Element   fa::f16_t or fa::bf16_t (Q, K, V, O); LSE is fp32
//   DQK, DV   head dims of Q·Kᵀ and of V/O: multiples of 8 from 32 to 256, independently
//             (rows padded to 64-column swizzle blocks; Q·Kᵀ runs ceil(DQK / 16) k-steps and
//             P·V an N of DV rounded up to 16, over zero-filled columns; above 128 P·V is two
//             wgmmas per k-step, split at a 64-column block of V)
//   BLOCK_N   key/value rows per pipeline tile (the wgmma N of S = Q·Kᵀ): a multiple of 16 from
//             64 to 128; 128 where O and S fit the consumers' registers (with three consumers
//             above DV 64, P through shared memory: see CONSUMERS), 112 with three consumers
//             above head dim 64, 64 above DV 128 (O's 256 columns and S share them)
//   STAGES    K/V shared-memory stages (2..4, within 227 KiB)
//   OVERLAP   issue S_{j+1} = Q·K_{j+1}ᵀ before the softmax of S_{j+1} runs against P_j·V_j
//             (FA-3 intra-warpgroup pipelining); false: S, softmax, P·V strictly in turn
//   PINGPONG  the consumer warpgroups take turns issuing their GEMMs, round robin (named
//             barriers 4..), so one's softmax runs while the others' GEMMs use the tensor cores
//   EARLY_K   a K stage goes back to the producer as soon as S = Q·Kᵀ has completed, a tile
//             before its V, and the producer copies K_{j+1} before V_j: on a 2-stage ring K_{j+1}
//             then loads under the softmax of S_j instead of after P_{j-1}·V_{j-1}. false: a stage
//             (K and V) goes back after its P·V, and K_j, V_j are copied in turn.
//   CONSUMERS consumer warpgroups of 64 query rows each, 2 or 3: BLOCK_M = 64 * CONSUMERS.
//             Three (192 rows, FA-3's d64 tile) give each softmax two other warpgroups' GEMMs
//             to run under; they share 160 registers a thread (2: 232), so S, P and O fit only
//             narrow heads (BLOCK_N 128 up to DV 64, 112 up to 96). At BLOCK_N 128 above DV 64
//             each consumer stages P in shared memory (kPFromSmem: a 64 x 128 tile of its own)
//             and P·V reads it from there (SS), so S and O alone hold registers: 192 x 128 up
//             to DV 128 (FlashAttention-3 names it beside its own d128 tile; 2 stages fit).
//   CP_ASYNC_KV false (default): K/V come by TMA only (the launch's tensor maps must be
//             enabled); true: the producer warpgroup copies them with cp.async and the maps
//             are not read (the twin for tensors the driver cannot map, and the ragged and
//             paged layouts)
//   PERSISTENT false (default): one CTA per query block. true (dense, K/V by TMA; the host
//             takes it on every such tile where two Q regions fit): one CTA per SM takes
//             query blocks from FaFwdParams::tile_counter (zeroed before the launch; block
//             blockIdx.x first, then gridDim.x + atomicAdd) in grid_tile's heaviest-first order;
//             the producer thread publishes each block's walk in shared memory and loads its Q
//             by TMA into region k % 2 once the consumers have read block k - 2's staged O
//             there (q_empty); the K/V ring runs on from block to block.
// Sequence layouts: fa::WithLayout<Sm90FwdConfig<..., true>, fa::kRaggedLayout or
// fa::kPagedLayout> (attention_tile.cuh, as forward.cuh): each CTA runs on its sequence
// (rebase_sequence; a query block past the sequence's end returns at once), and paged K/V rows
// are gathered through the page table (PagedRows).
//
// ---- Launch (host mirrors these; the constants are spelled out) --------------------------
//   grid  = ( ceil(len_q / BLOCK_M), batch * heads_q, 1 )     (as forward.cuh)
//           PERSISTENT: ( min(ceil(len_q / BLOCK_M) * batch * heads_q, SMs), 1, 1 )
//   block = ( 128 * (1 + CONSUMERS), 1, 1 )                    == Config::kThreads
//   dynamic shared memory bytes                                == Config::kSmemBytes
//         = 1024 (alignment slack) + 2 * (R * BLOCK_M * max(PQK, PV) + STAGES * BLOCK_N * (PQK + PV)
//                                         + (P from shared memory) CONSUMERS * 64 * 128)
//           (P = the head dim rounded up to 64; R = 2 Q regions with PERSISTENT, else 1)
//           + 8 * (1 + 4 * STAGES)                             (mbarriers)
//           PERSISTENT: + 8 * 3 + 72                           (q and q_empty barriers, slots)
//   always > 48 KiB: cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, n).
//   Kernel arguments: (const FaFwdParams p, const FaCaptures cap, FaTmaPair maps (K, V),
//   FaTmaPair qmaps (Q as .a: PERSISTENT only, boxes of BLOCK_M rows)), by value.
//   Host-validated preconditions (as forward.cuh): scale > 0; heads_q % heads_kv == 0;
//   len_q, len_kv >= 1; head dim contiguous; Q/K/V/O base pointers and row strides 16-byte
//   aligned (row strides multiples of 8 elements); mask.q_block % BLOCK_M == 0 and
//   mask.kv_block == BLOCK_N, one tile a sparse block (the host regroups a mask built from
//   mask_mod into the tile's blocks, 192x128 or 192x112, and splits any mask's wider kv blocks:
//   BlockMask::regrouped); table indices < ceil(len_kv / kv_block). A compute capability 9.0
//   device (sm_90a code loads on nothing else).
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
//   Warpgroup 0 (producer, setmaxnreg down to 40, 32 with three consumers): cp.async of the Q (PERSISTENT:
//   TMA) tile, then TMA (CP_ASYNC_KV: cp.async) of each K and V tile into 128B-swizzled stages (with EARLY_K,
//   K_{j+1} before V_j); completion reaches the consumers through mbarriers (full_k[s], full_v[s]); it waits
//   on empty_v[s] (and with EARLY_K, empty_k[s] for K) before reusing a stage. Warpgroups 1.. (consumers,
//   setmaxnreg up to 232, 160 with three): 64 query rows each; S = Q·Kᵀ by wgmma m64n{BLOCK_N}k16 with Q and
//   K from shared memory; score_mod/mask_mod and the online softmax (exp2, scale·log2e folded) on the
//   accumulator registers; P converted to 16-bit in registers and used as the A operand of O += P·V (wgmma
//   m64n{DV}k16, V MN-major from shared memory; kPFromSmem: P staged by stmatrix in the warpgroup's P tile
//   and read from there); each warp arrives on empty_v[s] once its P·V has completed
//   (with EARLY_K, on empty_k[s] once its S has). A consumer whose 64 rows see none of a tile (all past
//   len_q, or an empty sub-block in mask.kv_sub_kinds) computes nothing there: it waits for the tile's
//   stage, releases it and passes its turns on; a full sub-block skips mask_mod. The mods come
//   split (codegen; SplitMods): their loads by q once per query block (ModRows), their loads by
//   kv for a tile issued while its S runs, spread over the warp and shuffled (ModCols).
//   Epilogue: O / l staged through the warpgroup's own rows of the Q region, 16-byte stores.
#ifndef FAJIT_FORWARD_SM90_CUH
#define FAJIT_FORWARD_SM90_CUH

#include "fajit/attention_tile.cuh"
#include "fajit/block_walk.cuh"
#include "fajit/params.h"
#include "fajit/prelude.cuh"
#include "fajit/wgmma_sm90.cuh"

namespace fa {

template <typename Element_, int kHeadDimQK_, int kHeadDimV_, int kBlockN_ = 128, int kStages_ = 2,
          bool kOverlap_ = true, bool kPingPong_ = false, bool kEarlyK_ = false, int kConsumers_ = 2,
          bool kCpAsyncKv_ = false, bool kPersistent_ = false>
struct Sm90FwdConfig : AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_> {
  using Element = Element_;
  static constexpr int kHeadDimQK = kHeadDimQK_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kConsumerWarpgroups = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers_;  // 64 query rows per consumer warpgroup
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kEarlyK = kEarlyK_;
  static constexpr bool kOverlap = kOverlap_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kTmaKv = !kCpAsyncKv_;
  // PERSISTENT: one CTA per SM takes query blocks (heaviest first) from a counter until none
  // is left, the next block's Q loading into the other of two Q regions and its K/V streaming
  // on behind the current block's, so the pipeline neither drains nor refills between blocks.
  static constexpr bool kPersistent = kPersistent_;
  static constexpr int kQRegions = kPersistent_ ? 2 : 1;
  // Three consumers at 128 keys above DV 64: P·V takes P from shared memory, each consumer
  // warpgroup staging its 64 rows of P (128B-swizzled, as Q) after the softmax.
  static constexpr bool kPFromSmem = kConsumers_ == 3 && kBlockN_ == 128 && kHeadDimV_ > 64;

  static constexpr int kConsumerRows = kBlockM / kConsumerWarpgroups;  // 64: one wgmma M
  static constexpr int kThreads = sm90::kWarpgroupThreads * (1 + kConsumerWarpgroups);
  // 128 * 40 + 256 * 232 <= 65536 with two consumer warpgroups, 128 * 32 + 384 * 160 with three
  static constexpr int kProducerRegs = kConsumers_ == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kConsumers_ == 2 ? 232 : 160;
  // Shared rows are padded to whole 64-column swizzle blocks (HeadRow::kRowBytes): D 80 and
  // 96 take the room of 128.
  using Shape = AttentionTileShape<kBlockN_, kHeadDimQK_, kHeadDimV_>;
  static constexpr int kMaxRowBytes =
      Shape::RowQK::kRowBytes > Shape::RowV::kRowBytes ? Shape::RowQK::kRowBytes : Shape::RowV::kRowBytes;
  static constexpr int kSmemQOBytes = kBlockM * kMaxRowBytes;            // a Q tile, then O staging
  static constexpr int kSmemKBytes = kBlockN * Shape::RowQK::kRowBytes;  // one K stage
  static constexpr int kSmemVBytes = kBlockN * Shape::RowV::kRowBytes;   // one V stage
  // P of one consumer warpgroup (kPFromSmem): 64 rows of two 64-column swizzle blocks
  static constexpr int kSmemPBytes = kPFromSmem ? 64 * 2 * sm90::kSw128RowBytes : 0;
  static constexpr int kSmemBarOffset =
      kQRegions * kSmemQOBytes + kStages * (kSmemKBytes + kSmemVBytes) + kConsumers_ * kSmemPBytes;
  // q, full_k, full_v, empty_v, empty_k; PERSISTENT: the second region's q and both regions'
  // q_empty, then each region's published block (kSlotInts ints)
  static constexpr int kNumBarriers = 1 + 4 * kStages + (kPersistent_ ? 3 : 0);
  static constexpr int kSlotInts = 9;
  static constexpr int kSmemBytes = sm90::kSwizzleAtomBytes + kSmemBarOffset +
                                    sm90::kMbarBytes * kNumBarriers + (kPersistent_ ? 2 * kSlotInts * 4 : 0);

  static_assert(kHeadDimQK >= 32 && kHeadDimQK <= 256, "DQK must be a multiple of 8 from 32 to 256");
  static_assert(kHeadDimV >= 32 && kHeadDimV <= 256, "DV must be a multiple of 8 from 32 to 256");
  static_assert(kHeadDimV <= 128 || kBlockN == 64, "DV above 128 needs BLOCK_N 64 (O and S in registers)");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 64 && kBlockN <= 128,
                "BLOCK_N must be a multiple of 16 from 64 to 128 (sm90 kernel)");
  static_assert(
      !kPFromSmem || kPingPong_,
      "P from shared memory (three consumers above DV 64) needs ping-pong: the turn barrier orders a "
      "warpgroup's staged P before its P·V");
  static_assert(kStages >= 2 && kStages <= 4, "STAGES must be 2, 3 or 4");
  static_assert(kConsumers_ == 2 || kConsumers_ == 3, "CONSUMERS must be 2 or 3");
  static_assert(!kPersistent_ || kTmaKv, "PERSISTENT needs K/V by TMA (CP_ASYNC_KV false)");
  static_assert(kSmemBytes <= 227 * 1024, "tile config needs more than 227 KiB of shared memory");
};

namespace sm90 {

// Named barrier ids (0 is __syncthreads): each consumer warpgroup's epilogue barrier, and each
// one's ping-pong turn barrier (waited on by that warpgroup, arrived on by the one before it).
constexpr int kBarEpilogue = 1;  // + consumer index
constexpr int kBarTurn = 4;      // + consumer index

template <typename Cfg, typename Mods>
__device__ __forceinline__ void forward_kernel(const FaFwdParams& p, const FaCaptures& cap,
                                               const FaTmaPair& maps, const FaTmaPair& qmaps) {
  using E = typename Cfg::Element;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kRows = Cfg::kConsumerRows;  // query rows per consumer warpgroup
  constexpr int kWG = kWarpgroupThreads;
  using QTile = Sw128Blocks<kBM>;  // the Q region, later O staging

  extern __shared__ unsigned char smem_raw[];
  // Every swizzle atom starts on a 1024 B boundary (descriptor base offset 0).
  const u32 sQ = (smem_addr(smem_raw) + (kSwizzleAtomBytes - 1)) & ~u32(kSwizzleAtomBytes - 1);
  const u32 sK = sQ + Cfg::kQRegions * Cfg::kSmemQOBytes;
  const u32 sV = sK + kStages * Cfg::kSmemKBytes;
  const u32 bar_q = sQ + Cfg::kSmemBarOffset;
  auto bar_full_k = [&](int s) { return bar_q + kMbarBytes * (1 + s); };
  auto bar_full_v = [&](int s) { return bar_q + kMbarBytes * (1 + kStages + s); };
  // empty_v: the stage's V (and, without EARLY_K, its K) is free; empty_k: its K (EARLY_K)
  auto bar_empty_v = [&](int s) { return bar_q + kMbarBytes * (1 + 2 * kStages + s); };
  auto bar_empty_k = [&](int s) { return bar_q + kMbarBytes * (1 + 3 * kStages + s); };
  // Q region r (PERSISTENT: 0 and 1 by turns): its Q loaded; the consumers done with its O
  auto bar_q_full = [&](int r) { return r == 0 ? bar_q : bar_q + kMbarBytes * (1 + 4 * kStages); };
  auto bar_q_empty = [&](int r) { return bar_q + kMbarBytes * (2 + 4 * kStages + r); };
  auto sq_of = [&](int r) { return sQ + u32(r) * u32(Cfg::kSmemQOBytes); };
  // PERSISTENT: region r's query block as the producer publishes it to the consumers, nine
  // ints: the block (n_blocks or more: none left), its q0, b, h, its walk's partial and full
  // block counts, first two block indices and their sub-block kinds (a byte each), so a
  // consumer starts the block without a load.
  enum Slot {
    kSlotBlock,
    kSlotQ0,
    kSlotB,
    kSlotH,
    kSlotPartial,
    kSlotFull,
    kSlotIndex0,
    kSlotIndex1,
    kSlotKinds,
    kSlots
  };
  static_assert(kSlots == Cfg::kSlotInts, "the published block's slots");
  const u32 slots = bar_q + kMbarBytes * Cfg::kNumBarriers;
  auto slot = [&](int r, int field) { return slots + 4 * (kSlots * r + field); };

  const int tid = threadIdx.x;
  const int warpgroup = warpgroup_index();
  const int len_q = p.len_q, len_kv = p.len_kv;

  // ---- work: query blocks of BLOCK_M rows. Without PERSISTENT the CTA's own (the grid holds
  // every block, in grid_tile's order: heaviest first). With it, the same blocks in the same
  // order as one list: block blockIdx.x first, then gridDim.x + a counter's next value, until
  // none is left; the load balances itself, and the CTA's start costs once per SM.
  // PERSISTENT: the tables' first block may start q_off rows (a multiple of 64) before query 0,
  // so that a length's one partial block comes first, where a causal-like walk is shortest
  // (FaBlockTables::q_offset; the host sets it for this form only). Rows before 0 are rows no
  // warpgroup computes or stores, like rows past len_q.
  const int q_off = Cfg::kPersistent ? p.mask.q_offset : 0;
  const int n_qblocks = (len_q + q_off + kBM - 1) / kBM;
  const int n_blocks = Cfg::kPersistent ? n_qblocks * p.batch * p.heads_q : 1;
  auto block_cta = [&](int block) {
    if constexpr (Cfg::kPersistent) {
      QueryBlockCta c(grid_tile<true>(block, n_qblocks, p.batch * p.heads_q), kBM, p.heads_q, p.heads_kv);
      c.q0 -= q_off;
      return c;
    } else {
      return QueryBlockCta(kBM, p.heads_q, p.heads_kv);
    }
  };

  if (tid == 0) {
    // q: the producer threads' cp.async arrivals; PERSISTENT: thread 0's TMA arrival (with the
    // block in the slot), and q_empty every consumer thread's
    for (int r = 0; r < Cfg::kQRegions; ++r) mbar_init(bar_q_full(r), Cfg::kPersistent ? 1 : kWG);
    if constexpr (Cfg::kPersistent)
      for (int r = 0; r < 2; ++r) mbar_init(bar_q_empty(r), kWG * Cfg::kConsumerWarpgroups);
    // full: TMA, one arrive (with the stage's bytes) from the issuing thread; cp.async, one
    // arrive per producer thread. empty: one arrive per consumer warp.
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full_k(s), Cfg::kTmaKv ? 1 : kWG);
      mbar_init(bar_full_v(s), Cfg::kTmaKv ? 1 : kWG);
      mbar_init(bar_empty_v(s), 4 * Cfg::kConsumerWarpgroups);
      mbar_init(bar_empty_k(s), 4 * Cfg::kConsumerWarpgroups);
    }
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ================= producer: cp.async Q, then K/V tiles through the stages =============
    setmaxnreg_dec<Cfg::kProducerRegs>();
    // `load(is_k, stage, start)` copies one K or V tile and arrives on its full barrier. The
    // rings run on from one query block's walk into the next's, as the consumers' ring does.
    // The walk is the consumers' (BlockCursor, its kinds unused), so both see the same tiles.
    StageRing<kStages> rv, rk;
    auto produce = [&](const BlockWalk<kBN>& walk, auto&& load) {
      if constexpr (!Cfg::kEarlyK) {
        for (BlockCursor<kBN> cur(walk, nullptr, len_kv); !cur.done(walk); cur.next(walk, nullptr, len_kv)) {
          mbar_wait(bar_empty_v(rv.stage), rv.phase ^ 1u);
          load(true, rv.stage, cur.start);
          load(false, rv.stage, cur.start);
          rv.advance();
        }
        return;
      }
      // EARLY_K: K runs a tile ahead of V (K_{j+1} before V_j), each waiting for its own release.
      auto load_k = [&](int start) {
        mbar_wait(bar_empty_k(rk.stage), rk.phase ^ 1u);
        load(true, rk.stage, start);
        rk.advance();
      };
      BlockCursor<kBN> cur(walk, nullptr, len_kv);
      if (!cur.done(walk)) load_k(cur.start);
      while (!cur.done(walk)) {
        const int start = cur.start;
        cur.next(walk, nullptr, len_kv);
        if (!cur.done(walk)) load_k(cur.start);
        mbar_wait(bar_empty_v(rv.stage), rv.phase ^ 1u);
        load(false, rv.stage, start);
        rv.advance();
      }
    };
    // TMA: one thread issues each K or V tile of (KV head, batch) as boxes of 64 columns x
    // BLOCK_N rows into the stage's column blocks (zeros past D and len_kv).
    auto tma_kv = [&](int kv_head, int batch) {
      return [&, kv_head, batch](bool is_k, int stage, int start) {
        if (is_k)
          tma_load_tile<kBN, typename Cfg::RowQK>(sK + stage * Cfg::kSmemKBytes, &maps.a, start, kv_head,
                                                  batch, bar_full_k(stage));
        else
          tma_load_tile<kBN, typename Cfg::RowV>(sV + stage * Cfg::kSmemVBytes, &maps.b, start, kv_head,
                                                 batch, bar_full_v(stage));
      };
    };
    if constexpr (Cfg::kPersistent) {
      // One thread: block blockIdx.x, then the counter's; each block's walk published and its Q
      // loaded by TMA into region k % 2 once the consumers have stored block k - 2's O from
      // it, its K/V behind.
      if (tid == 0) {
        int block = blockIdx.x;
#pragma unroll 1
        for (int k = 0;; ++k) {
          const int r = k & 1;
          if (k >= 2) mbar_wait(bar_q_empty(r), ((k >> 1) - 1) & 1);
          st_shared_b32(slot(r, kSlotBlock), static_cast<u32>(block));
          if (block >= n_blocks) {  // none left: the consumers read that in the region's slot
            mbar_arrive(bar_q_full(r));
            break;
          }
          const QueryBlockCta c = block_cta(block);
          const BlockWalk<kBN> walk(p.mask, c.b, c.h, c.q0);
          auto publish = [&](Slot field, int value) {
            st_shared_b32(slot(r, field), static_cast<u32>(value));
          };
          publish(kSlotQ0, c.q0);
          publish(kSlotB, c.b);
          publish(kSlotH, c.h);
          publish(kSlotPartial, walk.n_partial);
          publish(kSlotFull, walk.n_blocks - walk.n_partial);
          using Cursor = BlockCursor<kBN>;
          publish(kSlotIndex0, Cursor::index_of(walk, 0));
          publish(kSlotIndex1, Cursor::index_of(walk, 1));
          const unsigned char* kinds_row = Cursor::kinds_row(p.mask, c.b, c.h, c.q0);
          publish(kSlotKinds, static_cast<int>(Cursor::kinds_of(walk, kinds_row, 0) |
                                               Cursor::kinds_of(walk, kinds_row, 1) << 8));
          // The Q barrier's arrival (with the tile's bytes) releases the slot to the consumers.
          tma_load_tile<kBM, typename Cfg::RowQK>(sq_of(r), &qmaps.a, c.q0, c.h, c.b, bar_q_full(r));
          const int next =
              static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);  // lands under the tiles
          produce(walk, tma_kv(c.hkv, c.b));
          block = next;
        }
      }
      return;
    }
    const QueryBlockCta c = block_cta(0);
    const E* qg = static_cast<const E*>(p.q) + c.b * p.q_stride_b + c.h * p.q_stride_h;
    load_tile_sw128<kBM, typename Cfg::RowQK, kWG>(sQ, qg, p.q_stride_m, c.q0, len_q, tid);
    mbar_arrive_cp_async(bar_q);
    const BlockWalk<kBN> walk(p.mask, c.b, c.h, c.q0);
    if constexpr (Cfg::kTmaKv) {
      if (tid == 0) produce(walk, tma_kv(c.hkv, c.b));  // no producer issue slots per chunk
    } else {
      // cp.async by all producer threads, from K/V's rows as the layout lays them out.
      auto produce_from = [&](const auto& k_rows, const auto& v_rows) {
        produce(walk, [&](bool is_k, int stage, int start) {
          if (is_k) {
            load_rows_sw128<kBN, typename Cfg::RowQK, kWG>(sK + stage * Cfg::kSmemKBytes, k_rows, start,
                                                           len_kv, tid);
            mbar_arrive_cp_async(bar_full_k(stage));
          } else {
            load_rows_sw128<kBN, typename Cfg::RowV, kWG>(sV + stage * Cfg::kSmemVBytes, v_rows, start,
                                                          len_kv, tid);
            mbar_arrive_cp_async(bar_full_v(stage));
          }
        });
      };
      const E* k_head = static_cast<const E*>(p.k) + c.hkv * p.k_stride_h;
      const E* v_head = static_cast<const E*>(p.v) + c.hkv * p.v_stride_h;
      if constexpr (Cfg::kLayout == kPagedLayout) {  // k/v_stride_b: the pool's page stride
        const int* pages = p.page_table + c.b * p.page_table_stride;
        auto paged = [&](const E* head, long long page_stride, long long row_stride) {
          return PagedRows<E>{reinterpret_cast<const char*>(head), pages, p.page_size,
                              static_cast<int>(page_stride * sizeof(E)),
                              static_cast<int>(row_stride * sizeof(E))};
        };
        produce_from(paged(k_head, p.k_stride_b, p.k_stride_n), paged(v_head, p.v_stride_b, p.v_stride_n));
      } else {
        produce_from(StridedRows<E>{k_head + c.b * p.k_stride_b, p.k_stride_n},
                     StridedRows<E>{v_head + c.b * p.v_stride_b, p.v_stride_n});
      }
    }
    cp_async_wait_all();  // the Q tile (and the cp.async K/V tiles)
    return;
  }

  // ================= consumers: kRows (64) query rows per warpgroup ===========================
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int cw = warpgroup - 1;
  const int wtid = tid - kWG * warpgroup;
  const int warp = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int row_base = cw * kRows + warp * 16 + g;  // this thread's rows: row_base, row_base + 8
  const float sl2 = softmax_log2_scale(Mods::kHasScoreMod, p.scale);
  float o[Cfg::kDT][4];
  u32 pa[Cfg::kKP][4];  // P as the register A operand of P·V (kPFromSmem: packed to be staged)
  // kPFromSmem: this warpgroup's P tile (after the K/V stages), the A operand of P·V
  const u32 sP = sV + kStages * Cfg::kSmemVBytes + cw * Cfg::kSmemPBytes;

  // ---- the two GEMMs, each one commit group. Q (K-major, this warpgroup's rows of the query
  // block's region) and K (K-major) from shared memory for S = Q·Kᵀ; P from registers (with
  // kPFromSmem from its staging, K-major) and V (MN-major) for O += P·V.
  u64 dq = 0;
  const u64 dk = desc_sw128(sK, 16, kSwizzleAtomBytes);
  const u64 dv = desc_sw128(sV, kBN * kSw128RowBytes, kSwizzleAtomBytes);
  const u64 dp = desc_sw128(sP, 16, kSwizzleAtomBytes);
  auto issue_s = [&](float(&s)[Cfg::kNT][4], int stage) {
    const u64 dks = desc_advance(dk, stage * Cfg::kSmemKBytes);  // then constant steps
#pragma unroll
    for (int kk = 0; kk < Cfg::kKQ; ++kk)
      wgmma_ss<E, kBN>(s, desc_advance(dq, kmajor_kstep_offset<kBM>(kk)),
                       desc_advance(dks, kmajor_kstep_offset<kBN>(kk)), kk > 0);
    wgmma_commit();
  };
  // P·V's N is the head dim rounded up to 16; above 128 (wgmma's widest here) O's columns go
  // as two wgmmas, split at a 64-column block of V: 128 and the rest, or 64 and the rest where
  // the rest would be under 32 (144 = 64 + 80).
  constexpr int kPvN = Cfg::kDT * 8;
  constexpr int kPvN0 = kPvN <= 128 ? kPvN : kPvN - 128 >= 32 ? 128 : 64;
  constexpr int kPvN1 = kPvN - kPvN0;
  auto issue_pv = [&](int stage) {
    const u64 dvs = desc_advance(dv, stage * Cfg::kSmemVBytes);
#pragma unroll
    for (int kk = 0; kk < Cfg::kKP; ++kk) {
      const u64 vk = desc_advance(dvs, mnmajor_kstep_offset(kk));
      if constexpr (Cfg::kPFromSmem) {  // P K-major from its staging, V MN-major
        wgmma_ss<0, 1, 0, Cfg::kDT>(Tag<E, kPvN0>(), o, desc_advance(dp, kmajor_kstep_offset<kRows>(kk)), vk,
                                    1);
        continue;
      }
      wgmma_rs_cols<E, kPvN0, 0, Cfg::kDT>(o, pa[kk], vk, 1);
      if constexpr (kPvN1 > 0)
        wgmma_rs_cols<E, kPvN1, kPvN0 / 8, Cfg::kDT>(o, pa[kk],
                                                     desc_advance(vk, kPvN0 / 64 * kBN * kSw128RowBytes), 1);
    }
    wgmma_commit();
  };

  // ---- ping-pong: a warpgroup waits for its turn before issuing GEMMs and hands the turn to
  // the next (round robin) after issuing them, so one's softmax runs under the others' GEMMs.
  // All issue the same number of turns (same tiles); the last warpgroup hands warpgroup 0 the
  // first turn up front and warpgroup 0 takes one extra turn at the end, so every bar.sync of
  // 256 meets exactly one bar.arrive of the warpgroup before it.
  constexpr int kCW = Cfg::kConsumerWarpgroups;
  auto turn_wait = [&]() {
    if constexpr (Cfg::kPingPong) named_barrier(kBarTurn + cw, 2 * kWG);
  };
  auto turn_pass = [&]() {
    if constexpr (Cfg::kPingPong) named_barrier_arrive(kBarTurn + (cw + 1) % kCW, 2 * kWG);
  };
  if (Cfg::kPingPong && cw == kCW - 1) named_barrier_arrive(kBarTurn, 2 * kWG);

  // A turn taken and handed on with nothing issued (a tile this warpgroup skips).
  auto pass_turn = [&]() {
    turn_wait();
    turn_pass();
  };
  // One turn on the tensor cores: `gemms` issues (and commits) wgmma groups.
  auto issue_turn = [&](auto&& gemms) {
    turn_wait();
    wgmma_fence();
    gemms();
    turn_pass();
  };
  // Waits for the producer's stage and makes its cp.async data visible to wgmma (TMA writes
  // through the async proxy that wgmma reads: the mbarrier's completion is all they need, and
  // the fence, a MEMBAR.ALL.CTA, would wait twice per tile for nothing).
  auto wait_loaded = [&](u32 bar, u32 phase) {
    mbar_wait(bar, phase);
    if constexpr (!Cfg::kTmaKv) fence_proxy_async();
  };
  // A stage goes back to the producer once this warp's GEMMs that read it have completed.
  auto release = [&](u32 bar_empty) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar_empty);
  };
  // After S = Q·Kᵀ has completed: with EARLY_K its K stage goes back to the producer.
  auto s_done = [&](int stage) {
    if constexpr (Cfg::kEarlyK) release(bar_empty_k(stage));
  };
  // S_j = Q·K_jᵀ, alone: issued, waited for.
  auto gemm_s = [&](float(&s)[Cfg::kNT][4], int stage, u32 phase) {
    wait_loaded(bar_full_k(stage), phase);
    issue_turn([&] { issue_s(s, stage); });
    wgmma_wait<0>();
    pin(s);
    s_done(stage);
  };
  // After P·V has completed: O and P are free again, the V stage (without EARLY_K, K and V)
  // goes back to the producer (unless `keep`: the overlap loop's zero-P first step runs on a
  // stage it keeps).
  auto pv_done = [&](int stage, bool keep = false) {
    wgmma_wait<0>();
    pin(o);
    if constexpr (!Cfg::kPFromSmem) pin(pa);
    if (!keep) release(bar_empty_v(stage));
  };
  // A tile this warpgroup's rows do not see: its stage goes back once loaded (so the release
  // counts towards this tile's phase, not the one before). The caller passes its turns on.
  auto skip_stage = [&](int stage, u32 phase) {
    mbar_wait(bar_full_k(stage), phase);
    s_done(stage);
    mbar_wait(bar_full_v(stage), phase);
    release(bar_empty_v(stage));
  };
  // O += P·V, alone: issued, waited for, stage released.
  auto gemm_pv = [&](int stage, u32 phase) {
    wait_loaded(bar_full_v(stage), phase);
    issue_turn([&] { issue_pv(stage); });
    pv_done(stage);
  };
  // P for the next P·V, packed in pa: with kPFromSmem also staged in this warpgroup's P tile.
  // wgmma reads it through the async proxy after the turn barrier, which every warp of the
  // warpgroup reaches after its fence (so P·V sees all four warps' rows). Rewriting the tile
  // needs no barrier: each warp stores only its own 16 rows, which only its own part of the m64
  // P·V reads, and only after its own wgmma_wait<0> on that P·V (as FlashAttention-3 assumes).
  auto stage_p = [&] {
    if constexpr (Cfg::kPFromSmem) {
      stage_packed_x4<Sw128Blocks<kRows>>(sP, pa, warp * 16);
      fence_proxy_async();
    }
  };
  auto set_p = [&](const float(&s)[Cfg::kNT][4]) {
    pack_a<E>(pa, s);
    stage_p();
  };
  int q_idx[2], b = 0, h = 0;  // the current query block's rows, batch and head
  using Split = SplitMods<Mods>;
  ModRows<Split> mod_rows;                // the mods' values of those rows
  using Cols = ModCols<Split, Cfg::kNT>;  // the mods' loads by key of a tile, issued while its S runs
  auto mods = [&](float(&s)[Cfg::kNT][4], int start, bool is_full, const Cols& cols) {
    score_tile<Split, kBN>(s, q_idx, start, t, len_kv, is_full, p.scale, b, h, mod_rows, cols, cap);
  };

  StageRing<kStages> ring;  // the current tile's stage, running on across query blocks
#pragma unroll 1
  for (int k = 0;; ++k) {
    const int r = k & (Cfg::kQRegions - 1);
    mbar_wait(bar_q_full(r), (k >> 1) & 1);  // also before an empty walk: O staging reuses the Q region
    // The block: PERSISTENT, as the producer published it (each value read once for the warp,
    // so it stays warp-uniform); else the CTA's own, its walk read from the tables.
    auto published = [&](Slot field) {
      return __shfl_sync(0xffffffffu, static_cast<int>(ld_shared_b32(slot(r, field))), 0);
    };
    int q0, index0 = 0, index1 = 0, kinds01 = 0;
    auto walk_of = [&] {
      if constexpr (Cfg::kPersistent) {
        q0 = published(kSlotQ0), b = published(kSlotB), h = published(kSlotH);
        index0 = published(kSlotIndex0), index1 = published(kSlotIndex1), kinds01 = published(kSlotKinds);
        return BlockWalk<kBN>(p.mask, b, h, q0, published(kSlotPartial), published(kSlotFull));
      } else {
        const QueryBlockCta c = block_cta(0);
        q0 = c.q0, b = c.b, h = c.h;
        return BlockWalk<kBN>(p.mask, b, h, q0);
      }
    };
    if (Cfg::kPersistent && published(kSlotBlock) >= n_blocks) break;
    const BlockWalk<kBN> walk = walk_of();
    // This warpgroup's rows along the walk: a tile none of them sees is skipped (an empty
    // sub-block of a regrouped mask's partial tile, or rows all past len_q), a full sub-block
    // needs no mask_mod. `live` masks the kinds to empty for rows all past len_q (or, PERSISTENT
    // with a q offset, all before query 0: one compare as unsigned).
    const unsigned char* kinds_row = BlockCursor<kBN>::kinds_row(p.mask, b, h, q0);
    const unsigned live = static_cast<unsigned>(q0 + cw * kRows) < static_cast<unsigned>(len_q) ? 3u : 0u;
    auto first_tile = [&] {
      if constexpr (Cfg::kPersistent)
        return BlockCursor<kBN>(walk, kinds_row, len_kv, index0, index1,
                                static_cast<unsigned>(kinds01) & 0xffu, static_cast<unsigned>(kinds01) >> 8);
      else
        return BlockCursor<kBN>(walk, kinds_row, len_kv);
    };
    const u32 sq = sq_of(r);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + row_base + 8 * hh;
      q_idx[hh] = q < 0 ? 0 : q < len_q ? q : len_q - 1;  // mods never see q outside [0, len_q)
    }
    if (live) mod_rows.gather(q_idx, b, h, cap);  // (no tile is computed for rows all past len_q)
    zero_frags(o);
    SoftmaxRows rows;
    rows.init();
    dq = desc_sw128(sq + cw * kRows * kSw128RowBytes, 16, kSwizzleAtomBytes);
    if constexpr (!Cfg::kPersistent) fence_proxy_async();  // Q came by cp.async (PERSISTENT: TMA)
    if constexpr (!Cfg::kOverlap) {
      // S, softmax, P·V strictly in turn.
      for (BlockCursor<kBN> cur = first_tile(); !cur.done(walk);) {
        const int start = cur.start, kind = cur.kind(2 * cw, live);
        if (kind == kFaBlockEmpty) {
          skip_stage(ring.stage, ring.phase);
          pass_turn();  // S's turn and P·V's
          pass_turn();
          ring.advance();
          cur.next(walk, kinds_row, len_kv);
          continue;
        }
        const bool is_full = kind == kFaBlockFull;
        float s[Cfg::kNT][4], alpha[2];
        Cols cols;
        cols.gather(start, len_kv, !is_full, b, cap);
        gemm_s(s, ring.stage, ring.phase);
        cur.next(walk, kinds_row, len_kv);
        mods(s, start, is_full, cols);
        if (rows.step(s, alpha, sl2)) scale_rows(o, alpha);
        set_p(s);
        gemm_pv(ring.stage, ring.phase);
        ring.advance();
      }
    } else {
      // FA-3 intra-warpgroup overlap: S_j is issued together with P_{j-1}·V_{j-1}, and the
      // softmax of S_j runs while P_{j-1}·V_{j-1} is still on the tensor cores. Before the first
      // tile P is 0 and its P·V runs on the first tile's own V (adding nothing; the stage is not
      // released twice): one copy of the score_mod and softmax code for every tile, with no
      // branch around a wgmma, which cuts what NVRTC compiles by a quarter to a third.
      auto zero_p = [&] {
#pragma unroll
        for (int kk = 0; kk < Cfg::kKP; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i) pa[kk][i] = 0u;
        stage_p();
      };
      zero_p();
      StageRing<kStages> prev = ring;  // the previous tile's stage
      bool first = true, any = false;
      for (BlockCursor<kBN> cur = first_tile(); !cur.done(walk);) {
        const int start = cur.start, kind = cur.kind(2 * cw, live);
        any = true;
        if (kind == kFaBlockEmpty) {
          // Its turn issues the pending P_{j-1}·V_{j-1} (no stage stays held across skipped
          // tiles: the producer may need it for the next tile this warpgroup sees), and the
          // next tile seen starts again from a zero P.
          skip_stage(ring.stage, ring.phase);
          if (first) {
            pass_turn();
          } else {
            gemm_pv(prev.stage, prev.phase);
            zero_p();
            first = true;
          }
          ring.advance();
          prev = ring;  // first again: the next tile seen runs its zero-P step on its own V
          cur.next(walk, kinds_row, len_kv);
          continue;
        }
        const bool is_full = kind == kFaBlockFull;
        float s[Cfg::kNT][4], alpha[2];
        // S_j is issued first, and P_{j-1}·V_{j-1} waits for its V behind it (on the first tile,
        // V_0 for the zero-P step). Without EARLY_K the producer copies V_{j-1} before K_j and
        // that wait passes at once; with it, K_j comes first.
        wait_loaded(bar_full_k(ring.stage), ring.phase);
        issue_turn([&] {
          issue_s(s, ring.stage);  // S_j = Q·K_jᵀ
          wait_loaded(bar_full_v(prev.stage), prev.phase);
          issue_pv(prev.stage);  // O += P_{j-1}·V_{j-1}, overlapping the softmax below
        });
        cur.next(walk, kinds_row, len_kv);  // the next tile's block index loads while S_j runs
        Cols cols;
        cols.gather(start, len_kv, !is_full, b, cap);  // and the mods' loads by key
        wgmma_wait<1>();                               // S_j done
        pin(s);
        s_done(ring.stage);
        mods(s, start, is_full, cols);
        const bool rescale = rows.step(s, alpha, sl2);
        pv_done(prev.stage, first);  // P_{j-1}·V_{j-1} done
        if (rescale) scale_rows(o, alpha);
        set_p(s);
        prev = ring;
        ring.advance();
        first = false;
      }
      if (!first)
        gemm_pv(prev.stage, prev.phase);
      else if (any)
        pass_turn();  // the last P·V's turn: every warpgroup takes as many as the others
    }

    // ---- epilogue: O / l staged in this warpgroup's rows of the block's Q region (same layout
    // as Q, so the other warpgroups' Q rows are untouched), 16-byte stores; LSE in natural log.
    {
      float inv[2];
      rows.finish(inv);
      stage_rows<E, QTile>(sq, o, inv, row_base, t);
      // PERSISTENT: after the fence below (it would wait for this store)
      if constexpr (!Cfg::kPersistent) store_row_stats<Mods>(p, b, h, q0, row_base, t, rows, sl2);
    }
    named_barrier(kBarEpilogue + cw, kWG);
    E* og = static_cast<E*>(p.o) + b * p.o_stride_b + h * p.o_stride_h;
    if constexpr (!Cfg::kPersistent) {
      store_rows<kRows, Cfg::RowV::kChunks, kWG, QTile>(og, p.o_stride_m, sq, cw * kRows, q0, len_q, wtid);
      break;
    } else {
      // Once this thread has read its staged rows, the region is free for the next Q (by TMA,
      // the async proxy: the fence orders the reads before it), before the global stores, so
      // the fence waits on no store.
      store_rows_read_first<kRows, Cfg::RowV::kChunks, kWG, QTile>(og, p.o_stride_m, sq, cw * kRows, q0,
                                                                   len_q, wtid, [&] {
                                                                     fence_proxy_async();
                                                                     mbar_arrive(bar_q_empty(r));
                                                                   });
      store_row_stats<Mods>(p, b, h, q0, row_base, t, rows, sl2);
    }
  }  // query blocks

  if (Cfg::kPingPong && cw == 0) turn_wait();  // the turn the last warpgroup handed over
}

// The kernel on the CTA's sequence (dense: p as is). Ragged and paged K/V come by cp.async.
template <typename Cfg, typename Mods>
__device__ __forceinline__ void forward_entry(const FaFwdParams& p, const FaCaptures& cap,
                                              const FaTmaPair& maps, const FaTmaPair& qmaps) {
  static_assert(Cfg::kLayout == kDenseLayout || !Cfg::kTmaKv,
                "ragged and paged layouts take K/V by cp.async (CP_ASYNC_KV true)");
  on_sequence<Cfg>(p, [&](const FaFwdParams& ps) { forward_kernel<Cfg, Mods>(ps, cap, maps, qmaps); });
}

}  // namespace sm90
}  // namespace fa

// Defines the extern "C" kernel `name` for a config and mods struct (single identifiers).
// __launch_bounds__(threads, 1) caps registers at entry (168 at 384 threads, 128 at 512) so
// setmaxnreg can redistribute.
#define FAJIT_DEFINE_FORWARD_SM90(name, Config, Mods)                                         \
  extern "C" __global__ void __launch_bounds__(Config::kThreads, 1)                           \
      name(const FaFwdParams p, const FaCaptures cap, const __grid_constant__ FaTmaPair maps, \
           const __grid_constant__ FaTmaPair qmaps) {                                         \
    fa::sm90::forward_entry<Config, Mods>(p, cap, maps, qmaps);                               \
  }

#endif  // FAJIT_FORWARD_SM90_CUH
