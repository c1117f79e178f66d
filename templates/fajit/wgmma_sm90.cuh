// fajit Hopper (sm_90a) primitives: wgmma.mma_async with shared-memory matrix descriptors,
// mbarriers (with cp.async completion), proxy fences, named barriers and setmaxnreg.
// Inline PTX only (NVRTC, no toolkit header); needs --gpu-architecture=sm_90a.
//
// ---- 128-byte swizzled tiles (what the descriptors below describe) -----------------------
// A tile of R rows x C 16-bit columns (C a multiple of 64) is stored as C/64 column blocks of
// R rows x 128 bytes; 16-byte chunk c (0..7) of row r of a block sits at chunk c ^ (r % 8)
// (= fa::swizzle_offset<8>). Column blocks and the tile base are 1024-byte aligned, so every
// 8-row group is one swizzle atom and the descriptor base offset is 0.
//   K-major operand (Q as A, K as B of S = Q·Kᵀ: rows = M/N, columns = K):
//     start = block base + row0 * 128 + (k0 % 64) * 2 (k0 a multiple of 16: +32 B per k-step),
//     SBO = 1024 (next 8-row group), LBO unused (1).
//   MN-major operand (V as B of O = P·V with imm-trans-b = 1: rows = K (kv), columns = N (d)):
//     start = tile base + k0 * 128 (k0 a multiple of 16: +2048 B per k-step),
//     SBO = 1024 (next 8 kv rows), LBO = R * 128 (next 64-column block).
//
// ---- wgmma register layouts (warpgroup of 4 warps; warp w of the group, lane = 4g + t) -------
//   Accumulator m64nN fp32, float d[N/8][4]: d[j][i] = D[16w + g + 8*(i/2)][8j + 2t + i%2]
//   (per warp, the mma.sync m16n8 C layout, one [4] per 8 columns).
//   A from registers m64k16, u32 a[4]: the mma.sync m16n8k16 A fragment of rows 16w..16w+15,
//   so two adjacent 8-column accumulator tiles packed pairwise are an A fragment.
#ifndef FAJIT_WGMMA_SM90_CUH
#define FAJIT_WGMMA_SM90_CUH

#include "fajit/prelude.cuh"

namespace fa {
namespace sm90 {

// ---- sizes and layouts ---------------------------------------------------------------------
constexpr int kWarpgroupThreads = 128;   // 4 warps issue one wgmma together
constexpr int kSw128RowBytes = 128;      // one row of a 64-column block of 16-bit elements
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows x 128 B: the swizzle period and alignment
constexpr int kMbarBytes = 8;            // one mbarrier

// This thread's warpgroup, broadcast from lane 0 so that ptxas knows it is warp-uniform: what
// derives from it (a consumer's shared-memory descriptors, its named barriers) then lives in
// uniform registers, without an R2UR pair before every wgmma that reads it.
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
}

// The 128B-swizzled layout above as a staging-layout type (attention_tile.cuh): byte offset of
// 16-byte chunk c of row r in a tile of kRows rows stored as 128-byte column blocks.
// Rows 8 apart keep their swizzle: offset(r + 8m, c) = offset(r, c) + 8m * kRowBytes.
template <int kRows>
struct Sw128Blocks {
  static constexpr int kRowBytes = kSw128RowBytes;
  static __device__ __forceinline__ u32 offset(int r, int c) {
    return static_cast<u32>((c / 8) * (kRows * kSw128RowBytes) + r * kSw128RowBytes +
                            (((c % 8) ^ (r % 8)) << 4));
  }
};

// ---- transposed 16-bit staging (stmatrix) ---------------------------------------------------
// stmatrix .trans: 8x8 16-bit matrices (the mma.sync C layout: lane 4g + t holds row g, columns
// 2t, 2t + 1 packed) stored transposed, lanes 8m..8m+7 giving the addresses of the stored rows
// 0..7 of matrix m (16 contiguous bytes each).
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 a0, u32 a1, u32 a2, u32 a3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a0),
               "r"(a1), "r"(a2), "r"(a3)
               : "memory");
}

// stmatrix without .trans: matrix m's rows stored as they are (lane 4g + t's register holds row
// g, columns 2t, 2t + 1), lanes 8m..8m+7 giving the row addresses.
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 a0, u32 a1, u32 a2, u32 a3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a0),
               "r"(a1), "r"(a2), "r"(a3)
               : "memory");
}

// Packed 16-bit A fragments (pack_a: kK k-steps of 16 columns) of a warp's 16 rows from row0
// (a multiple of 8) into a staging tile, columns 0..16kK-1: attention_tile.cuh's stage_packed
// with one stmatrix per k-step instead of eight 4-byte stores (the fragment's a0..a3 are the
// 8x8 matrices rows 0-7 / 8-15 of chunk 2kk, then of chunk 2kk + 1). Conflict-free in
// Sw128Blocks: a matrix's eight rows are consecutive tile rows.
template <typename Layout, int kK>
__device__ __forceinline__ void stage_packed_x4(u32 tile, const u32 (&a)[kK][4], int row0) {
  const int lane = threadIdx.x & 31;
  const int m = lane >> 3, r = row0 + 8 * (m & 1) + (lane & 7);  // this lane's address: row r
#pragma unroll
  for (int kk = 0; kk < kK; ++kk)
    stmatrix_x4(tile + Layout::offset(r, 2 * kk + (m >> 1)), a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
}

// The transpose of a warp's accumulator fragment (attention_tile.cuh's layout), times `scale`,
// as 16-bit values into a staging tile: fragment row r0 + g + 8·hh, column 8j + 2t + i%2 goes
// to tile row c0 + that column, tile column r0 + g + 8·hh (r0: the thread's first row, 16w + g).
// One stmatrix.trans per two 8-column tiles (both row halves): the wide-head backward's Pᵀ and
// dSᵀ, and dK, dV from their transposed accumulators. Conflict-free in Sw128Blocks: a matrix's
// eight stored rows are consecutive tile rows, whose 16-byte chunks the swizzle spreads.
template <typename E, typename Layout, int kNT>
__device__ __forceinline__ void stage_transposed(u32 tile, const float (&f)[kNT][4], float scale, int r0,
                                                 int c0) {
  static_assert(kNT % 2 == 0, "stage_transposed stores 8-column tiles in pairs");
  const int lane = threadIdx.x & 31;
  const int m = lane >> 3, k = lane & 7;      // this lane's address: row k of matrix m
  const int chunk = (r0 & ~7) / 8 + (m & 1);  // matrices 0, 2: rows g; 1, 3: rows g + 8
  auto pk = [&](int j, int hh) { return pack2<E>(f[j][2 * hh] * scale, f[j][2 * hh + 1] * scale); };
#pragma unroll
  for (int j = 0; j < kNT; j += 2)
    stmatrix_x4_trans(tile + Layout::offset(c0 + 8 * (j + (m >> 1)) + k, chunk), pk(j, 0), pk(j, 1),
                      pk(j + 1, 0), pk(j + 1, 1));
}

// ---- tile loads ----------------------------------------------------------------------------
// Where the rows of a [len, D] operand lie, for load_rows_sw128: at(row, col) gives a cursor on
// element col of a row; cursor.ptr() is its address (only asked of rows < len),
// cursor.advance(n) moves it n rows on; any() is an address cp.async may form for a row it
// reads nothing of.
// Strided rows (row stride `stride` elements): a running pointer, no multiply per row.
template <typename E>
struct StridedRows {
  static constexpr bool kGathered = false;
  const E* src;
  long long stride;
  struct Cursor {
    const E* g;
    long long stride;
    __device__ __forceinline__ const E* ptr() const { return g; }
    __device__ __forceinline__ void advance(int n) { g += n * stride; }
  };
  __device__ __forceinline__ Cursor at(int row, int col) const {
    return {src + (long long)row * stride + col, stride};
  }
  __device__ __forceinline__ const E* any() const { return src; }
};
// Paged rows (FaFwdParams' paged layout): key row r is row r % page_size of page
// pages[r / page_size] of a pool at `base`, page and row strides in bytes (each < 2^31, checked
// on the host). Gathered: where threads keep their rows (load_rows_sw128), each lane of a warp
// looks up one of the warp's rows per tile (offset()) and the others take it by shuffle, so a
// tile costs one page-table load per lane instead of one, in turn, per chunk. (The cursor, which
// keeps (page slot, row in page), serves only a copy that walks rows itself.)
template <typename E>
struct PagedRows {
  static constexpr bool kGathered = true;
  const char* base;
  const int* pages;
  int page_size, page_bytes, row_bytes;
  struct Cursor {
    const PagedRows* rows;
    int slot, in, col;
    __device__ __forceinline__ const E* ptr() const { return rows->at_offset(rows->offset(slot, in), col); }
    __device__ __forceinline__ void advance(int n) {
      for (in += n; in >= rows->page_size; in -= rows->page_size) ++slot;
    }
  };
  __device__ __forceinline__ Cursor at(int row, int col) const {
    const int slot = row / page_size;
    return {this, slot, row - slot * page_size, col};
  }
  __device__ __forceinline__ const E* any() const { return reinterpret_cast<const E*>(base); }
  // The byte offset in the pool of row `in` of the sequence's page `slot`, of key row r, and
  // the element `col` of the row at byte offset `off`.
  __device__ __forceinline__ long long offset(int slot, int in) const {
    return (long long)pages[slot] * page_bytes + (long long)in * row_bytes;
  }
  __device__ __forceinline__ long long offset(int r) const {
    const int slot = r / page_size;
    return offset(slot, r - slot * page_size);
  }
  __device__ __forceinline__ const E* at_offset(long long off, int col) const {
    return reinterpret_cast<const E*>(base + off) + col;
  }
};

// cp.async a tile of kRows head rows (Row = HeadRow<D>), rows row0.. of `rows` (StridedRows,
// PagedRows), into the swizzled column blocks of kRows x 128 B (Sw128Blocks): a row's
// Row::kUsed chunks, those past its Row::kChunks (D 72: the 16-column k-step's last 8) and rows
// >= len zero-filled (neither read from global memory); chunks past kUsed (the pitch padding)
// are never written: no wgmma reads them. D 64, 128 and 256 (whole column blocks whose pitch the
// threads of a row divide), and any D when the rows are gathered (PagedRows): consecutive
// threads take consecutive chunks of a row and keep their chunk, walking rows with a running
// cursor (gathered: one page lookup a row and tile, shuffled).
template <int kRows, typename Row, int kThreads, typename Rows>
__device__ __forceinline__ void load_rows_sw128(u32 dst, const Rows& rows, int row0, int len, int tid) {
  constexpr int kChunks = Row::kPitch;
  // Threads per row: enough for rows to advance by a multiple of 8 (the swizzle phase stays
  // put), at most one per chunk; each takes chunks c, c + kPerRow, ... of its rows.
  // Gathered rows of a pitch 16 threads do not divide (24 chunks: D 136-192) take 8 threads a
  // row, three chunks each, 64 columns apart.
  constexpr int kPerRow0 = kThreads / 8 < kChunks ? kThreads / 8 : kChunks;
  constexpr int kPerRow = kChunks % kPerRow0 == 0 || !Rows::kGathered ? kPerRow0 : 8;
  // A padded row (D 80: 10 of 16 chunks) leaves the threads of its pitch padding idle; only
  // gathered rows take that over the padded walk below, whose per-chunk page lookups cost more.
  constexpr bool kWhole = Row::kChunks == kChunks;
  if constexpr ((kWhole || Rows::kGathered) && kPerRow % 8 == 0 && kChunks % kPerRow == 0 &&
                kThreads % kPerRow == 0) {
    constexpr int kRowStep = kThreads / kPerRow;  // rows per pass; a thread keeps its chunks
    constexpr int kMine = kChunks / kPerRow;      // chunks per row and thread, 64 columns apart
    static_assert(kRows % kRowStep == 0, "tile chunks must divide evenly among threads");
    static_assert(kRowStep % 8 == 0, "row step must keep the swizzle phase");
    const int c = tid % kPerRow, r0 = tid / kPerRow;
    // Running cursor/address (few live registers: the producer runs on 24-40).
    auto cur = rows.at(row0 + r0, c * 8);
    u32 d = dst + Sw128Blocks<kRows>::offset(r0, c);
    int left = len - row0 - r0;  // rows of this thread still in range, counting down
    // Gathered rows: the warp holds kGroups consecutive r0 (lanes r0 % kGroups + kGroups * i
    // share a thread's rows r0 + kRowStep * i), lane l the offset of row l % kGroups +
    // kRowStep * (l / kGroups) of them (rows past len: none, never read).
    constexpr int kGroups = 32 / kPerRow;
    [[maybe_unused]] long long lane_off = 0;
    if constexpr (Rows::kGathered) {
      static_assert(kGroups * (kRows / kRowStep) <= 32, "a warp's rows must fit its lanes");
      const int lane = tid & 31, r = (tid >> 5) * kGroups + lane % kGroups + kRowStep * (lane / kGroups);
      if (lane < kGroups * (kRows / kRowStep) && row0 + r < len) lane_off = rows.offset(row0 + r);
    }
#pragma unroll(kMine > 1 ? 1 : 4)
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool valid = left > 0;
      decltype(rows.any()) g;
      if constexpr (Rows::kGathered) {
        const long long off = __shfl_sync(0xffffffffu, lane_off, r0 % kGroups + kGroups * i);
        g = valid ? rows.at_offset(off, c * 8) : rows.any();
      } else {
        g = valid ? cur.ptr() : rows.any();
      }
#pragma unroll
      for (int m = 0; m < kMine; ++m) {  // chunk c + m·kPerRow: same swizzle column, next block
        // padded rows: chunks past kUsed not written, those past kChunks zero-filled
        const int cm = c + m * kPerRow;
        if (kWhole || cm < Row::kUsed) {
          const bool has = valid && (kWhole || cm < Row::kChunks);
          cp_async_16(d + m * (kPerRow / 8) * (kRows * kSw128RowBytes), has ? g + m * kPerRow * 8 : rows.any(),
                      has);
        }
      }
      if constexpr (!Rows::kGathered) cur.advance(kRowStep);
      d += kRowStep * kSw128RowBytes;
      left -= kRowStep;
    }
  } else {  // padded rows (D 72, 80, 96, ...): each thread walks chunks tid, tid + kThreads, ...
            // of the tile's row-major chunk order with a running row, chunk and cursor: no
            // division or 64-bit multiply per chunk (the producer shares the SM's issue slots
            // with the consumers), and not prelude.cuh's load_tile_async, which unrolls fully
            // (272 B of spills at D 80 in the producer's 40 registers)
    static_assert(!Rows::kGathered, "gathered rows take the path above (a lookup per chunk here)");
    constexpr int kUsed = Row::kUsed;
    constexpr int kDr = kThreads / kUsed, kDc = kThreads % kUsed;  // rows, chunks per step
    int r = tid / kUsed, c = tid % kUsed;
    const int in_range = len - row0;  // rows in range
    auto cur = rows.at(row0 + r, 0);
#pragma unroll 2
    for (int idx = tid; idx < kRows * kUsed; idx += kThreads) {
      const bool valid = r < in_range && c < Row::kChunks;
      cp_async_16(dst + Sw128Blocks<kRows>::offset(r, c), valid ? cur.ptr() + c * 8 : rows.any(), valid);
      r += kDr;
      c += kDc;
      cur.advance(kDr);
      if (c >= kUsed) {
        c -= kUsed;
        ++r;
        cur.advance(1);
      }
    }
  }
}
// The same for a strided [len, D] operand.
template <int kRows, typename Row, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_sw128(u32 dst, const Element* src, long long stride, int row0,
                                                int len, int tid) {
  load_rows_sw128<kRows, Row, kThreads>(dst, StridedRows<Element>{src, stride}, row0, len, tid);
}

// ---- shared-memory matrix descriptors ----------------------------------------------------
__device__ __forceinline__ u64 desc_sw128(u32 smem_addr, u32 lbo_bytes, u32 sbo_bytes) {
  return (u64)((smem_addr & 0x3FFFF) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFF) << 16) |
         ((u64)((sbo_bytes >> 4) & 0x3FFF) << 32) | (1ull << 62);
}
// The descriptor of the operand `bytes` further on (start address field, in 16-byte units).
// The field is the low word's bits 0-13 and a shared address never carries out of it, so a
// 32-bit add on the low word does: one uniform add per wgmma instead of a sign extension and a
// 64-bit add.
__device__ __forceinline__ u64 desc_advance(u64 desc, int bytes) {
  const u32 lo = static_cast<u32>(desc) + static_cast<u32>(bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}
// Byte offset of k-step kk (16 columns) of a K-major operand of kRows rows: 32 B within a
// 128-byte row, then the next 64-column block.
template <int kRows>
__device__ __forceinline__ u32 kmajor_kstep_offset(int kk) {
  return static_cast<u32>((kk / 4) * kRows * kSw128RowBytes + (kk % 4) * 32);
}
// Byte offset of k-step kk (16 rows) of an MN-major operand.
__device__ __forceinline__ u32 mnmajor_kstep_offset(int kk) {
  return static_cast<u32>(kk * 16 * kSw128RowBytes);
}

// ---- pipeline stages -----------------------------------------------------------------------
// Position in a ring of kStages shared-memory stages guarded by mbarriers: the stage and the
// parity of the barrier phase it is in (flips each time the ring wraps).
template <int kStages>
struct StageRing {
  int stage = 0;
  u32 phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1u;
  }
};

// ---- wgmma ordering ------------------------------------------------------------------------
// fence: before the first wgmma that reads registers (accumulators, A) written since.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Pins a register to this point of the (volatile) instruction order: the compiler neither
// moves its reads/writes across nor reuses it before. Used on accumulators and A fragments
// around wgmma issue and wait, since the compiler does not know wgmma is asynchronous.
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void pin(u32& r) { asm volatile("" : "+r"(r)::"memory"); }
template <int A, int B>
__device__ __forceinline__ void pin(float (&r)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) pin(r[i][j]);
}
template <int A, int B, int C>
__device__ __forceinline__ void pin(float (&r)[A][B][C]) {
#pragma unroll
  for (int i = 0; i < A; ++i) pin(r[i]);
}
template <int A, int B>
__device__ __forceinline__ void pin(u32 (&r)[A][B]) {
#pragma unroll
  for (int i = 0; i < A; ++i)
#pragma unroll
    for (int j = 0; j < B; ++j) pin(r[i][j]);
}

// ---- wgmma.mma_async m64nNk16, fp32 accumulate (scale_d = 0: D = A·B, else D += A·B) -------
//   wgmma_ss<E, N>(d, desc_a, desc_b, scale_d)  A and B K-major in shared memory
//   wgmma_ss_mn<E, N>(...)                        A and B MN-major in shared memory
//   wgmma_ss_amn<E, N>(...)                       A MN-major, B K-major
//   wgmma_rs<E, N>(d, a, desc_b, scale_d)       A in registers, B MN-major (imm-trans-b = 1)
// Each (E, N) is one asm statement whose first N/2 operands are the accumulators ("+f",
// d[kJ0 + j][i] in order: columns 8·kJ0 .. 8·kJ0 + N - 1 of an accumulator of kNd n-tiles);
// FA_WGMMA_SS / FA_WGMMA_RS below spell it once, given the accumulator operand list, the
// matching "{%0, ...}" register list and the indices of the operands that follow it. N runs
// over the multiples of 16 from 32 to 128; wider accumulators (P·V at head dims up to 256) take
// two wgmmas on column ranges (wgmma_rs_cols).
template <typename E, int N>
struct Tag {};

#define FA_ACC4(j) "+f"(d[kJ0 + j][0]), "+f"(d[kJ0 + j][1]), "+f"(d[kJ0 + j][2]), "+f"(d[kJ0 + j][3])
#define FA_ACC_N32 FA_ACC4(0), FA_ACC4(1), FA_ACC4(2), FA_ACC4(3)
#define FA_ACC_N48 FA_ACC_N32, FA_ACC4(4), FA_ACC4(5)
#define FA_ACC_N64 FA_ACC_N48, FA_ACC4(6), FA_ACC4(7)
#define FA_ACC_N80 FA_ACC_N64, FA_ACC4(8), FA_ACC4(9)
#define FA_ACC_N96 FA_ACC_N80, FA_ACC4(10), FA_ACC4(11)
#define FA_ACC_N112 FA_ACC_N96, FA_ACC4(12), FA_ACC4(13)
#define FA_ACC_N128 FA_ACC_N112, FA_ACC4(14), FA_ACC4(15)
#define FA_REGS_N32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FA_REGS_N48                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23}"
#define FA_REGS_N64                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_REGS_N80                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
#define FA_REGS_N96                                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47}"
#define FA_REGS_N112                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55}"
#define FA_REGS_N128                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63}"

// A, B from shared memory: operands ACC..., a = %IA, b = %IB, scale_d = %IS, and the
// transpose immediates (0: K-major, 1: MN-major) of A = %ITA and B = %ITB.
#define FA_WGMMA_SS(E, PTX_T, N, ACC, REGS, IA, IB, IS, ITA, ITB)                                     \
  template <int kTransA, int kTransB, int kJ0, int kNd>                                               \
  __device__ __forceinline__ void wgmma_ss(Tag<E, N>, float(&d)[kNd][4], u64 a, u64 b, int scale_d) { \
    static_assert(kJ0 >= 0 && kJ0 + N / 8 <= kNd, "accumulator columns out of range");                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS                                             \
                 ", 0;\n"                                                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " " REGS           \
                 ", "                                                                                 \
                 "%" #IA ", %" #IB ", p, 1, 1, %" #ITA ", %" #ITB ";\n}\n"                            \
                 : ACC                                                                                \
                 : "l"(a), "l"(b), "r"(scale_d), "n"(kTransA), "n"(kTransB));                         \
  }
// A from registers: operands ACC..., a[0..3] = %A0..%A3, b = %IB, scale_d = %IS.
#define FA_WGMMA_RS(E, PTX_T, N, ACC, REGS, A0, A1, A2, A3, IB, IS)                               \
  template <int kJ0, int kNd>                                                                     \
  __device__ __forceinline__ void wgmma_rs(Tag<E, N>, float(&d)[kNd][4], const u32(&a)[4], u64 b, \
                                           int scale_d) {                                         \
    static_assert(kJ0 >= 0 && kJ0 + N / 8 <= kNd, "accumulator columns out of range");            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS                                         \
                 ", 0;\n"                                                                         \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " " REGS       \
                 ", "                                                                             \
                 "{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #IB ", p, 1, 1, 1;\n}\n"           \
                 : ACC                                                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));             \
  }

FA_WGMMA_SS(f16_t, "f16", 32, FA_ACC_N32, FA_REGS_N32, 16, 17, 18, 19, 20)
FA_WGMMA_SS(bf16_t, "bf16", 32, FA_ACC_N32, FA_REGS_N32, 16, 17, 18, 19, 20)
FA_WGMMA_SS(f16_t, "f16", 48, FA_ACC_N48, FA_REGS_N48, 24, 25, 26, 27, 28)
FA_WGMMA_SS(bf16_t, "bf16", 48, FA_ACC_N48, FA_REGS_N48, 24, 25, 26, 27, 28)
FA_WGMMA_SS(f16_t, "f16", 64, FA_ACC_N64, FA_REGS_N64, 32, 33, 34, 35, 36)
FA_WGMMA_SS(bf16_t, "bf16", 64, FA_ACC_N64, FA_REGS_N64, 32, 33, 34, 35, 36)
FA_WGMMA_SS(f16_t, "f16", 80, FA_ACC_N80, FA_REGS_N80, 40, 41, 42, 43, 44)
FA_WGMMA_SS(bf16_t, "bf16", 80, FA_ACC_N80, FA_REGS_N80, 40, 41, 42, 43, 44)
FA_WGMMA_SS(f16_t, "f16", 96, FA_ACC_N96, FA_REGS_N96, 48, 49, 50, 51, 52)
FA_WGMMA_SS(bf16_t, "bf16", 96, FA_ACC_N96, FA_REGS_N96, 48, 49, 50, 51, 52)
FA_WGMMA_SS(f16_t, "f16", 112, FA_ACC_N112, FA_REGS_N112, 56, 57, 58, 59, 60)
FA_WGMMA_SS(bf16_t, "bf16", 112, FA_ACC_N112, FA_REGS_N112, 56, 57, 58, 59, 60)
FA_WGMMA_SS(f16_t, "f16", 128, FA_ACC_N128, FA_REGS_N128, 64, 65, 66, 67, 68)
FA_WGMMA_SS(bf16_t, "bf16", 128, FA_ACC_N128, FA_REGS_N128, 64, 65, 66, 67, 68)
FA_WGMMA_RS(f16_t, "f16", 32, FA_ACC_N32, FA_REGS_N32, 16, 17, 18, 19, 20, 21)
FA_WGMMA_RS(bf16_t, "bf16", 32, FA_ACC_N32, FA_REGS_N32, 16, 17, 18, 19, 20, 21)
FA_WGMMA_RS(f16_t, "f16", 48, FA_ACC_N48, FA_REGS_N48, 24, 25, 26, 27, 28, 29)
FA_WGMMA_RS(bf16_t, "bf16", 48, FA_ACC_N48, FA_REGS_N48, 24, 25, 26, 27, 28, 29)
FA_WGMMA_RS(f16_t, "f16", 64, FA_ACC_N64, FA_REGS_N64, 32, 33, 34, 35, 36, 37)
FA_WGMMA_RS(bf16_t, "bf16", 64, FA_ACC_N64, FA_REGS_N64, 32, 33, 34, 35, 36, 37)
FA_WGMMA_RS(f16_t, "f16", 80, FA_ACC_N80, FA_REGS_N80, 40, 41, 42, 43, 44, 45)
FA_WGMMA_RS(bf16_t, "bf16", 80, FA_ACC_N80, FA_REGS_N80, 40, 41, 42, 43, 44, 45)
FA_WGMMA_RS(f16_t, "f16", 96, FA_ACC_N96, FA_REGS_N96, 48, 49, 50, 51, 52, 53)
FA_WGMMA_RS(bf16_t, "bf16", 96, FA_ACC_N96, FA_REGS_N96, 48, 49, 50, 51, 52, 53)
FA_WGMMA_RS(f16_t, "f16", 112, FA_ACC_N112, FA_REGS_N112, 56, 57, 58, 59, 60, 61)
FA_WGMMA_RS(bf16_t, "bf16", 112, FA_ACC_N112, FA_REGS_N112, 56, 57, 58, 59, 60, 61)
FA_WGMMA_RS(f16_t, "f16", 128, FA_ACC_N128, FA_REGS_N128, 64, 65, 66, 67, 68, 69)
FA_WGMMA_RS(bf16_t, "bf16", 128, FA_ACC_N128, FA_REGS_N128, 64, 65, 66, 67, 68, 69)

#undef FA_WGMMA_RS
#undef FA_WGMMA_SS
#undef FA_REGS_N32
#undef FA_REGS_N48
#undef FA_REGS_N64
#undef FA_REGS_N80
#undef FA_REGS_N96
#undef FA_REGS_N112
#undef FA_REGS_N128
#undef FA_ACC_N32
#undef FA_ACC_N48
#undef FA_ACC_N64
#undef FA_ACC_N80
#undef FA_ACC_N96
#undef FA_ACC_N112
#undef FA_ACC_N128
#undef FA_ACC4

template <typename E, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], u64 a, u64 b, int scale_d) {
  wgmma_ss<0, 0, 0, N / 8>(Tag<E, N>(), d, a, b, scale_d);
}
// Both operands MN-major (D = A·B with A stored [k][m] and B stored [k][n], m, n contiguous;
// 16-bit types only): the dQ = dS·K shape of the backward, dS kept as dSᵀ.
template <typename E, int N>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[N / 8][4], u64 a, u64 b, int scale_d) {
  wgmma_ss<1, 1, 0, N / 8>(Tag<E, N>(), d, a, b, scale_d);
}
// A MN-major, B K-major (A stored [k][m], B stored [n][k]): the wide-head backward's
// dVᵀ = dOᵀ·P and dKᵀ = Qᵀ·dS, with dO / Q as stored and Pᵀ / dSᵀ staged [keys][queries].
template <typename E, int N>
__device__ __forceinline__ void wgmma_ss_amn(float (&d)[N / 8][4], u64 a, u64 b, int scale_d) {
  wgmma_ss<1, 0, 0, N / 8>(Tag<E, N>(), d, a, b, scale_d);
}
template <typename E, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const u32 (&a)[4], u64 b, int scale_d) {
  wgmma_rs<0, N / 8>(Tag<E, N>(), d, a, b, scale_d);
}
// Columns 8·kJ0 .. 8·kJ0 + N - 1 of a wider accumulator d[kNd][4] (B's descriptor points at
// those columns): O += P·V of a head dim above 128 as two wgmmas.
template <typename E, int N, int kJ0, int kNd>
__device__ __forceinline__ void wgmma_rs_cols(float (&d)[kNd][4], const u32 (&a)[4], u64 b, int scale_d) {
  wgmma_rs<kJ0, kNd>(Tag<E, N>(), d, a, b, scale_d);
}

// ---- mbarrier (shared::cta, 8 bytes, 8-byte aligned) ---------------------------------------
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
// Arrives (without incrementing the pending count: init counts these) once every cp.async
// this thread issued so far has landed.
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Holds the barrier's current phase open until every cp.async this thread issued so far has
// landed, without counting as one of its arrivals (the pending count goes up now and back down
// then): cp.async copies standing in for a TMA load whose arrivals are made plainly.
__device__ __forceinline__ void mbar_track_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// Blocks until the phase with parity `parity` has completed (a fresh barrier is in phase 0,
// so waiting for parity 1 returns at once).
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA: tensor-map loads completing on an mbarrier's transaction count --------------------
// Arrives on `bar` once and adds `bytes` to the transactions its current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// The box of a 4-d tensor map (a __grid_constant__ parameter) at coordinates {c0, c1, c2, c3}
// into shared memory at dst (1024-byte aligned for the 128B swizzle); its bytes complete on
// `bar`. Out-of-bounds elements arrive as zeros and count.
__device__ __forceinline__ void tma_load_4d(u32 dst, const void* map, int c0, int c1, int c2, int c3,
                                            u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
      "%4, %5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// dst_box += the shared-memory box at src (fp32, the map's swizzle), the box at coordinates
// {c0, c1, c2, c3} of a 4-d tensor map; a bulk group of the issuing thread (bulk_commit).
__device__ __forceinline__ void tma_reduce_add_4d(const void* map, u32 src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];" ::
          "l"(reinterpret_cast<u64>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}
// A tile of kRows head rows (Row = HeadRow<D>) from row `row` of head h, batch b of a
// [B, H, L, D] tensor map (boxes of 64 columns x kRows rows) into its swizzled column blocks
// at dst (Sw128Blocks<kRows>, the layout load_tile_sw128 writes): arms `bar` with the tile's
// bytes, then one box per 64-column block (zeros past D and L). One thread issues it.
template <int kRows, typename Row>
__device__ __forceinline__ void tma_load_tile(u32 dst, const void* map, int row, int h, int b, u32 bar) {
  constexpr int kBlockBytes = kRows * kSw128RowBytes;
  mbar_arrive_expect_tx(bar, kRows * Row::kRowBytes);
#pragma unroll
  for (int blk = 0; blk < Row::kRowBytes / kSw128RowBytes; ++blk)
    tma_load_4d(dst + blk * kBlockBytes, map, 64 * blk, row, h, b, bar);
}

// ---- fences, barriers, registers -------------------------------------------------------------
// Orders this thread's generic-proxy shared-memory accesses (and those it has observed)
// before later async-proxy ones (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
// Arrives on named barrier `id` without waiting (the producer side of a bar.sync pairing).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---- bulk asynchronous reductions (shared -> global) ----------------------------------------
// dst[0..bytes/4) += src[0..bytes/4) (fp32) by the async proxy, which reads src after the
// writers' fence_proxy_async; both 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until at most N of this thread's bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// Until at most N of this thread's bulk groups are still pending at all.
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace sm90
}  // namespace fa

#endif  // FAJIT_WGMMA_SM90_CUH
