#include "fajit/runtime/block_mask_builder.h"

#include <algorithm>
#include <climits>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"

namespace fa::rt {
namespace {

constexpr unsigned kThreads = 256;  // FA_BLOCK_MASK_THREADS in block_mask.cuh
constexpr int kCtasPerSm = 8;

size_t align16(size_t n) { return (n + 15) & ~size_t(15); }

// Where a device mask's parts lie in its one allocation: the kinds (and a regrouped mask's sub-block
// kinds, raw and in kv_indices' order; or the known kinds the classifier starts from), then the kv
// set and the q set, each num, idx, full_num, full_idx, at 16-byte boundaries.
struct DeviceLayout {
  size_t kinds = 0, sub = 0, kv_sub = 0, known = 0;
  size_t kv[4] = {}, q[4] = {};
  size_t total = 0;
  DeviceLayout(size_t tiles, size_t kv_rows, size_t q_rows, bool with_sub, bool with_known) {
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t here = at;
      at += align16(bytes);
      return here;
    };
    kinds = take(tiles);
    if (with_sub) {
      sub = take(tiles);
      kv_sub = take(tiles);
    }
    if (with_known) known = take(tiles);
    for (auto [set, rows] : {std::pair{kv, kv_rows}, std::pair{q, q_rows}}) {
      set[0] = take(rows * sizeof(int32_t));
      set[1] = take(tiles * sizeof(int32_t));
      set[2] = take(rows * sizeof(int32_t));
      set[3] = take(tiles * sizeof(int32_t));
    }
    total = at;
  }
};

// A device mask's state over one new allocation of layout `l` on `stream` (its kinds at l.kinds,
// sub-block kinds where the layout has them), in the current context.
std::shared_ptr<BlockMask::DeviceKinds> new_device_kinds(const DeviceLayout& l, bool with_sub,
                                                         CUstream stream, CUfunction tables,
                                                         CUfunction regroup, std::string_view what,
                                                         const ContextGuard& guard) {
  auto d = std::make_shared<BlockMask::DeviceKinds>();
  d->context = guard.context();
  d->stream = stream;
  d->tables_fn = tables;
  d->regroup_fn = regroup;
  d->memory = StreamBuffer(l.total, stream, what);
  d->kinds = d->memory.as<unsigned char>(l.kinds);
  if (with_sub) d->sub_kinds = d->memory.as<unsigned char>(l.sub);
  return d;
}

// A grid of at most a few CTAs per SM over `work` items, `per_cta` a CTA.
unsigned grid_for(int64_t work, int64_t per_cta, const ContextGuard& guard) {
  const DeviceInfo& info = device_info(static_cast<int>(guard.device()));
  const int64_t max_ctas = int64_t(std::max(1, info.sm_count)) * kCtasPerSm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min((work + per_cta - 1) / per_cta, max_ctas)));
}

// A build's grid of tiles, checked: sizes, the int32 tile count, the known kinds' length.
struct Grid {
  int nq, nkv;
  int64_t tiles;
};
Grid checked_grid(CUfunction classify, int batch, int heads, int64_t len_q, int64_t len_kv,
                  const BlockMaskBuildOptions& o) {
  if (!classify) throw Error("build_block_mask: null classify kernel");
  if (batch <= 0 || heads <= 0)
    throw Error(fmt::format("block mask: batch and heads must be positive, got B={}, H={}", batch, heads));
  if (len_q <= 0 || len_kv <= 0 || len_q > INT_MAX || len_kv > INT_MAX)
    throw Error(fmt::format("block mask: lengths must be in [1, 2^31), got Lq={}, Lkv={}", len_q, len_kv));
  if (o.q_block <= 0 || o.kv_block <= 0 || o.q_block % 16 != 0 || o.kv_block % 16 != 0)
    throw Error(fmt::format("block mask: block sizes must be positive multiples of 16, got {}x{}", o.q_block,
                            o.kv_block));
  Grid g;
  g.nq = static_cast<int>((len_q + o.q_block - 1) / o.q_block);
  g.nkv = static_cast<int>((len_kv + o.kv_block - 1) / o.kv_block);
  g.tiles = int64_t(batch) * heads * g.nq * g.nkv;
  if (g.tiles > INT_MAX) throw Error(fmt::format("block mask: {} tiles exceed the int32 range", g.tiles));
  if (!o.known.empty() && o.known.size() != size_t(g.tiles))
    throw Error(
        fmt::format("build_block_mask: known kinds: expected {} entries, got {}", g.tiles, o.known.size()));
  return g;
}

// Launches the classifier into `kinds` (device, num_tiles bytes); `known` device or null.
void launch_classify(CUfunction classify, const FaCaptures& captures, unsigned char* kinds,
                     const unsigned char* known, int batch, int heads, int64_t len_q, int64_t len_kv, int nq,
                     int nkv, const BlockMaskBuildOptions& options, const ContextGuard& guard) {
  FaBlockMaskParams p{};
  p.kinds = kinds;
  p.known = known;
  p.num_tiles = int64_t(batch) * heads * nq * nkv;
  p.batch = batch;
  p.heads = heads;
  p.len_q = static_cast<int>(len_q);
  p.len_kv = static_cast<int>(len_kv);
  p.num_q_blocks = nq;
  p.num_kv_blocks = nkv;
  p.q_block = options.q_block;
  p.kv_block = options.kv_block;
  FaCaptures cap = captures;
  void* args[] = {&p, &cap};
  launch(classify, Dim3(grid_for(p.num_tiles, 1, guard)), Dim3(kThreads), 0, options.stream, args);
}

// Fills both table sets of `d` from its kinds (and kv_sub_kinds from its sub-block kinds).
void launch_tables(BlockMask::DeviceKinds& d, const DeviceLayout& l, int groups, int nq, int nkv,
                   CUstream stream, const ContextGuard& guard) {
  auto* base = d.memory.as<unsigned char>();
  for (const bool transposed : {false, true}) {
    const size_t* set = transposed ? l.q : l.kv;
    FaBlockTablesParams p{};
    p.kinds = d.kinds;
    p.sub_kinds = transposed ? nullptr : d.sub_kinds;
    p.num = reinterpret_cast<int*>(base + set[0]);
    p.idx = reinterpret_cast<int*>(base + set[1]);
    p.full_num = reinterpret_cast<int*>(base + set[2]);
    p.full_idx = reinterpret_cast<int*>(base + set[3]);
    p.sub_out = transposed || !d.sub_kinds ? nullptr : base + l.kv_sub;
    p.groups = groups;
    p.num_q_blocks = nq;
    p.num_kv_blocks = nkv;
    p.transposed = transposed ? 1 : 0;
    void* args[] = {&p};
    const int64_t rows = int64_t(groups) * (transposed ? nkv : nq);
    launch(d.tables_fn, Dim3(grid_for(rows, kThreads / 32, guard)), Dim3(kThreads), 0, stream, args);
    auto at = [&](int i) { return reinterpret_cast<const int*>(base + set[i]); };
    if (transposed) {
      d.tables.q_num_blocks = at(0);
      d.tables.q_indices = at(1);
      d.tables.full_q_num_blocks = at(2);
      d.tables.full_q_indices = at(3);
    } else {
      d.tables.kv_num_blocks = at(0);
      d.tables.kv_indices = at(1);
      d.tables.full_kv_num_blocks = at(2);
      d.tables.full_kv_indices = at(3);
    }
  }
  if (d.sub_kinds) d.kv_sub_kinds = base + l.kv_sub;
}

}  // namespace

std::vector<uint8_t> classify_blocks(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                                     int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options) {
  const auto [nq, nkv, tiles] = checked_grid(classify, batch, heads, len_q, len_kv, options);
  ContextGuard guard;
  DeviceBuffer kinds(static_cast<size_t>(tiles), "the block-mask builder's block kinds");
  DeviceBuffer known;
  if (!options.known.empty()) {
    known = DeviceBuffer(size_t(tiles), "the block-mask builder's known kinds");
    known.upload_async(options.known.data(), size_t(tiles), options.stream);
  }
  launch_classify(classify, captures, kinds.as<unsigned char>(),
                  known ? known.as<const unsigned char>() : nullptr, batch, heads, len_q, len_kv, nq, nkv,
                  options, guard);
  std::vector<uint8_t> host(static_cast<size_t>(tiles));
  kinds.download_async(host.data(), host.size(), options.stream);
  synchronize(options.stream);
  return host;
}

BlockMask build_block_mask(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                           int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options) {
  if (!options.tables || !options.regroup) {
    std::vector<uint8_t> kinds = classify_blocks(classify, captures, batch, heads, len_q, len_kv, options);
    return BlockMask::from_kinds(batch, heads, len_q, len_kv, std::move(kinds), options.q_block,
                                 options.kv_block);
  }
  const auto [nq, nkv, tiles] = checked_grid(classify, batch, heads, len_q, len_kv, options);
  // Known kinds that decide nothing are not uploaded: the classifier evaluates every tile anyway.
  const bool with_known = std::any_of(options.known.begin(), options.known.end(),
                                      [](uint8_t k) { return k != uint8_t(BlockKind::kUndecided); });
  const int groups = batch * heads;
  ContextGuard guard;
  if (stream_is_capturing(options.stream))
    throw Error(
        "block mask: not built while its stream is capturing a CUDA graph; build it before the capture (the "
        "graph's launches read its tables in place)");
  const DeviceLayout l(size_t(tiles), size_t(groups) * nq, size_t(groups) * nkv, false, with_known);
  auto d = new_device_kinds(l, false, options.stream, options.tables, options.regroup,
                            "the block mask's kinds and tables", guard);
  auto* base = d->memory.as<unsigned char>();
  if (with_known)
    upload_staged(d->memory.ptr() + l.known, options.known.data(), size_t(tiles), options.stream);
  launch_classify(classify, captures, base + l.kinds, with_known ? base + l.known : nullptr, batch, heads,
                  len_q, len_kv, nq, nkv, options, guard);
  launch_tables(*d, l, groups, nq, nkv, options.stream, guard);
  return BlockMask::from_device_kinds(batch, heads, len_q, len_kv, options.q_block, options.kv_block,
                                      std::move(d));
}

std::shared_ptr<const BlockMask::DeviceKinds> regroup_device_kinds(const BlockMask::DeviceKinds& src,
                                                                   int groups, int64_t len_q, int64_t len_kv,
                                                                   int q_block, int kv_block, int out_q_block,
                                                                   int out_kv_block, int sub_count,
                                                                   CUstream stream) {
  const int nq = static_cast<int>((len_q + q_block - 1) / q_block);
  const int nkv = static_cast<int>((len_kv + kv_block - 1) / kv_block);
  const int out_nq = static_cast<int>((len_q + out_q_block - 1) / out_q_block);
  const int out_nkv = static_cast<int>((len_kv + out_kv_block - 1) / out_kv_block);
  const int64_t tiles = int64_t(groups) * out_nq * out_nkv;
  ContextGuard guard;
  if (guard.context() != src.context)
    throw Error("block mask: it was built on the device of another CUDA context; use it on that device");
  const bool with_sub = sub_count > 0;
  const DeviceLayout l(size_t(tiles), size_t(groups) * out_nq, size_t(groups) * out_nkv, with_sub, false);
  auto d = new_device_kinds(l, with_sub, stream, src.tables_fn, src.regroup_fn,
                            "the regrouped block mask's kinds and tables", guard);
  FaBlockRegroupParams p{};
  p.kinds = src.kinds;
  p.out = d->memory.as<unsigned char>(l.kinds);
  p.sub_out = with_sub ? d->memory.as<unsigned char>(l.sub) : nullptr;
  p.groups = groups;
  p.len_q = static_cast<int>(len_q);
  p.len_kv = static_cast<int>(len_kv);
  p.num_q_blocks = nq;
  p.num_kv_blocks = nkv;
  p.q_block = q_block;
  p.kv_block = kv_block;
  p.out_q_blocks = out_nq;
  p.out_kv_blocks = out_nkv;
  p.out_q_block = out_q_block;
  p.out_kv_block = out_kv_block;
  p.sub_count = sub_count;
  void* args[] = {&p};
  launch(d->regroup_fn, Dim3(grid_for(tiles, kThreads, guard)), Dim3(kThreads), 0, stream, args);
  launch_tables(*d, l, groups, out_nq, out_nkv, stream, guard);
  return d;
}

BlockMask derive_device_kinds(const BlockMask& mask, CUfunction kinds, CUfunction tables, CUfunction regroup,
                              CUstream stream) {
  if (!kinds || !tables || !regroup) throw Error("derive_device_kinds: null kernel");
  if (!mask.on_device()) throw Error("internal: derive_device_kinds of a mask without device kv tables");
  ContextGuard guard;
  // Inside a CUDA-graph capture the kernels and the allocation join the graph: a replay derives
  // from the tables as they are then.
  FaBlockTables kv{};
  mask.fill(kv);  // the caller's tables, in their context (FAJIT_CHECK_DEVICE_TABLES=1 checks them)
  const int groups = mask.batch() * mask.heads(), nq = mask.num_q_blocks(), nkv = mask.num_kv_blocks();
  const int64_t tiles = int64_t(groups) * nq * nkv;
  const DeviceLayout l(size_t(tiles), size_t(groups) * nq, size_t(groups) * nkv, false, false);
  auto d = new_device_kinds(l, false, stream, tables, regroup, "the block mask's kinds and tables", guard);
  FaBlockKindsParams p{};
  p.num = kv.kv_num_blocks;
  p.idx = kv.kv_indices;
  p.full_num = kv.full_kv_num_blocks;
  p.full_idx = kv.full_kv_num_blocks ? kv.full_kv_indices : nullptr;
  p.kinds = d->memory.as<unsigned char>(l.kinds);
  p.groups = groups;
  p.num_q_blocks = nq;
  p.num_kv_blocks = nkv;
  void* args[] = {&p};
  launch(kinds, Dim3(grid_for(int64_t(groups) * nq, kThreads / 32, guard)), Dim3(kThreads), 0, stream, args);
  launch_tables(*d, l, groups, nq, nkv, stream, guard);
  BlockMask out = BlockMask::from_device_kinds(mask.batch(), mask.heads(), mask.len_q(), mask.len_kv(),
                                               mask.q_block(), mask.kv_block(), std::move(d));
  out.set_matches_mask_mod(mask.matches_mask_mod());
  return out;
}

}  // namespace fa::rt
