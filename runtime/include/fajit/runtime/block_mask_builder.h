// Building a BlockMask on the GPU with a kernel compiled from templates/fajit/block_mask.cuh
// (FAJIT_DEFINE_BLOCK_MASK). The caller compiles the kernel and fills the captures; this file
// launches it and turns the classification into tables.
//
//   CUfunction fn = fa::rt::load_function(key, cubin, "fa_block_mask");
//   fa::BlockMask m = fa::rt::build_block_mask(fn, captures, B, H, Lq, Lkv);
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/params.h"

namespace fa::rt {

struct BlockMaskBuildOptions {
  int q_block = BlockMask::kDefaultBlock;
  int kv_block = BlockMask::kDefaultBlock;
  CUstream stream = nullptr;  // the launch and the copy back run on it; the call waits for it
  // Optional [Bm, Hm, nq, nkv] kinds decided beforehand (BlockKind values; kUndecided:
  // evaluate); empty: evaluate every tile.
  std::vector<uint8_t> known;
};

// Launches `classify` (a FAJIT_DEFINE_BLOCK_MASK kernel) over all tiles of a
// [batch, heads, len_q, len_kv] mask (batch/heads of 1 broadcast: mask_mod sees b = 0 / h = 0),
// with `captures` (device pointers and scalars) as mask_mod's captures, in the current (or
// primary) context, and returns the mask with host tables built from the classification.
BlockMask build_block_mask(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                           int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options = {});

// The same, returning only the raw classification [Bm, Hm, nq, nkv].
std::vector<uint8_t> classify_blocks(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                                     int64_t len_q, int64_t len_kv,
                                     const BlockMaskBuildOptions& options = {});

}  // namespace fa::rt
