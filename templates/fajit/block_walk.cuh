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
  // in the backward) of (batch b, query head h).
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
    return b * bt.row_stride_b + h * bt.row_stride_h + row0 / bt.q_block;
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
  // At the walk's first tile, with the indices of its first two sparse blocks read already
  // (0 where there is none): no load unless that tile starts at or past len.
  __device__ __forceinline__ TileCursor(const BlockWalk<kTile>& w, int len, int index0, int index1)
      : sb(0), sub(0), start(index0 * w.col_block), it(0), ahead(w.n_blocks > 1 ? index1 : 0) {
    if (w.n_blocks == 0 || start < len) return;
    ahead = index1;
    sb = 1, it = w.tiles_per_block;
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

// The kinds of a walk's tiles for one 64-row sub-block of its row block (the Hopper forward's
// consumer warpgroups own 64 rows each): from FaBlockTables::kv_sub_kinds where the tables have
// them (a mask regrouped into taller blocks), else each tile's own kind. A sparse block's byte
// (2 bits a sub-block) is loaded a block ahead of the cursor, as TileCursor loads indices.
struct SubBlockKinds {
  static constexpr unsigned kAllPartial = 0x55u, kAllFull = 0xAAu;
  const unsigned char* partial;  // the walk's row of kv_sub_kinds, or null
  int sb;                        // the sparse block `kinds` belongs to
  unsigned kinds, next;          // the bytes of sparse blocks sb and sb + 1

  template <int kTile>
  __device__ __forceinline__ static const unsigned char* row_of(const FaBlockTables& bt, int b, int h,
                                                                int row0) {
    return bt.kv_sub_kinds ? bt.kv_sub_kinds + BlockWalk<kTile>::row_of(bt, b, h, row0) * bt.num_kv_blocks
                           : nullptr;
  }
  // Sparse block sb's byte (0 past the walk).
  template <int kTile>
  __device__ __forceinline__ static unsigned byte_of(const BlockWalk<kTile>& w, const unsigned char* partial,
                                                     int sb) {
    if (sb >= w.n_blocks) return 0u;
    if (sb >= w.n_partial) return kAllFull;
    return partial ? partial[sb] : kAllPartial;
  }
  // At the walk's first block, the bytes of blocks 0 and 1 given (read already) or loaded.
  __device__ __forceinline__ SubBlockKinds(const unsigned char* row, unsigned kinds0, unsigned kinds1)
      : partial(row), sb(0), kinds(kinds0), next(kinds1) {}
  template <int kTile>
  __device__ __forceinline__ SubBlockKinds(const unsigned char* row, const BlockWalk<kTile>& w)
      : SubBlockKinds(row, byte_of(w, row, 0), byte_of(w, row, 1)) {}
  // Follows the cursor to its sparse block `cursor_sb` (the next one's byte is ready).
  template <int kTile>
  __device__ __forceinline__ void follow(const BlockWalk<kTile>& w, int cursor_sb) {
    if (cursor_sb == sb) return;
    kinds = cursor_sb == sb + 1 ? next : byte_of(w, partial, cursor_sb);
    sb = cursor_sb;
    next = byte_of(w, partial, sb + 1);
  }
  // Sub-block c's kind in the current block (kFaBlockEmpty / Partial / Full).
  __device__ __forceinline__ int of(int c) const { return static_cast<int>(kinds >> (2 * c)) & 3; }
};

}  // namespace fa

#endif  // FAJIT_BLOCK_WALK_CUH
