// Building a BlockMask on the GPU with the kernels compiled from templates/fajit/block_mask.cuh
// (FAJIT_DEFINE_BLOCK_MASK: <name>, <name>_tables, <name>_regroup, <name>_kinds; fajit compiles
// the classifier <name> per mask_mod and the three others, which read no mods, once per arch as a
// module of their own). The caller compiles them and fills the captures; this file launches them.
//
//   CUfunction fn = fa::rt::load_function(key, cubin, "fa_block_mask");
//   fa::BlockMask m = fa::rt::build_block_mask(fn, captures, B, H, Lq, Lkv);    // host tables
//   o.tables = fa::rt::load_function(key, cubin, "fa_block_mask_tables");       // tables built
//   o.regroup = fa::rt::load_function(key, cubin, "fa_block_mask_regroup");     // on the device
//   fa::BlockMask d = fa::rt::build_block_mask(fn, captures, B, H, Lq, Lkv, o); // no sync
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/params.h"
#include "fajit/runtime/memory.h"

namespace fa {

// A mask classified on the device with its tables built there (BlockMask::built_on_device): one
// stream-ordered allocation holding the kinds and all eight tables, in its builder's context.
struct BlockMask::DeviceKinds {
  CUcontext context = nullptr;
  CUstream stream = nullptr;  // the memory is ordered on it
  CUfunction tables_fn = nullptr, regroup_fn = nullptr;
  rt::StreamBuffer memory;
  const unsigned char* kinds = nullptr;         // [Bm, Hm, nq, nkv]
  const unsigned char* sub_kinds = nullptr;     // a regrouped mask's 64-row sub-block kinds (else null)
  const unsigned char* kv_sub_kinds = nullptr;  // the same in kv_indices' order (FaBlockTables)
  BlockMaskDeviceTables tables;
};

namespace rt {

struct BlockMaskBuildOptions {
  int q_block = BlockMask::kDefaultBlock;
  int kv_block = BlockMask::kDefaultBlock;
  CUstream stream = nullptr;  // the launches (and the copy back) run on it
  // Optional [Bm, Hm, nq, nkv] kinds decided beforehand (BlockKind values; kUndecided:
  // evaluate); empty: evaluate every tile.
  std::vector<uint8_t> known;
  // The module's <name>_tables and <name>_regroup kernels. Given, the mask is built on the device
  // (BlockMask::built_on_device: nothing copied back, no sync; its memory ordered on `stream`);
  // null, the classification is copied back and the call waits for it (host tables).
  CUfunction tables = nullptr;
  CUfunction regroup = nullptr;
};

// Launches `classify` (a FAJIT_DEFINE_BLOCK_MASK kernel) over all tiles of a
// [batch, heads, len_q, len_kv] mask (batch/heads of 1 broadcast: mask_mod sees b = 0 / h = 0),
// with `captures` (device pointers and scalars) as mask_mod's captures, in the current (or
// primary) context, and returns the mask (tables built on the device or the host: see
// BlockMaskBuildOptions::tables).
BlockMask build_block_mask(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                           int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options = {});

// The same, returning only the raw classification [Bm, Hm, nq, nkv] (copied back: waits).
std::vector<uint8_t> classify_blocks(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                                     int64_t len_q, int64_t len_kv,
                                     const BlockMaskBuildOptions& options = {});

// A built-on-device mask of `groups` = Bm * Hm groups regrouped into out_q_block x out_kv_block
// tiles on `stream`, as BlockMask::regrouped does on the host; sub_count > 0 adds the 64-row
// sub-block kinds (kv_sub_kinds). BlockMask::regrouped calls it.
std::shared_ptr<const BlockMask::DeviceKinds> regroup_device_kinds(const BlockMask::DeviceKinds& src,
                                                                   int groups, int64_t len_q, int64_t len_kv,
                                                                   int q_block, int kv_block, int out_q_block,
                                                                   int out_kv_block, int sub_count,
                                                                   CUstream stream);

// A built-on-device mask of `mask`'s device kv tables (BlockMask::from_device_kv_blocks) as they
// are when `stream` reaches it: the tiles' kinds scattered from them (`kinds`: a module's
// <name>_kinds kernel), then all eight tables built from those (kv rows in ascending order), with
// the module's <name>_tables and <name>_regroup, ordered on `stream`. What the backward's
// transposed tables and a tile that splits the blocks read: no copy to the host, no sync (inside a
// CUDA-graph capture, nodes of the graph: a replay derives from the tables as they are then).
BlockMask derive_device_kinds(const BlockMask& mask, CUfunction kinds, CUfunction tables, CUfunction regroup,
                              CUstream stream);

}  // namespace rt
}  // namespace fa
