// fajit block-sparse walk: which KV tiles one CTA visits, shared by the forward kernels.
// flex_attention's order: the partial KV blocks of this query block (score_mod + mask_mod),
// then its full blocks (score_mod only); empty blocks are never listed. Each sparse block of
// kv_block keys is walked as kv_block / BLOCK_N tiles of BLOCK_N keys.
#ifndef FAJIT_BLOCK_WALK_CUH
#define FAJIT_BLOCK_WALK_CUH

#include "fajit/params.h"

namespace fa {

template <int kBlockN>
struct KvWalk {
  int n_partial;        // partial sparse blocks
  int tiles_per_block;  // kv_block / BLOCK_N
  int n_tiles;          // tiles to visit, partial ones first
  int kv_block;
  const int* partial_idx;
  const int* full_idx;

  // The walk of query block starting at row q0 of (batch b, query head h).
  __device__ __forceinline__ KvWalk(const FaBlockTables& bt, int b, int h, int q0) {
    const long long row = b * bt.row_stride_b + h * bt.row_stride_h + q0 / bt.q_block;
    n_partial = bt.kv_num_blocks[row];
    const int n_full = bt.full_kv_num_blocks ? bt.full_kv_num_blocks[row] : 0;
    partial_idx = bt.kv_indices + row * bt.num_kv_blocks;
    full_idx = bt.full_kv_indices + row * bt.num_kv_blocks;
    kv_block = bt.kv_block;
    tiles_per_block = bt.kv_block / kBlockN;
    n_tiles = (n_partial + n_full) * tiles_per_block;
  }
  // First key of tile `it`.
  __device__ __forceinline__ int tile_start(int it) const {
    const int sb = it / tiles_per_block, sub = it - sb * tiles_per_block;
    const int blk = sb < n_partial ? partial_idx[sb] : full_idx[sb - n_partial];
    return blk * kv_block + sub * kBlockN;
  }
  // Whether tile `it` lies in a full block (no mask_mod needed).
  __device__ __forceinline__ bool is_full(int it) const { return it / tiles_per_block >= n_partial; }
};

}  // namespace fa

#endif  // FAJIT_BLOCK_WALK_CUH
