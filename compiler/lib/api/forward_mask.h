// The block mask a dense forward kernel reads. Private to compiler/lib/api (and its unit test).
#pragma once

#include <functional>
#include <optional>

#include "fajit/block_mask.h"
#include "fajit/detail/codegen.h"

namespace fa::detail {

// The mask the dense forward of spec `s` reads (it holds whole tiles, or regroupable() lets its
// blocks merge): the mask, or its blocks regrouped along each axis the tile does not divide into
// the tile's size. The wgmma forward walks one tile a kv block (BlockCursor, block_walk.cuh): its
// mask's kv blocks are always the tile's, wider ones split (exact for any tables). Throws what
// BlockMask::regrouped throws.
// A mask over device tables (BlockMask::on_device) that needs regrouping is regrouped from
// *copy, which is made from the tables at the first such need (`copy` null: an error): by
// `derive` on the device (fa::rt::derive_device_kinds: no sync), else BlockMask::host_copy. A
// mask built on the device (BlockMask::built_on_device) is regrouped there, on `stream`.
using DeriveOnDevice = std::function<BlockMask(const BlockMask&, Stream)>;
const BlockMask& forward_mask(const KernelSpec& s, const BlockMask& mask,
                              std::optional<BlockMask>* copy = nullptr, Stream stream = nullptr,
                              const DeriveOnDevice& derive = {});

}  // namespace fa::detail
