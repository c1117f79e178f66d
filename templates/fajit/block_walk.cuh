// fajit block-sparse walk: which tiles of one row of a block table a CTA visits, shared by
// the forward kernels (a query block walking its KV blocks) and the backward kernel (a KV
// block walking, through the transposed tables, the query blocks that see it).
// flex_attention's order: the partial blocks of the row (score_mod + mask_mod), then its full
// blocks (score_mod only); empty blocks are never listed. Each sparse block of `col_block`
// columns is walked as col_block / kTile tiles of kTile columns.
#ifndef FAJIT_BLOCK_WALK_CUH
#define FAJIT_BLOCK_WALK_CUH

#include "fajit/params.h"

namespace fa {

// One row of a FaBlockTables. The forward reads the tables as params.h spells them (rows =
// query blocks, columns = KV blocks); the backward reads the transposed set the host fills
// into the same struct (rows = KV blocks, columns = query blocks; params.h, FaBwdParams).
template <int kTile>
struct BlockWalk {
  int n_partial;        // partial sparse blocks
  int tiles_per_block;  // col_block / kTile
  int n_tiles;          // tiles to visit, partial ones first
  int n_blocks;         // sparse blocks to visit: n_partial, then the full ones
  int col_block;
  const int* partial_idx;
  const int* full_idx;

  // The walk of the row block that starts at `row0` (a query row in the forward, a key row
  // in the backward) of (batch b, query head h); row0 may be negative where the tables' first
  // block starts before query 0 (FaBlockTables::q_offset).
  __device__ __forceinline__ BlockWalk(const FaBlockTables& bt, int b, int h, int row0)
      : BlockWalk(bt, b, h, row0, bt.kv_num_blocks[row_of(bt, b, h, row0)],
                  bt.full_kv_num_blocks ? bt.full_kv_num_blocks[row_of(bt, b, h, row0)] : 0) {}
  // The same walk from its block counts, read already (the persistent forward's producer
  // publishes them to its consumers): no loads.
  __device__ __forceinline__ BlockWalk(const FaBlockTables& bt, int b, int h, int row0, int partial,
                                       int full) {
    const long long row = row_of(bt, b, h, row0);
    n_partial = partial;
    partial_idx = bt.kv_indices + row * bt.num_kv_blocks;
    full_idx = bt.full_kv_indices + row * bt.num_kv_blocks;
    col_block = bt.kv_block;
    tiles_per_block = bt.kv_block / kTile;
    n_blocks = partial + full;
    n_tiles = n_blocks * tiles_per_block;
  }
  __device__ __forceinline__ static long long row_of(const FaBlockTables& bt, int b, int h, int row0) {
    return b * bt.row_stride_b + h * bt.row_stride_h + (row0 + bt.q_offset) / bt.q_block;
  }
  // Column block index of sparse block `sb` of the walk.
  __device__ __forceinline__ int block_index(int sb) const {
    return sb < n_partial ? partial_idx[sb] : full_idx[sb - n_partial];
  }
};

// The tiles of a walk in order, without the ones that start at or past `len` (a tail block's
// sub-tiles past the end: never loaded, never computed), moved one tile at a time with no
// division. The next sparse block's index is loaded one block ahead (`ahead`): next() within a
// block loads nothing, and at a block's end takes the index loaded a block earlier and loads the
// one after, so no role waits on a table load while it moves the cursor (ncu, d128 backward
// before: 5.7 % of all samples at the consumers' load, one a tile). A cursor may start at any
// tile `first` of the walk (a split of the decoding kernel) and stop before tile `end`
// (done(w, end)).
template <int kTile>
struct TileCursor {
  int sb;     // sparse block of the walk
  int sub;    // tile within it
  int start;  // first column of the tile (valid while !done())
  int it;     // the tile's index in the walk, sb * tiles_per_block + sub
  int ahead;  // block index of sparse block sb + 1 (while there is one)

  __device__ __forceinline__ TileCursor(const BlockWalk<kTile>& w, int len, int first = 0)
      : sb(first / w.tiles_per_block), sub(first - sb * w.tiles_per_block), start(0), it(first) {
    ahead = sb < w.n_blocks ? w.block_index(sb) : 0;
    seek(w, len);
  }
  __device__ __forceinline__ bool done(const BlockWalk<kTile>& w) const { return sb >= w.n_blocks; }
  __device__ __forceinline__ bool done(const BlockWalk<kTile>& w, int end) const {
    return sb >= w.n_blocks || it >= end;
  }
  // Whether the tile lies in a full block (no mask_mod needed).
  __device__ __forceinline__ bool is_full(const BlockWalk<kTile>& w) const { return sb >= w.n_partial; }
  __device__ __forceinline__ void next(const BlockWalk<kTile>& w, int len) {
    ++it;
    if (++sub < w.tiles_per_block) {
      start += kTile;
      if (start < len) return;
      it = (sb + 1) * w.tiles_per_block;  // the block's later sub-tiles start past len too
    }
    sub = 0, ++sb;
    seek(w, len);
  }

 private:
  // From (sb, sub), `ahead` holding block sb's index, to the first tile that starts inside
  // len; the later sub-tiles of a block whose tile starts past len start past it too.
  __device__ __forceinline__ void seek(const BlockWalk<kTile>& w, int len) {
    for (; sb < w.n_blocks; ++sb, sub = 0, it = sb * w.tiles_per_block) {
      start = ahead * w.col_block + sub * kTile;
      ahead = sb + 1 < w.n_blocks ? w.block_index(sb + 1) : 0;
      if (start < len) return;
    }
  }
};

// The tiles of a walk from the last query block down (deterministic mode's backward walk:
// backward_sm90.cuh, kDqOrdered): the partial and the full list merged from their ends, larger
// block index first, each block's tiles from its last one inside `len` down. Tables list each
// kind's blocks ascending, so this is every tile in descending order; any list order still gives
// every tile once. A block's step loads each list's last untaken entry (two loads; the one not
// taken is loaded again at the next block).
template <int kTile>
struct DescendingCursor {
  int partial_left, full_left;  // entries of each list not yet taken (taken from the end)
  int sub;                      // tile within the block (-1: the walk is done)
  int start;                    // first row of the tile (valid while !done())
  bool full;                    // the block is in the full list

  __device__ __forceinline__ DescendingCursor(const BlockWalk<kTile>& w, int len)
      : partial_left(w.n_partial), full_left(w.n_blocks - w.n_partial), sub(-1), start(0), full(false) {
    take(w, len);
  }
  __device__ __forceinline__ bool done(const BlockWalk<kTile>&) const { return sub < 0; }
  __device__ __forceinline__ bool is_full(const BlockWalk<kTile>&) const { return full; }
  __device__ __forceinline__ void next(const BlockWalk<kTile>& w, int len) {
    if (--sub >= 0) {
      start -= kTile;
      return;
    }
    take(w, len);
  }

 private:
  // The next block with a tile inside len, at its last such tile (sub -1 when none is left).
  __device__ __forceinline__ void take(const BlockWalk<kTile>& w, int len) {
    while (partial_left > 0 || full_left > 0) {
      const int p = partial_left > 0 ? w.partial_idx[partial_left - 1] : -1;
      const int f = full_left > 0 ? w.full_idx[full_left - 1] : -1;
      full = f > p;
      const int first = (full ? f : p) * w.col_block;
      if (full)
        --full_left;
      else
        --partial_left;
      if (first >= len) continue;
      sub = min(w.tiles_per_block - 1, (len - 1 - first) / kTile);
      start = first + sub * kTile;
      return;
    }
    sub = -1;
  }
};

// Deterministic mode's walk of a Hopper dK/dV CTA (backward_sm90.cuh, kDqOrdered): the query
// tiles of the GQA group's `group` heads from h0, each head's from the last query block down
// (DescendingCursor); with `interleave` (tables the same for every head) the heads one after the
// other at each tile, else head by head. One cursor, so a walk's body is compiled once (two loop
// nests, one per order, cost NVRTC half a second more on the d128 kernel).
template <int kTile>
struct GroupTileWalk {
  const FaBlockTables* bt;
  int b, h0, h_end, row0, len;
  bool interleave;
  int hq;  // the tile's head (valid while !done())
  BlockWalk<kTile> walk;
  DescendingCursor<kTile> cur;

  __device__ __forceinline__ GroupTileWalk(const FaBlockTables& t, int b_, int h0_, int group, int row0_,
                                           int len_, bool interleave_)
      : bt(&t),
        b(b_),
        h0(h0_),
        h_end(h0_ + group),
        row0(row0_),
        len(len_),
        interleave(interleave_),
        hq(h0_),
        walk(t, b_, h0_, row0_),
        cur(walk, len_) {
    settle();
  }
  __device__ __forceinline__ bool done() const { return cur.done(walk) || h_end <= h0; }  // (group >= 1)
  __device__ __forceinline__ int start() const { return cur.start; }
  __device__ __forceinline__ bool is_full() const { return cur.is_full(walk); }
  __device__ __forceinline__ void next() {
    if (interleave) {
      if (++hq < h_end) return;
      hq = h0;
      cur.next(walk, len);
      return;
    }
    cur.next(walk, len);
    settle();
  }

 private:
  // Head by head: past a head's last tile, the next head with a tile (done() after the last).
  __device__ __forceinline__ void settle() {
    while (!interleave && cur.done(walk) && hq + 1 < h_end) {
      ++hq;
      walk = BlockWalk<kTile>(*bt, b, hq, row0);
      cur = DescendingCursor<kTile>(walk, len);
    }
  }
};

// The walk of a row whose sparse blocks are one tile each (kv_block == kTile: the Hopper
// forward, whose host splits wider blocks, BlockMask::regrouped), a block a step, with each
// block's kinds for the 64-row sub-blocks of its row block (the Hopper forward's consumer
// warpgroups own 64 rows each): from FaBlockTables::kv_sub_kinds where the tables have them (a
// mask regrouped into taller blocks), else the block's own kind for every sub-block. The next
// block's index and kinds byte (2 bits a sub-block) are loaded together, a block ahead, so a step
// is one compare and one pair of loads (TileCursor's sub-tile bookkeeping and a second cursor
// following it cost the d64 consumer ~80 instructions a tile, NOTES-sm90).
template <int kTile>
struct BlockCursor {
  static constexpr unsigned kAllPartial = 0x55u, kAllFull = 0xAAu;
  int sb;          // sparse block of the walk (= its tile)
  int start;       // its first column (valid while !done())
  unsigned kinds;  // its kinds byte
  int ahead;       // block sb + 1's index and kinds byte (0 past the walk)
  unsigned ahead_kinds;

  // The walk's row of kv_sub_kinds, or null.
  __device__ __forceinline__ static const unsigned char* kinds_row(const FaBlockTables& bt, int b, int h,
                                                                   int row0) {
    return bt.kv_sub_kinds ? bt.kv_sub_kinds + BlockWalk<kTile>::row_of(bt, b, h, row0) * bt.num_kv_blocks
                           : nullptr;
  }
  // Sparse block i's kinds byte (0 past the walk).
  __device__ __forceinline__ static unsigned kinds_of(const BlockWalk<kTile>& w, const unsigned char* row,
                                                      int i) {
    if (i >= w.n_blocks) return 0u;
    if (i >= w.n_partial) return kAllFull;
    return row ? row[i] : kAllPartial;
  }
  // Sparse block i's index (0 past the walk): one load from one address, formed by selects.
  __device__ __forceinline__ static int index_of(const BlockWalk<kTile>& w, int i) {
    if (i >= w.n_blocks) return 0;
    const bool partial = i < w.n_partial;
    return (partial ? w.partial_idx : w.full_idx)[partial ? i : i - w.n_partial];
  }

  // At the walk's first block, the indices and kinds bytes of blocks 0 and 1 given (read
  // already: the persistent forward's producer publishes them); no load unless block 0 starts
  // at or past len.
  __device__ __forceinline__ BlockCursor(const BlockWalk<kTile>& w, const unsigned char* row, int len,
                                         int index0, int index1, unsigned kinds0, unsigned kinds1)
      : sb(0), start(index0 * kTile), kinds(kinds0), ahead(index1), ahead_kinds(kinds1) {
    if (w.n_blocks == 0 || start < len) return;
    sb = 1;
    seek(w, row, len);
  }
  // The same, loading them.
  __device__ __forceinline__ BlockCursor(const BlockWalk<kTile>& w, const unsigned char* row, int len)
      : BlockCursor(w, row, len, index_of(w, 0), index_of(w, 1), kinds_of(w, row, 0), kinds_of(w, row, 1)) {}

  __device__ __forceinline__ bool done(const BlockWalk<kTile>& w) const { return sb >= w.n_blocks; }
  // The kind (kFaBlockEmpty / Partial / Full) of the block for the sub-block whose 2 bits start at
  // `shift`, masked by `live` (3, or 0 for a sub-block with no rows: empty).
  __device__ __forceinline__ int kind(int shift, unsigned live) const {
    return static_cast<int>((kinds >> shift) & live);
  }
  __device__ __forceinline__ void next(const BlockWalk<kTile>& w, const unsigned char* row, int len) {
    ++sb;
    seek(w, row, len);
  }

 private:
  // From block sb, its index and kinds in `ahead`, to the first block that starts inside len.
  __device__ __forceinline__ void seek(const BlockWalk<kTile>& w, const unsigned char* row, int len) {
    for (; sb < w.n_blocks; ++sb) {
      start = ahead * kTile;
      kinds = ahead_kinds;
      ahead = index_of(w, sb + 1);
      ahead_kinds = kinds_of(w, row, sb + 1);
      if (start < len) return;
    }
  }
};

}  // namespace fa

#endif  // FAJIT_BLOCK_WALK_CUH
