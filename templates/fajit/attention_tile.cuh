// fajit attention pieces on accumulator fragments, shared by every attention kernel (the
// sm_80 mma.sync forward, the sm_90a wgmma forward, and the backward and decoding kernels).
//
// ---- The fragment these work on ------------------------------------------------------------
// A fragment is one thread's share of a 16-row x (8·kNT)-column fp32 accumulator tile,
// `float frag[kNT][4]`, in the mma.sync m16n8 C layout (lane = 4g + t):
//   frag[j][i] = Tile[g + 8*(i/2)][8j + 2t + i%2]
// so a thread holds two rows (g and g + 8, "row half" hh = i/2) and two adjacent columns per
// 8-column n-tile. A wgmma m64nN accumulator is exactly this per warp (warp w owns rows
// 16w..16w+15; wgmma_sm90.cuh), so the Hopper kernel passes its accumulators unchanged.
// Row-wise reductions over a tile are a local pass plus a quad (4-lane) shuffle.
//
// Every primitive does one job, destination first:
//   score_tile      score_mod / mask_mod / kv bounds on an S fragment      (the mods hook)
//   SplitMods       a mods struct's split form (codegen's, or PlainMods: empty parts)
//   ModRows         the mods' loads by query of a thread's two rows, once per query block
//   LaneSpread      a tile's per-column values spread over a warp, shuffled where needed
//   ModSpread       the mods' values (ModValues: score's and mask's) of a tile's positions
//   ModCols         the mods' loads by key of a tile's columns (ModSpread), gathered ahead of S
//   ColumnPair      one column pair's gathered values, shuffled in once for a warp's m-tiles
//   SoftmaxRows     online softmax of a thread's two rows: S -> P, running max/sum, 1/l, LSE
//   scale_rows      multiply each row of a fragment (O rescale)
//   pack_a          16-bit A operand of the next GEMM (P·V) from an fp32 fragment
//   stage_rows      O / l into a shared staging tile (any layout with offset(row, chunk))
//   stage_packed    packed A fragments into a shared staging tile
//   store_rows      staged rows to global memory with 16-byte stores
//   store_row_stats the natural-log LSE (and with kRowMax the largest score) of a thread's two rows
//   KvPipeline      the K/V cp.async ring's prologue and per-tile advance
#ifndef FAJIT_ATTENTION_TILE_CUH
#define FAJIT_ATTENTION_TILE_CUH

#include "fajit/params.h"
#include "fajit/prelude.cuh"

namespace fa {

// Whether the forward kernels also write each row's largest score (FaFwdParams::max_scores):
// codegen defines FAJIT_ROW_MAX for KernelSpec::row_max. Without it SoftmaxRows' running max
// (top) is never read and the compiler drops it: the default kernels carry none of it.
#ifdef FAJIT_ROW_MAX
constexpr bool kRowMax = true;
#else
constexpr bool kRowMax = false;
#endif

// ---- tile shape ------------------------------------------------------------------------------
// Fragment and chunk counts of an attention tile of kBlockN keys with head dims kHeadDimQK
// (Q·Kᵀ) and kHeadDimV (P·V, O), any multiples of 8 (HeadRow: an odd chunk count computes one
// zero chunk more, shared rows are padded to swizzle groups); the kernel configs derive from it.
template <int kBlockN, int kHeadDimQK, int kHeadDimV>
struct AttentionTileShape {
  using RowQK = HeadRow<kHeadDimQK>;         // a Q / K row
  using RowV = HeadRow<kHeadDimV>;           // a V / O / dO row
  static constexpr int kNT = kBlockN / 8;    // 8-column n-tiles of S
  static constexpr int kKQ = RowQK::kSteps;  // k-steps of Q·Kᵀ
  static constexpr int kKP = kBlockN / 16;   // k-steps of P·V
  static constexpr int kDT = RowV::kUsed;    // 8-column n-tiles of O (an even count)
  static constexpr int kCQ = RowQK::kPitch;  // 16-byte chunks per shared Q/K row
  static constexpr int kCV = RowV::kPitch;   // 16-byte chunks per shared V/O row
  static constexpr int kLayout = 0;          // kDenseLayout unless WithLayout says otherwise
};

// ---- sequence layouts (fa::SequenceLayout on the host; FaFwdParams' ragged/paged fields) -----
// Dense: [B, H, L, D] operands. Ragged: each sequence's rows, lengths from the cu_seqlens /
// seqlens tables (rebase_sequence, once per CTA). Paged: ragged, and K/V rows gathered
// through the page table (KvTiles). A kernel config takes one with WithLayout.
constexpr int kDenseLayout = 0, kRaggedLayout = 1, kPagedLayout = 2;
template <typename Config, int kLayout_>
struct WithLayout : Config {
  static constexpr int kLayout = kLayout_;
};

// p rebased on sequence b of a ragged batch: q, o, lse (and k, v when packed) at its first
// rows, len_q / len_kv its own, clamped to [0, the launch's longest] so tables that break the
// contract (unchecked: Sequences::check_tables) cannot make a kernel read past the views.
template <typename E>
__device__ __forceinline__ void rebase_sequence(FaFwdParams& p, int b) {
  const int max_q = p.len_q, max_kv = p.len_kv;
  auto clamp_len = [](int n, int hi) { return n < 0 ? 0 : n > hi ? hi : n; };
  if (p.cu_seqlens_q != nullptr) {
    const int first = p.cu_seqlens_q[b];
    p.len_q = clamp_len(p.cu_seqlens_q[b + 1] - first, max_q);
    p.q = static_cast<const E*>(p.q) + (long long)first * p.q_stride_m;
    p.o = static_cast<E*>(p.o) + (long long)first * p.o_stride_m;
    if (p.lse != nullptr) p.lse += first;
    if (p.max_scores != nullptr) p.max_scores += first;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int first = p.cu_seqlens_k[b];
    p.len_kv = clamp_len(p.cu_seqlens_k[b + 1] - first, max_kv);
    p.k = static_cast<const E*>(p.k) + (long long)first * p.k_stride_n;
    p.v = static_cast<const E*>(p.v) + (long long)first * p.v_stride_n;
  }
  if (p.seqlens_k != nullptr) p.len_kv = clamp_len(p.seqlens_k[b], max_kv);
}

// The K/V cp.async ring of the mma.sync forward and decoding kernels: kStages shared stages,
// the i-th tile of the walk in stage i % kStages, one commit group per tile (empty past the
// walk). load_kv(stage) issues the copies of the walk's next tile into `stage` (nothing once
// the walk is done): the kernels keep a load cursor kStages - 1 tiles ahead of the compute.
template <int kStages>
struct KvPipeline {
  // The prologue, after the caller's Q group: tiles 0..kStages-2, then waits until Q and tile 0
  // have landed and are visible to the CTA.
  template <typename LoadKv>
  static __device__ __forceinline__ void prime(LoadKv&& load_kv) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      load_kv(s);
      cp_async_commit();
    }
    cp_async_wait<kStages - 1>();
    __syncthreads();
  }
  // The top of iteration i: tile i has landed and is visible to all; tile i + kStages - 1
  // goes into the stage that tile i - 1 freed.
  template <typename LoadKv>
  static __device__ __forceinline__ void advance(int i, LoadKv&& load_kv) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    load_kv((i + kStages - 1) % kStages);
    cp_async_commit();
  }
};

// The K and V tiles of KV head hkv of sequence b, kRows rows each, copied into swizzled
// shared tiles (rows >= len zero-filled). Dense: strided [len, D] operands. Paged: key kv is
// row kv % page_size of page pages[kv / page_size] of a pool (stride_b is the page stride).
// A paged tile's page ids are looked up one tile ahead: prefetch(start) issues the loads of
// the page ids of the rows this thread copies, and load() of that tile uses them, so the
// page-table loads land under the current tile's math instead of stalling every copy (each
// copy waited on its page id before: H200 decoding at 0.80-0.86 of the dense layout's speed).
// A caller gives every tile to prefetch() before load(); the dense form ignores prefetch().
template <typename E, bool kPaged, int kRows, typename RowK, typename RowV, int kThreads>
struct KvTiles {
  // This thread's chunks of a kRows x Row tile, paged. Where the tile divides evenly, thread
  // tid copies chunk tid % kUsed of kPer consecutive rows kPer * (tid / kUsed) + i (a warp
  // still covers whole rows per copy): with page_size a multiple of kPer those rows share one
  // page (tiles start at multiples of kRows), one page-table load and one division per tile.
  // Otherwise the i-th chunk is idx = tid + i * kThreads, row idx / kUsed (load_rows_async's
  // order), each row with its own page.
  template <typename Row>
  struct Chunks {
    static constexpr int kTotal = kRows * Row::kUsed, kCount = (kTotal + kThreads - 1) / kThreads;
    static constexpr bool kBlocked = kThreads % Row::kUsed == 0 && kTotal % kThreads == 0;
    static constexpr int kPer = kBlocked ? kTotal / kThreads : 1;  // rows per thread, blocked
    static __device__ __forceinline__ bool exists(int tid, int i) {
      return kBlocked || kTotal % kThreads == 0 || tid + i * kThreads < kTotal;
    }
    static __device__ __forceinline__ int row(int tid, int i) {
      return kBlocked ? kPer * (tid / Row::kUsed) + i : (tid + i * kThreads) / Row::kUsed;
    }
    static __device__ __forceinline__ int col(int tid, int i) {
      return kBlocked ? tid % Row::kUsed : (tid + i * kThreads) % Row::kUsed;
    }
  };
  static constexpr bool kSharedRows = RowK::kUsed == RowV::kUsed;
  static constexpr int kPagesK = kPaged ? Chunks<RowK>::kCount : 1;
  static constexpr int kPagesV = kPaged && !kSharedRows ? Chunks<RowV>::kCount : 1;

  const E* k_base;
  const E* v_base;
  long long k_stride_n, v_stride_n;
  // Paged: page and row strides in bytes, each < 2^31 (checked on the host: fa::ragged_views),
  // so a row's address is two 32x32->64-bit multiply-adds.
  int k_page_bytes, v_page_bytes, k_row_bytes, v_row_bytes;
  const int* pages;
  int page_size;
  int page_k[kPagesK], row_k[kPagesK];  // page id and row in the page of each K chunk's row
  int page_v[kPagesV], row_v[kPagesV];

  __device__ __forceinline__ KvTiles(const FaFwdParams& p, int b, int hkv)
      : k_base(static_cast<const E*>(p.k) + (kPaged ? 0ll : b * p.k_stride_b) + hkv * p.k_stride_h),
        v_base(static_cast<const E*>(p.v) + (kPaged ? 0ll : b * p.v_stride_b) + hkv * p.v_stride_h),
        k_stride_n(p.k_stride_n),
        v_stride_n(p.v_stride_n),
        k_page_bytes(static_cast<int>(p.k_stride_b * sizeof(E))),
        v_page_bytes(static_cast<int>(p.v_stride_b * sizeof(E))),
        k_row_bytes(static_cast<int>(p.k_stride_n * sizeof(E))),
        v_row_bytes(static_cast<int>(p.v_stride_n * sizeof(E))),
        pages(kPaged ? p.page_table + b * p.page_table_stride : nullptr),
        page_size(p.page_size) {}

  // Paged: the page ids of the tile that starts at key `start` (an invalid row looks up page 0
  // of the sequence, which exists, and reads nothing).
  __device__ __forceinline__ void prefetch(int start, int len, int tid) {
    if constexpr (kPaged) {
      fetch_pages<RowK>(page_k, row_k, start, len, tid);
      if constexpr (!kSharedRows) fetch_pages<RowV>(page_v, row_v, start, len, tid);
    }
  }
  // The tile that starts at key `start` into shared tiles dst_k / dst_v.
  __device__ __forceinline__ void load(u32 dst_k, u32 dst_v, int start, int len, int tid) const {
    if constexpr (!kPaged) {
      load_tile_async<kRows, RowK, kThreads>(dst_k, k_base, k_stride_n, start, len, tid);
      load_tile_async<kRows, RowV, kThreads>(dst_v, v_base, v_stride_n, start, len, tid);
    } else {
      copy_paged<RowK>(dst_k, k_base, k_page_bytes, k_row_bytes, page_k, row_k, start, len, tid);
      if constexpr (kSharedRows)
        copy_paged<RowV>(dst_v, v_base, v_page_bytes, v_row_bytes, page_k, row_k, start, len, tid);
      else
        copy_paged<RowV>(dst_v, v_base, v_page_bytes, v_row_bytes, page_v, row_v, start, len, tid);
    }
  }

 private:
  // Whether this thread's rows of a tile lie in one page (the same for every thread and tile).
  template <typename Row>
  __device__ __forceinline__ bool one_page() const {
    return Chunks<Row>::kBlocked && page_size % Chunks<Row>::kPer == 0;
  }
  template <typename Row, int kN>
  __device__ __forceinline__ void fetch_pages(int (&page)[kN], int (&row)[kN], int start, int len,
                                              int tid) const {
    const bool one = one_page<Row>();
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if (one && i > 0) break;
      const int kv = start + Chunks<Row>::row(tid, i);
      const int r = kv < len ? kv : 0;
      const int slot = r / page_size;
      page[i] = pages[slot];
      row[i] = r - slot * page_size;
    }
  }
  template <typename Row, int kN>
  __device__ __forceinline__ void copy_paged(u32 dst, const E* base, int page_bytes, int row_bytes,
                                             const int (&page)[kN], const int (&row)[kN], int start, int len,
                                             int tid) const {
    using C = Chunks<Row>;
    const char* bytes = reinterpret_cast<const char*>(base);
    if (one_page<Row>()) {  // the first row's address; the next rows follow at row_bytes
      const char* g = bytes + (long long)page[0] * page_bytes + (long long)row[0] * row_bytes;
#pragma unroll
      for (int i = 0; i < kN; ++i) copy_chunk<Row>(dst, g + (long long)i * row_bytes, start, len, tid, i);
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i)
        if (C::exists(tid, i))
          copy_chunk<Row>(dst, bytes + (long long)page[i] * page_bytes + (long long)row[i] * row_bytes, start,
                          len, tid, i);
    }
  }
  // Chunk i of this thread, from its row's first byte.
  template <typename Row>
  __device__ __forceinline__ void copy_chunk(u32 dst, const char* row_at, int start, int len, int tid,
                                             int i) const {
    const int r = Chunks<Row>::row(tid, i);
    copy_row_chunk_async<Row>(dst, r, Chunks<Row>::col(tid, i), row_at, start + r < len);
  }
};

// ---- where a CTA and a thread are -------------------------------------------------------------
// The tile a CTA of a (tiles, batch x heads) grid takes (grid_tile(lin, ...): the lin-th of that
// list, as the persistent forward hands it out). CTAs start in about linear order
// (x fastest) and one CTA fills an SM, so the order is a list schedule: heaviest tiles first
// leaves light ones for the last wave (a causal forward's last query blocks walk every key
// block: launched last, they ran alone at the end). Heads go in groups of kGridHeadGroup, all
// tiles of a group before the next, so the CTAs running at once share a few heads' K/V in L2.
// kHeavyLast: tile nt - 1 is the heaviest (query blocks under causal-like masks), else tile 0
// (key blocks of the backward's dK/dV).
constexpr int kGridHeadGroup = 8;
struct GridTile {
  int tile, bh;
};
template <bool kHeavyLast>
__device__ __forceinline__ GridTile grid_tile(long long lin, long long nt, long long nbh) {
  const long long group = lin / (kGridHeadGroup * nt), g0 = group * kGridHeadGroup;
  const long long in_group = nbh - g0 < kGridHeadGroup ? nbh - g0 : kGridHeadGroup;
  const long long rem = lin - group * kGridHeadGroup * nt, step = rem / in_group;
  return {static_cast<int>(kHeavyLast ? nt - 1 - step : step), static_cast<int>(g0 + rem - step * in_group)};
}
template <bool kHeavyLast>
__device__ __forceinline__ GridTile grid_tile() {
  return grid_tile<kHeavyLast>((long long)blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y);
}

// A query-block CTA (grid x: query blocks of block_m rows, y: batch x query heads, taken in
// grid_tile's order): its first query row, batch, query head and the KV head that query head
// reads (GQA).
struct QueryBlockCta {
  int q0, b, h, hkv;
  __device__ __forceinline__ QueryBlockCta(int block_m, int heads_q, int heads_kv)
      : QueryBlockCta(grid_tile<true>(), block_m, heads_q, heads_kv) {}
  __device__ __forceinline__ QueryBlockCta(GridTile t, int block_m, int heads_q, int heads_kv)
      : q0(t.tile * block_m), b(t.bh / heads_q), h(t.bh % heads_q), hkv(h / (heads_q / heads_kv)) {}
};
// Runs kernel(params) for this query-block CTA of the forward kernels: on p itself in the dense
// layout; ragged / paged on p rebased on the CTA's sequence, and not at all where the block
// lies past that sequence's end (the grid covers the longest).
template <typename Cfg, typename Kernel>
__device__ __forceinline__ void on_sequence(const FaFwdParams& p, Kernel&& kernel) {
  if constexpr (Cfg::kLayout == kDenseLayout) {
    kernel(p);
  } else {
    FaFwdParams seq = p;
    const QueryBlockCta cta(Cfg::kBlockM, p.heads_q, p.heads_kv);
    rebase_sequence<typename Cfg::Element>(seq, cta.b);
    if (cta.q0 >= seq.len_q) return;
    kernel(seq);
  }
}
// A key-block CTA of the dK/dV grid (x: key blocks of block_n rows, y: batch x KV heads).
struct KeyBlockCta {
  int kv0, b, hkv;
  __device__ __forceinline__ KeyBlockCta(int block_n, int heads_kv) {
    const GridTile t = grid_tile<false>();
    kv0 = t.tile * block_n;
    b = t.bh / heads_kv;
    hkv = t.bh % heads_kv;
  }
};
// A thread's place in the mma.sync fragment layout: its warp, and within the warp the row
// group g = lane / 4 and the column pair t = lane % 4 (fragment rows g, g + 8; columns 2t, 2t + 1).
struct LaneCoords {
  int tid, lane, warp, g, t;
  __device__ __forceinline__ LaneCoords()
      : tid(threadIdx.x), lane(tid & 31), warp(tid >> 5), g(lane >> 2), t(lane & 3) {}
};

// ---- the mods hook ---------------------------------------------------------------------------
// One score at (q, kv): score_mod on x·scale (scores reach score_mod already multiplied by
// `scale`, flex semantics); with kMaskMod also mask_mod unless the block is full; a masked
// score becomes -inf. kv_c is kv clamped into range: mods never see an index past the end (the
// caller clamps q likewise, and masks keys past the end in a pass of its own: mask_tail,
// probs_t's key_tail). Every kernel applies mods through this or, on split mods, the overload
// below, whatever the orientation of its tile.
template <typename Mods, bool kMaskMod>
__device__ __forceinline__ float mod_score(float x, int q, int kv_c, bool is_full, float scale, int b, int h,
                                           const FaCaptures& cap) {
  if constexpr (Mods::kHasScoreMod) x = Mods::score_mod(x * scale, b, h, q, kv_c, cap);
  if constexpr (kMaskMod && Mods::kHasMaskMod) {
    if (!(is_full | Mods::mask_mod(b, h, q, kv_c, cap))) x = -INFINITY;
  }
  return x;
}

// The same with the mods split by codegen (FaMods::*_row, *_col): the row and column values
// come gathered (the forward's ModRows / ModCols, the dK/dV kernel's ModQueries / ModKeys),
// the element's part is all that runs here. Without kScore the score_mod is left out (the caller
// applied it already: a kv-linear one, KvLinear below).
template <typename Mods, bool kMaskMod, bool kScore = true>
__device__ __forceinline__ float mod_score(float x, int q, int kv_c, bool is_full, float scale, int b, int h,
                                           const typename Mods::ScoreRow& score_row,
                                           const typename Mods::ScoreCol& score_col,
                                           const typename Mods::MaskRow& mask_row,
                                           const typename Mods::MaskCol& mask_col, const FaCaptures& cap) {
  if constexpr (kScore && Mods::kHasScoreMod)
    x = Mods::score_mod(x * scale, b, h, q, kv_c, score_row, score_col, cap);
  if constexpr (kMaskMod && Mods::kHasMaskMod) {
    if (!(is_full | Mods::mask_mod(b, h, q, kv_c, mask_row, mask_col, cap))) x = -INFINITY;
  }
  return x;
}

// The split form of a mods struct: codegen's FaMods has it (score_row / score_col, the
// element's score_mod on them, and the mask's alike). PlainMods<Mods> is any mods struct seen
// without it: empty rows and columns, its plain score_mod / mask_mod per element. SplitMods
// gives a struct's own split form where it has one, else PlainMods (hand-written structs).
template <typename Mods>
struct PlainMods : Mods {
  struct Empty {
    __device__ __forceinline__ Empty from_lane(int) const { return {}; }
  };
  using ScoreRow = Empty;
  using ScoreCol = Empty;
  using MaskRow = Empty;
  using MaskCol = Empty;
  static __device__ __forceinline__ Empty score_row(int, int, int, const FaCaptures&) { return {}; }
  static __device__ __forceinline__ Empty score_col(int, int, const FaCaptures&) { return {}; }
  static __device__ __forceinline__ Empty mask_row(int, int, int, const FaCaptures&) { return {}; }
  static __device__ __forceinline__ Empty mask_col(int, int, const FaCaptures&) { return {}; }
  static __device__ __forceinline__ float score_mod(float score, int b, int h, int q, int kv, Empty, Empty,
                                                    const FaCaptures& cap) {
    return Mods::score_mod(score, b, h, q, kv, cap);
  }
  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv, Empty, Empty,
                                                  const FaCaptures& cap) {
    return Mods::mask_mod(b, h, q, kv, cap);
  }
  // (Instantiated only where Mods is kv-linear: KvLinear; or its mask an interval of keys: KvRange.)
  static __device__ __forceinline__ float score_kv_rate(int b, int h, int q, Empty, const FaCaptures& cap) {
    return Mods::score_kv_rate(b, h, q, cap);
  }
  static __device__ __forceinline__ void mask_kv_range(int b, int h, int q, Empty, const FaCaptures& cap,
                                                       int& lo, int& hi) {
    Mods::mask_kv_range(b, h, q, cap, lo, hi);
  }
};
template <typename...>
struct MakeVoid {
  using type = void;
};
template <typename Mods, typename = void>
struct SplitMods : PlainMods<Mods> {};
template <typename Mods>
struct SplitMods<Mods, typename MakeVoid<typename Mods::ScoreRow>::type> : Mods {};

// Whether a mods struct's score_mod is `score + rate(b, h, q) · (kv − q)` (codegen's
// kScoreKvLinear, with score_kv_rate: ALiBi, a relative slope by head). A kernel walking a row's
// keys then adds the bias as fmaf(rate, 8j, base) from a per-tile base (kv_linear_terms) instead
// of converting each key and subtracting: one FMA an element.
template <typename Mods, typename = void>
struct KvLinear {
  static constexpr bool value = false;
};
template <typename Mods>
struct KvLinear<Mods, typename MakeVoid<decltype(Mods::kScoreKvLinear)>::type> {
  static constexpr bool value = Mods::kHasScoreMod && Mods::kScoreKvLinear;
};

// Whether a mods struct's mask_mod keeps one interval of keys per row, lo <= kv <= hi (codegen's
// kMaskKvRange, with mask_kv_range: causal, sliding windows, prefix-LM, padding). A kernel walking
// a row's keys then masks a partial tile by comparing each column's offset in the tile with the
// row's two bounds (kv_range_mask) instead of running mask_mod per element.
template <typename Mods, typename = void>
struct KvRange {
  static constexpr bool value = false;
};
template <typename Mods>
struct KvRange<Mods, typename MakeVoid<decltype(Mods::kMaskKvRange)>::type> {
  static constexpr bool value = Mods::kHasMaskMod && Mods::kMaskKvRange;
};

// The mods as the mma.sync forward and the decoder take them: split (their loads gathered) up to
// head dim 64, plain (per element) above. Up to 64 neither kernel spills for them; above, the
// gathered row and column values cost registers these kernels do not have: the mma.sync forward
// at d128 (4 warps of 32 rows) spills 48 -> 72 B for a document mask on sm_80, 96 -> 192 B paged,
// and the decoder at d128 ran a token 1-4 % slower (H200; bench/RESULTS.md, forty-second session).
template <typename Mods, int kHeadDimQK, int kHeadDimV>
using MmaMods =
    typename PickType<(kHeadDimQK <= 64 && kHeadDimV <= 64), SplitMods<Mods>, PlainMods<Mods>>::Type;

// The query head of a fragment's rows: one head for the whole tile (an int), or one per row
// half (int[2]: the decoding kernel packs the heads of a GQA group into one tile); and the
// heads of m-tile mi of a kMT-tile fragment set.
__device__ __forceinline__ int head_of(int h, int) { return h; }
__device__ __forceinline__ int head_of(const int (&h)[2], int hh) { return h[hh]; }
template <typename H>
__device__ __forceinline__ const H& heads_of(const H& h, int) {
  return h;
}
template <int kMT>
__device__ __forceinline__ const int (&heads_of(const int (&h)[kMT][2], int mi))[2] {
  return h[mi];
}

// The mods' row values (codegen's FaMods::score_row / mask_row: loads by b, h, q alone and what
// follows from them, a document id by q; arithmetic without a load stays per element, but for a
// kv-linear score_mod's rate, ALiBi's slope: kv_rate) for a thread's two fragment rows, q_idx
// already clamped into range: gathered once per query block instead of once per tile. h: one
// head, or one per row (head_of).
template <typename Mods>
struct ModRows {
  typename Mods::ScoreRow score[2];
  typename Mods::MaskRow mask[2];
  float kv_rate[2];        // a kv-linear score_mod's rate (KvLinear)
  int kv_lo[2], kv_hi[2];  // an interval mask's keys, lo <= kv <= hi (KvRange)
  template <typename H>
  __device__ __forceinline__ void gather(const int (&q_idx)[2], int b, const H& h, const FaCaptures& cap) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if constexpr (Mods::kHasScoreMod) score[hh] = Mods::score_row(b, head_of(h, hh), q_idx[hh], cap);
      if constexpr (Mods::kHasMaskMod) mask[hh] = Mods::mask_row(b, head_of(h, hh), q_idx[hh], cap);
      if constexpr (KvLinear<Mods>::value)
        kv_rate[hh] = Mods::score_kv_rate(b, head_of(h, hh), q_idx[hh], score[hh], cap);
      if constexpr (KvRange<Mods>::value)
        Mods::mask_kv_range(b, head_of(h, hh), q_idx[hh], mask[hh], cap, kv_lo[hh], kv_hi[hh]);
    }
  }
};

// Per-column values of a tile of 8·kNT columns from `start` spread over a warp: lane L holds
// columns start + L + 32k (kSlots values, one coalesced load each where a thread's own columns
// would take kNT·2 registers and loads). A fragment's column 8j + 2t + c (t = lane % 4) is
// then lane 8(j % 4) + 2t + c's slot j / 4: at(j, c) shuffles it over, the whole warp at once
// (T::from_lane). Columns past `len` take the last one's value. kSlots covers 32·kSlots
// columns: where kNT is not a multiple of 4 (112 keys) the last slot's upper lanes read
// columns past the tile (clamped into range, never used).
template <typename T, int kNT>
struct LaneSpread {
  static constexpr int kSlots = (kNT + 3) / 4;
  T v[kSlots];
  template <typename F>
  __device__ __forceinline__ void gather(int start, int len, F&& value_at) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < kSlots; ++k) v[k] = value_at(min(start + lane + 32 * k, len - 1));
  }
  __device__ __forceinline__ T at(int j, int c, int lane_t) const {
    return v[j / 4].from_lane(8 * (j % 4) + 2 * lane_t + c);
  }
};

// One position's mod values: score_mod's part and mask_mod's (a row's, or a column's).
template <typename S, typename M>
struct ModValues {
  S score;
  M mask;
};

// The mods' values of a tile's 8·kNT positions (its columns, or a transposed tile's queries),
// spread over the warp (LaneSpread); at() shuffles position 8j + 2·lane_t + c's in (mask_mod's
// only with kMask).
template <typename Mods, typename S, typename M, int kNT>
struct ModSpread {
  LaneSpread<S, kNT> score;
  LaneSpread<M, kNT> mask;
  template <bool kMask = true>
  __device__ __forceinline__ ModValues<S, M> at(int j, int c, int lane_t) const {
    ModValues<S, M> v{};  // (a part the mods lack stays empty)
    if constexpr (Mods::kHasScoreMod) v.score = score.at(j, c, lane_t);
    if constexpr (kMask && Mods::kHasMaskMod) v.mask = mask.at(j, c, lane_t);
    return v;
  }
};

// The mods' column values (codegen's FaMods::score_col / mask_col: loads of captured buffers
// by kv alone, a document id by kv) of a tile of 8·kNT keys, gathered while S is still on the
// tensor cores so the loads' latency hides behind the GEMM; mask_mod's only on a partial tile
// (`partial`, warp-uniform).
template <typename Mods, int kNT>
struct ModCols : ModSpread<Mods, typename Mods::ScoreCol, typename Mods::MaskCol, kNT> {
  __device__ __forceinline__ void gather(int start, int len_kv, bool partial, int b, const FaCaptures& cap) {
    if constexpr (Mods::kHasScoreMod)
      this->score.gather(start, len_kv, [&](int kv) { return Mods::score_col(b, kv, cap); });
    if (Mods::kHasMaskMod && partial)
      this->mask.gather(start, len_kv, [&](int kv) { return Mods::mask_col(b, kv, cap); });
  }
};

// Column pair j of a tile (columns kv0 + 8j and kv0 + 8j + 1 of a fragment) from the gathered
// ModCols: shuffled over from their lanes once, for every fragment (m-tile) that needs them.
template <typename Mods, bool kMaskMod>
struct ColumnPair {
  ModValues<typename Mods::ScoreCol, typename Mods::MaskCol> col[2];
  template <int kNT>
  __device__ __forceinline__ ColumnPair(const ModCols<Mods, kNT>& cols, int j, int lane_t) {
#pragma unroll
    for (int c = 0; c < 2; ++c) col[c] = cols.template at<kMaskMod>(j, c, lane_t);
  }
};

// The split hook on the four elements [i] of a fragment's column pair (rows q_idx[i/2] of head
// head_of(h, i/2), columns kv + i%2), its row values gathered (ModRows) and its columns'
// shuffled in.
template <typename Mods, bool kMaskMod, bool kScore, typename H>
__device__ __forceinline__ void mod_column_pair(float (&s)[4], const int (&q_idx)[2], int kv, int len_kv,
                                                float scale, int b, const H& h, const ModRows<Mods>& rows,
                                                const ColumnPair<Mods, kMaskMod>& col,
                                                const FaCaptures& cap) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int kv_c = min(kv + (i & 1), len_kv - 1);
    s[i] = mod_score<Mods, kMaskMod, kScore>(s[i], q_idx[i >> 1], kv_c, false, scale, b, head_of(h, i >> 1),
                                             rows.score[i >> 1], col.col[i & 1].score, rows.mask[i >> 1],
                                             col.col[i & 1].mask, cap);
  }
}

// The hook on one S fragment (rows = queries): element [j][i] is (row q_idx[i/2] of head
// head_of(h, i/2), column kv0 + 8j + i%2), kv0 = tile start + 2t. score_mod on every element
// (unless kScore is false: applied already); with kMaskMod (a partial block) mask_mod too, their
// row and column values gathered (ModRows, ModCols; empty for PlainMods, whose calls take the
// plain mods). Keys past len_kv reach the mods clamped to the last one; mask_tail() masks them
// afterwards.
template <typename Mods, bool kMaskMod, bool kScore, int kNT, typename H>
__device__ __forceinline__ void mods_each(float (&s)[kNT][4], const int (&q_idx)[2], int kv0, int len_kv,
                                          float scale, int b, const H& h, const ModRows<Mods>& rows,
                                          const ModCols<Mods, kNT>& cols, int lane_t, const FaCaptures& cap) {
  if constexpr ((kScore && Mods::kHasScoreMod) || kMaskMod) {
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const ColumnPair<Mods, kMaskMod> col(cols, j, lane_t);
      mod_column_pair<Mods, kMaskMod, kScore>(s[j], q_idx, kv0 + j * 8, len_kv, scale, b, h, rows, col, cap);
    }
  }
}

// The same on kMT fragments (m-tiles). With column values a column pair is shuffled in once for
// all of them; without (no loads by key, or PlainMods) m-tile by m-tile, as the plain calls go.
template <typename Mods, bool kMaskMod, bool kScore, int kMT, int kNT, typename H>
__device__ __forceinline__ void mods_each(float (&s)[kMT][kNT][4], const int (&q_idx)[kMT][2], int kv0,
                                          int len_kv, float scale, int b, const H& h,
                                          const ModRows<Mods> (&rows)[kMT], const ModCols<Mods, kNT>& cols,
                                          int lane_t, const FaCaptures& cap) {
  constexpr bool kColumns =
      (kScore && !__is_empty(typename Mods::ScoreCol)) || (kMaskMod && !__is_empty(typename Mods::MaskCol));
  if constexpr (!(kScore && Mods::kHasScoreMod) && !kMaskMod) {
    return;
  } else if constexpr (kColumns) {
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const ColumnPair<Mods, kMaskMod> col(cols, j, lane_t);
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi)
        mod_column_pair<Mods, kMaskMod, kScore>(s[mi][j], q_idx[mi], kv0 + j * 8, len_kv, scale, b,
                                                heads_of(h, mi), rows[mi], col, cap);
    }
  } else {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
      mods_each<Mods, kMaskMod, kScore>(s[mi], q_idx[mi], kv0, len_kv, scale, b, heads_of(h, mi), rows[mi],
                                        cols, lane_t, cap);
  }
}

// Whether the FMA form may carry rate a over a tile of 8·kCols columns (kv_linear_terms,
// bwd::KeyLinear). Its base a·(kv0 + c − q) is rounded before the FMA adds a·8j, so every bias is
// off by up to ulp(a·8·kCols)/2 beside the plain form's own rounding, also on the diagonal, where
// the plain bias is an exact 0: |a|·8·kCols ≤ 2^11 keeps that under 2^-13 of a logit (rates up to
// 16 at 128 columns; ALiBi's are at most 1). Larger rates, inf and NaN take the plain form.
template <int kCols>
__device__ __forceinline__ bool kv_linear_rate_ok(float a) {
  return fabsf(a) * static_cast<float>(8 * kCols) <= 2048.f;
}

// A kv-linear score_mod (KvLinear) on a fragment's two rows: rate a[hh] (gathered with the rows)
// and, for the tile's columns kv0 + c (c = 0, 1; kv0 = start + 2t), base r[hh][c] = a·(kv0 + c − q).
// Column kv0 + 8j + c's bias a·(kv − q) is then fmaf(a, 8j, r). False where a row's rate is not
// kv_linear_rate_ok (the plain form then runs: ±inf and NaN as the reference gives them).
template <int kNT, typename Mods>
__device__ __forceinline__ bool kv_linear_terms(float (&a)[2], float (&r)[2][2], const int (&q_idx)[2],
                                                int kv0, const ModRows<Mods>& rows) {
  bool ok = true;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    a[hh] = rows.kv_rate[hh];
    ok &= kv_linear_rate_ok<kNT>(a[hh]);
#pragma unroll
    for (int c = 0; c < 2; ++c) r[hh][c] = a[hh] * static_cast<float>(kv0 + c - q_idx[hh]);
  }
  return ok;
}

// score_mod as score + a·(kv − q) on a fragment from its kv_linear_terms: two FMAs an element.
template <int kNT>
__device__ __forceinline__ void kv_linear_scores(float (&s)[kNT][4], const float (&a)[2],
                                                 const float (&r)[2][2], float scale) {
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[j][i] = fmaf(s[j][i], scale, fmaf(a[i >> 1], static_cast<float>(8 * j), r[i >> 1][i & 1]));
}

// A mask_mod that keeps keys lo <= kv <= hi per row (KvRange) on a partial tile: for a fragment's
// row hh and column parity c the bounds as offsets 8j in the tile, lo - (kv0 + c) and
// hi - (kv0 + c) (no wrap: both in [-1, 2^31 - 1]); column kv0 + 8j + c is masked where 8j falls
// below the one or above the other. Each side's pass (one compare and one select an element,
// where mask_mod costs four or five) runs only where that side masks a column of the tile for
// some row of the warp (its bound inside the tile, or past it: a row with nothing kept here; one
// vote each): a sliding window's partial tiles and a causal diagonal need one side each. The
// bounds come gathered with the rows (ModRows::kv_lo, kv_hi).
struct KvRangeBounds {
  int lo[2][2], hi[2][2];
  template <int kNT, typename Mods>
  __device__ __forceinline__ void make(int kv0, const ModRows<Mods>& rows, bool& need_lo, bool& need_hi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        lo[hh][c] = rows.kv_lo[hh] - (kv0 + c);
        hi[hh][c] = rows.kv_hi[hh] - (kv0 + c);
        need_lo |= lo[hh][c] > 0;
        need_hi |= hi[hh][c] < 8 * (kNT - 1);
      }
    }
  }
  template <int kNT>
  __device__ __forceinline__ void mask_below(float (&s)[kNT][4]) const {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (8 * j < lo[i >> 1][i & 1]) s[j][i] = -INFINITY;
  }
  template <int kNT>
  __device__ __forceinline__ void mask_above(float (&s)[kNT][4]) const {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (8 * j > hi[i >> 1][i & 1]) s[j][i] = -INFINITY;
  }
};
template <typename Mods, int kMT, int kNT>
__device__ __forceinline__ void kv_range_mask(float (&s)[kMT][kNT][4], int kv0,
                                              const ModRows<Mods> (&rows)[kMT]) {
  KvRangeBounds bounds[kMT];
  bool need_lo = false, need_hi = false;
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi) bounds[mi].template make<kNT>(kv0, rows[mi], need_lo, need_hi);
  if (__any_sync(0xffffffffu, need_lo)) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) bounds[mi].mask_below(s[mi]);
  }
  if (__any_sync(0xffffffffu, need_hi)) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) bounds[mi].mask_above(s[mi]);
  }
}
template <typename Mods, int kNT>
__device__ __forceinline__ void kv_range_mask(float (&s)[kNT][4], int kv0, const ModRows<Mods>& rows) {
  KvRangeBounds bounds;
  bool need_lo = false, need_hi = false;
  bounds.make<kNT>(kv0, rows, need_lo, need_hi);
  if (__any_sync(0xffffffffu, need_lo)) bounds.mask_below(s);
  if (__any_sync(0xffffffffu, need_hi)) bounds.mask_above(s);
}

// The hook on one S fragment, or on kMT of them: a kv-linear score_mod by its FMAs where every
// row of the warp allows (one vote a tile), an interval mask by its bounds (kv_range_mask), the
// rest per element (mods_each).
template <typename Mods, bool kMaskMod, int kNT, typename H>
__device__ __forceinline__ void apply_mods(float (&s)[kNT][4], const int (&q_idx)[2], int kv0, int len_kv,
                                           float scale, int b, const H& h, const ModRows<Mods>& rows,
                                           const ModCols<Mods, kNT>& cols, int lane_t,
                                           const FaCaptures& cap) {
  constexpr bool kRange = kMaskMod && KvRange<Mods>::value, kMaskEach = kMaskMod && !kRange;
  bool scored = false;
  if constexpr (KvLinear<Mods>::value) {
    float a[2], r[2][2];
    if (__all_sync(0xffffffffu, kv_linear_terms<kNT>(a, r, q_idx, kv0, rows))) {
      kv_linear_scores(s, a, r, scale);
      mods_each<Mods, kMaskEach, false>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
      scored = true;
    }
  }
  if (!scored) mods_each<Mods, kMaskEach, true>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  if constexpr (kRange) kv_range_mask(s, kv0, rows);
}
template <typename Mods, bool kMaskMod, int kMT, int kNT, typename H>
__device__ __forceinline__ void apply_mods(float (&s)[kMT][kNT][4], const int (&q_idx)[kMT][2], int kv0,
                                           int len_kv, float scale, int b, const H& h,
                                           const ModRows<Mods> (&rows)[kMT], const ModCols<Mods, kNT>& cols,
                                           int lane_t, const FaCaptures& cap) {
  constexpr bool kRange = kMaskMod && KvRange<Mods>::value, kMaskEach = kMaskMod && !kRange;
  bool scored = false;
  if constexpr (KvLinear<Mods>::value) {
    float a[kMT][2], r[kMT][2][2];
    bool ok = true;
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) ok &= kv_linear_terms<kNT>(a[mi], r[mi], q_idx[mi], kv0, rows[mi]);
    if (__all_sync(0xffffffffu, ok)) {
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) kv_linear_scores(s[mi], a[mi], r[mi], scale);
      mods_each<Mods, kMaskEach, false>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
      scored = true;
    }
  }
  if (!scored) mods_each<Mods, kMaskEach, true>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  if constexpr (kRange) kv_range_mask(s, kv0, rows);
}

// The columns of one S fragment at or past len_kv become -inf (a tile that crosses the end).
template <int kNT>
__device__ __forceinline__ void mask_tail(float (&s)[kNT][4], int kv0, int len_kv) {
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (kv0 + j * 8 + (i & 1) >= len_kv) s[j][i] = -INFINITY;
}

// The hook on the kMT fragments (m-tiles) of one S tile of kBlockN keys from `start`:
// mask_mod only on a partial block (with the score_mod: the two paths are chosen once per
// tile), the kv bound only on the tile that crosses len_kv, as a separate pass — a partial
// tile inside the sequence (a document mask's, most of its tiles) pays for mask_mod alone.
// lane_t = lane % 4; h: one head, or int[kMT][2] per row (heads_of). The mods' row and column
// values come gathered (ModRows per m-tile, ModCols for this tile).
template <typename Mods, int kBlockN, int kMT, int kNT, typename H>
__device__ __forceinline__ void score_tile(float (&s)[kMT][kNT][4], const int (&q_idx)[kMT][2], int start,
                                           int lane_t, int len_kv, bool is_full, float scale, int b,
                                           const H& h, const ModRows<Mods> (&rows)[kMT],
                                           const ModCols<Mods, kNT>& cols, const FaCaptures& cap) {
  const int kv0 = start + 2 * lane_t;
  if (Mods::kHasMaskMod && !is_full)
    apply_mods<Mods, true>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  else
    apply_mods<Mods, false>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  if (start + kBlockN > len_kv) {
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) mask_tail(s[mi], kv0, len_kv);
  }
}
// One fragment (a warp's share of a wgmma accumulator).
template <typename Mods, int kBlockN, int kNT>
__device__ __forceinline__ void score_tile(float (&s)[kNT][4], const int (&q_idx)[2], int start, int lane_t,
                                           int len_kv, bool is_full, float scale, int b, int h,
                                           const ModRows<Mods>& rows, const ModCols<Mods, kNT>& cols,
                                           const FaCaptures& cap) {
  const int kv0 = start + 2 * lane_t;
  if (Mods::kHasMaskMod && !is_full)
    apply_mods<Mods, true>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  else
    apply_mods<Mods, false>(s, q_idx, kv0, len_kv, scale, b, h, rows, cols, lane_t, cap);
  if (start + kBlockN > len_kv) mask_tail(s, kv0, len_kv);
}

// ---- online softmax --------------------------------------------------------------------------
// What takes a score x to natural units: kernels without a score_mod keep the raw q·k (x·scale),
// with one the modded score is already there (x·1).
__device__ __forceinline__ float natural_scale(bool has_score_mod, float scale) {
  return has_score_mod ? 1.f : scale;
}
// Base 2 throughout: a score x contributes exp2(x * sl2), sl2 = natural_scale·log2(e) (one FFMA
// per element).
__device__ __forceinline__ float softmax_log2_scale(bool has_score_mod, float scale) {
  return natural_scale(has_score_mod, scale) * kLog2e;
}

// Running max m (of x, not of x·sl2) and per-thread partial sum l of a thread's two rows.
//
// Each row's probabilities are relative to a reference R(m) in log2 units: p = exp2(x·sl2 - R),
// l = Σ p, LSE·log2(e) = R + log2(l). While |m·sl2| < 2^24, R is m·sl2 rounded to f32 and
// p = exp2(fma(x, sl2, -R)) is one FFMA (the exact product minus R: the largest p is within
// 2^±0.5 of 1, and LSE stays exact). From 2^24 on, R's rounding (half an ulp, 1 and more)
// would push the largest p to 2^±ulp/2 — past f32's (and f16's) range from about 2^31 — so such
// a row subtracts first: R is the exact m·sl2 and p = exp2((x - m)·sl2) <= 1. resid(m) =
// m·sl2 - R(m) (exact, from an FMA) lets the rescale and the LSE use either form.
struct SoftmaxRows {
  float m[2], l[2];
  float r[2];    // R(m) = m·sl2 rounded (0 while m = -inf): the reference of the last step's p
  float lim[2];  // the largest row max R stays for (-inf: no reference yet, or R near 2^24)
  float top[2];  // the running max of every score seen (m may lag it): read only with kRowMax

  static constexpr float kExactFrom = 16777216.f;  // 2^24: |m·sl2| from which p is formed exactly
  static constexpr float kRescaleFrom = 8.f;       // log2 of the largest p before R moves
  static __device__ __forceinline__ float resid(float mx, float sl2) {
    const float r = __fmul_rn(mx, sl2);
    return fabsf(r) < kExactFrom ? fmaf(mx, sl2, -r) : 0.f;
  }

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
      m[hh] = -INFINITY, l[hh] = 0.f, r[hh] = 0.f, lim[hh] = -INFINITY, top[hh] = -INFINITY;
  }

  // The largest of this thread's scores in row hh, as a tree: log2 of the row's length in
  // dependent FMNMX instead of one long chain the softmax waits on every tile.
  template <int kNT>
  static __device__ __forceinline__ float row_max(const float (&s)[kNT][4], int hh) {
    float v[kNT];
#pragma unroll
    for (int j = 0; j < kNT; ++j) v[j] = fmaxf(s[j][2 * hh], s[j][2 * hh + 1]);
#pragma unroll
    for (int w = 1; w < kNT; w *= 2)
#pragma unroll
      for (int j = 0; j + w < kNT; j += 2 * w) v[j] = fmaxf(v[j], v[j + w]);
    return v[0];
  }

  // Folds an S fragment in: S becomes P = exp2(S·sl2 - R) in place and l grows. Returns whether
  // the reference moved (warp-uniform): then l was rescaled and alpha[hh] = exp2(R_old - R_new)
  // is what O's rows must be multiplied by; else alpha is untouched and O stays as it is.
  // A row with nothing unmasked yet keeps m = -inf, R = 0 (masked scores give p = 0, no NaN).
  //
  // The reference stays where it is while every row of the warp has one (m > -inf) and the
  // tile's max lies at most kRescaleFrom above it (FlashAttention-4's conditional rescale):
  // p <= 2^kRescaleFrom, l and O (fp32) carry the factor, and finish()/lse() divide it out
  // exactly as they would R's. m stays the max R was formed from (m and R agree, as lse()
  // and a split-KV part's (m, log2_sum) need), not the running max.
  //
  // The test is one compare a row, mx <= lim, lim = m + kRescaleFrom/sl2 set when R moved
  // (there the product rounds: p up to about 2^8.5); with |R| at 2^23 or more, or no reference
  // yet, lim is -inf and every tile with a finite max moves R (a row still all -inf keeps its
  // R = 0: its p are 0 either way).
  //
  // Both rows' maxima first (their shuffles overlap), then a warp vote: while every row of
  // the warp is below 2^24 now and before — always, but for scores ~1e7/scale — alpha is
  // exp2(R_old - R_new) from the stored references (min 0: an empty row's R = 0 may exceed the
  // new one; its O and l are 0) and p one FFMA per score, straight-line for both rows. Else
  // huge_rows() makes the huge rows' scores x - m and their reference 0 first, so the same
  // FFMA forms the exact p = exp2((x - m)·sl2); that path holds no exponential of its own, so
  // the compiler keeps it a branch around a few subtractions instead of predicating both.
  template <int kNT>
  __device__ __forceinline__ bool step(float (&s)[kNT][4], float (&alpha)[2], float sl2) {
    float mx[2], rn[2], sub[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) mx[hh] = fmaxf(m[hh], row_max(s, hh));
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) mx[hh] = quad_max(mx[hh]);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) top[hh] = fmaxf(top[hh], mx[hh]);
    const bool rescale = !__all_sync(0xffffffffu, mx[0] <= lim[0] && mx[1] <= lim[1]);
    if (!rescale) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) sub[hh] = r[hh];
    } else {
      bool small = true;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        rn[hh] = mx[hh] == -INFINITY ? 0.f : __fmul_rn(mx[hh], sl2);
        small = small && fabsf(rn[hh]) < kExactFrom && fabsf(r[hh]) < kExactFrom;
        sub[hh] = rn[hh];
      }
      if (__all_sync(0xffffffffu, small)) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) alpha[hh] = ex2(fminf(r[hh] - rn[hh], 0.f));
      } else {
        huge_rows(s, alpha, mx, sub, sl2);
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        m[hh] = mx[hh];
        r[hh] = rn[hh];
        l[hh] *= alpha[hh];
        lim[hh] = mx[hh] > -INFINITY && fabsf(rn[hh]) < 0.5f * kExactFrom
                      ? mx[hh] + __fdividef(kRescaleFrom, sl2)
                      : -INFINITY;
      }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = ex2(fmaf(s[j][2 * hh + e], sl2, -sub[hh]));
          s[j][2 * hh + e] = pv;
          rs += pv;
        }
      l[hh] += rs;  // quad-reduced once, in finish()
    }
    return rescale;
  }

  // step()'s rare path, a warp with a row at or past 2^24 (or m = +inf: then p is 0, or NaN
  // for the +inf scores, as softmax): alpha from the residuals, exp2(R_old - R_new) exactly
  // whichever form each reference has, and a huge row's scores become x - m with reference 0.
  template <int kNT>
  __device__ __forceinline__ void huge_rows(float (&s)[kNT][4], float (&alpha)[2], const float (&mx)[2],
                                            float (&sub)[2], float sl2) const {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      alpha[hh] = mx[hh] == -INFINITY ? 1.f
                  : m[hh] == -INFINITY
                      ? 0.f
                      : ex2(fmaf(m[hh] - mx[hh], sl2, resid(mx[hh], sl2) - resid(m[hh], sl2)));
      if (!(fabsf(sub[hh]) < kExactFrom)) {
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) s[j][2 * hh + e] -= mx[hh];
        sub[hh] = 0.f;
      }
    }
  }

  // After the last step: reduces l over the quad to the full row sums and gives inv[hh] =
  // 1 / row sum (0 for a row with no unmasked score, so its output is 0; NaN for a row with a
  // NaN score, which the max skips and the sum keeps: NaN output, as softmax gives).
  __device__ __forceinline__ void finish(float (&inv)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      l[hh] = quad_sum(l[hh]);
      inv[hh] = !(l[hh] <= 0.f) ? 1.f / l[hh] : 0.f;
    }
  }
  // After finish(): log2 of the row sum relative to m·sl2, log2(l) - resid(m), so that the
  // row's LSE·log2 e is m·sl2 + log2_sum (-inf for an empty row, NaN for a NaN row). What a
  // split-KV part hands its combine, with m.
  __device__ __forceinline__ float log2_sum(int hh, float sl2) const {
    return l[hh] <= 0.f ? -INFINITY : lg2(l[hh]) - resid(m[hh], sl2);
  }
  // After finish(): the row's log-sum-exp of the scores in natural log, (R + log2(l))·ln 2
  // (-inf for a row with no unmasked score, NaN for a row with a NaN score).
  __device__ __forceinline__ float lse(int hh, float sl2) const {
    return l[hh] <= 0.f ? -INFINITY : natural_lse(m[hh], log2_sum(hh, sl2), sl2);
  }
  // After finish(): the row's largest score in natural units (top·nat, nat = natural_scale:
  // exact, as the product by a positive scale keeps the order and rounds monotonically), -inf
  // for a row with no unmasked score; NaN for a row with a NaN score (its l is NaN, as the
  // max skips it) unless a score is +inf (l is NaN then too: the max is +inf).
  __device__ __forceinline__ float max_score(int hh, float nat) const {
    return natural_max(top[hh], l[hh] != l[hh], nat);
  }
  // top·nat, the natural largest score of a row whose scores peak at top (score units), or NaN
  // where the row saw a NaN score (nan_row) and none +inf: what a split-KV combine writes too.
  static __device__ __forceinline__ float natural_max(float top, bool nan_row, float nat) {
    return !nan_row || top == INFINITY ? top * nat : __int_as_float(0x7fc00000);
  }
  // (m·sl2 + ls)·ln 2, the natural LSE of a row max m and a log2 sum ls relative to m·sl2; a
  // huge row's is formed in natural units, m·(sl2·ln 2) + ls·ln 2, as m·sl2 may pass f32's range.
  static __device__ __forceinline__ float natural_lse(float m, float ls, float sl2) {
    if (fabsf(__fmul_rn(m, sl2)) < kExactFrom) return fmaf(m, sl2, ls) * kLn2;
    return fmaf(m, sl2 * kLn2, ls * kLn2);
  }
};

// Multiplies row half hh of a fragment by f[hh] (O *= alpha after a softmax step).
template <int kNT>
__device__ __forceinline__ void scale_rows(float (&o)[kNT][4], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    o[j][0] *= f[0];
    o[j][1] *= f[0];
    o[j][2] *= f[1];
    o[j][3] *= f[1];
  }
}

// ---- P packing -------------------------------------------------------------------------------
// The 16-bit A fragment (m16k16, mma.sync / register-A wgmma layout) of columns 16kk..16kk+15
// of an fp32 fragment: the A layout is two adjacent 8-column C tiles packed pairwise.
template <typename E, int kNT>
__device__ __forceinline__ void pack_a(u32 (&a)[4], const float (&p)[kNT][4], int kk) {
  a[0] = pack2<E>(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack2<E>(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack2<E>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack2<E>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}
// Every k-step at once.
template <typename E, int kNT>
__device__ __forceinline__ void pack_a(u32 (&a)[kNT / 2][4], const float (&p)[kNT][4]) {
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) pack_a<E>(a[kk], p, kk);
}

// ---- epilogue --------------------------------------------------------------------------------
// A shared staging layout is a type with `static u32 offset(int row, int chunk)` (bytes of
// 16-byte chunk `chunk` of row `row` from the tile base): SwizzledRows<kChunks> (prelude.cuh)
// or sm90::Sw128Blocks<kRows> (wgmma_sm90.cuh).

// O·inv of one fragment (columns = head dim) as 16-bit values into rows row0 (hh = 0) and
// row0 + 8 (hh = 1) of a staging tile; 4-byte stores, conflict-free in swizzled layouts.
template <typename E, typename Layout, int kDT>
__device__ __forceinline__ void stage_rows(u32 tile, const float (&o)[kDT][4], const float (&inv)[2],
                                           int row0, int lane_t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int dj = 0; dj < kDT; ++dj)
      st_shared_b32(tile + Layout::offset(row0 + 8 * hh, dj) + lane_t * 4,
                    pack2<E>(o[dj][2 * hh] * inv[hh], o[dj][2 * hh + 1] * inv[hh]));
}

// Packed 16-bit A fragments (pack_a: kK k-steps of 16 columns) into rows row0 and row0 + 8 of
// a staging tile, columns 0..16kK-1 (the backward's dSᵀ for dQ = dS·K).
template <typename Layout, int kK>
__device__ __forceinline__ void stage_packed(u32 tile, const u32 (&a)[kK][4], int row0, int lane_t) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh)
#pragma unroll
    for (int kk = 0; kk < kK; ++kk)
#pragma unroll
      for (int half = 0; half < 2; ++half)  // a[kk][2 half + hh]: row half hh, chunk 2kk + half
        st_shared_b32(tile + Layout::offset(row0 + 8 * hh, 2 * kk + half) + lane_t * 4, a[kk][2 * half + hh]);
}

// Whether row r is one of rows 0..len-1: one unsigned compare, so rows before 0 (the persistent
// forward's first block with a q offset, FaBlockTables::q_offset) are out as rows past len are.
__device__ __forceinline__ bool in_rows(int r, int len) {
  return static_cast<unsigned>(r) < static_cast<unsigned>(len);
}

// Rows row_begin..row_begin+kRows-1 of a staged tile, chunks 0..kChunks-1 of each (a row's
// global chunks: HeadRow::kChunks), to global rows q0 + row (row stride `stride` elements) with
// 16-byte stores by kThreads threads (`tid` the thread's index among them); rows before 0 or at
// or past `len` are not written.
template <int kRows, int kChunks, int kThreads, typename Layout, typename E>
__device__ __forceinline__ void store_rows(E* dst, long long stride, u32 tile, int row_begin, int q0, int len,
                                           int tid) {
  for_each_strided<kRows * kChunks, kThreads>(tid, [&](int idx) {
    const int r = row_begin + idx / kChunks, c = idx % kChunks;
    if (in_rows(q0 + r, len))
      st_global_v4(dst + (long long)(q0 + r) * stride + c * 8, ld_shared_v4(tile + Layout::offset(r, c)));
  });
}

// store_rows with the shared reads first, all of them, then `read()` (the tile may be
// overwritten after it: the persistent forward frees its Q region there), then the stores.
// Where a round of kThreads covers whole rows, a multiple of 8 of them, each thread keeps one
// chunk column, so its rows share one swizzle (Layout::kRowBytes): one offset, then a fixed
// step a round. Besides the index math this saves, the per-round offsets in the persistent
// forward's block loop made ptxas move its tile cursor off the uniform datapath (d128, two
// consumers: 8 % more cycles a tile).
template <int kRows, int kChunks, int kThreads, typename Layout, typename E, typename Read>
__device__ __forceinline__ void store_rows_read_first(E* dst, long long stride, u32 tile, int row_begin,
                                                      int q0, int len, int tid, Read&& read) {
  constexpr int kRounds = (kRows * kChunks + kThreads - 1) / kThreads;
  constexpr int kStep = kThreads / kChunks;  // rows a round, where rounds cover whole rows
  u32x4 v[kRounds];                          // this thread's chunks, the i-th at idx tid + i·kThreads
  if constexpr (kThreads % kChunks == 0 && kStep % 8 == 0 && kRows % kStep == 0) {
    const int c = tid % kChunks, row = row_begin + tid / kChunks;
    const u32 at = tile + Layout::offset(row, c);
#pragma unroll
    for (int i = 0; i < kRounds; ++i) v[i] = ld_shared_v4(at + i * kStep * Layout::kRowBytes);
    read();
    E* const d = dst + (long long)(q0 + row) * stride + c * 8;
#pragma unroll
    for (int i = 0; i < kRounds; ++i)
      if (in_rows(q0 + row + i * kStep, len)) st_global_v4(d + i * kStep * stride, v[i]);
  } else {
    for_each_strided<kRows * kChunks, kThreads>(tid, [&](int idx) {
      v[(idx - tid) / kThreads] =
          ld_shared_v4(tile + Layout::offset(row_begin + idx / kChunks, idx % kChunks));
    });
    read();
    for_each_strided<kRows * kChunks, kThreads>(tid, [&](int idx) {
      const int r = row_begin + idx / kChunks, c = idx % kChunks;
      if (in_rows(q0 + r, len))
        st_global_v4(dst + (long long)(q0 + r) * stride + c * 8, v[(idx - tid) / kThreads]);
    });
  }
}

// The LSE of rows q0 + row0 and q0 + row0 + 8 of (b, h) after rows.finish(), and with kRowMax
// their largest scores, written by lane t == 0 of each quad when the caller asked for them
// (p.lse, p.max_scores not null) and the row exists (in_rows).
template <typename Mods>
__device__ __forceinline__ void store_row_stats(const FaFwdParams& p, int b, int h, int q0, int row0,
                                                int lane_t, const SoftmaxRows& rows, float sl2) {
  if (lane_t != 0) return;
  if (p.lse != nullptr) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + row0 + 8 * hh;
      if (in_rows(q, p.len_q)) p.lse[b * p.lse_stride_b + h * p.lse_stride_h + q] = rows.lse(hh, sl2);
    }
  }
  if constexpr (kRowMax) {
    if (p.max_scores == nullptr) return;
    const float nat = natural_scale(Mods::kHasScoreMod, p.scale);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int q = q0 + row0 + 8 * hh;
      if (in_rows(q, p.len_q))
        p.max_scores[b * p.max_stride_b + h * p.max_stride_h + q] = rows.max_score(hh, nat);
    }
  }
}

}  // namespace fa

#endif  // FAJIT_ATTENTION_TILE_CUH
