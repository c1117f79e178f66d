// The block mask a dense forward kernel reads. Private to compiler/lib/api (and its unit test).
#pragma once

#include <deque>
#include <functional>
#include <optional>

#include "fajit/block_mask.h"
#include "fajit/detail/codegen.h"

namespace fa::detail {

// The mask the dense forward of spec `s` reads (it holds whole tiles, or regroupable() lets its
// blocks merge): the mask, or its blocks regrouped along each axis the tile does not divide into
// the tile's size. The wgmma forward walks one tile a kv block (BlockCursor, block_walk.cuh): its
// mask's kv blocks are always the tile's, wider ones split (exact for any tables). The persistent
// Hopper forward's mask starts lead_rows() early where that is not 0. Throws what
// BlockMask::regrouped throws.
// A mask over device tables (BlockMask::on_device) that needs regrouping is regrouped from
// copies->base, which is made from the tables at the first such need of a call (`copies` null:
// an error): by `derive` on the device (fa::rt::derive_device_kinds: no sync), else
// BlockMask::host_copy. A mask built on the device (BlockMask::built_on_device) is regrouped
// there, on `stream`, kept per stream; inside a CUDA-graph capture for the call only, in
// copies->kept. Every mask returned for a call stays valid as long as its `copies` (the
// autotuner prepares several launches before running them).
// The rows the persistent Hopper forward's first query block starts before query 0
// (BlockMask::regrouped_led, FaBlockTables::q_offset): 128 on the three-consumer tiles (192 rows)
// where Lq % 192 is 64, so the one block with a single live warpgroup is the first rather than
// the last, and the mask's first query block walks fewer key blocks than its last (causal,
// sliding, prefix-LM: that block's two idle warpgroups only take turns while the third walks;
// d64 causal at S 4096 walks 32 such tiles last, 1 first); else 0. Not where Lq % 192 is 128
// (two live warpgroups: d64 causal at S 8192 0.987x led by 64) nor on 128-row tiles (led by 64
// every block's diagonal spans two key tiles: d128 causal S 4032 0.95x). Host kinds only: a mask
// on the device (tables or built there) keeps 0, since its kinds would cost a sync.
int lead_rows(const KernelSpec& s, const BlockMask& mask);
struct CallMasks {
  std::optional<BlockMask> base;  // device tables as they are at this call
  std::deque<BlockMask> kept;     // regroupings made for this call only
};
using DeriveOnDevice = std::function<BlockMask(const BlockMask&, Stream)>;
const BlockMask& forward_mask(const KernelSpec& s, const BlockMask& mask, CallMasks* copies = nullptr,
                              Stream stream = nullptr, const DeriveOnDevice& derive = {});

}  // namespace fa::detail
