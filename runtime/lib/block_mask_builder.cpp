#include "fajit/runtime/block_mask_builder.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"

namespace fa::rt {
namespace {

constexpr unsigned kThreads = 256;  // FA_BLOCK_MASK_THREADS in block_mask.cuh
constexpr int kCtasPerSm = 8;

}  // namespace

std::vector<uint8_t> classify_blocks(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                                     int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options) {
  if (!classify) throw Error("build_block_mask: null classify kernel");
  if (batch <= 0 || heads <= 0)
    throw Error(fmt::format("block mask: batch and heads must be positive, got B={}, H={}", batch, heads));
  if (len_q <= 0 || len_kv <= 0 || len_q > INT_MAX || len_kv > INT_MAX)
    throw Error(fmt::format("block mask: lengths must be in [1, 2^31), got Lq={}, Lkv={}", len_q, len_kv));
  if (options.q_block <= 0 || options.kv_block <= 0 || options.q_block % 16 != 0 ||
      options.kv_block % 16 != 0)
    throw Error(fmt::format("block mask: block sizes must be positive multiples of 16, got {}x{}",
                            options.q_block, options.kv_block));
  const int nq = static_cast<int>((len_q + options.q_block - 1) / options.q_block);
  const int nkv = static_cast<int>((len_kv + options.kv_block - 1) / options.kv_block);
  const int64_t tiles = int64_t(batch) * heads * nq * nkv;
  if (tiles > INT_MAX) throw Error(fmt::format("block mask: {} tiles exceed the int32 range", tiles));
  if (!options.known.empty() && options.known.size() != size_t(tiles))
    throw Error(fmt::format("build_block_mask: known kinds: expected {} entries, got {}", tiles,
                            options.known.size()));

  ContextGuard guard;
  DeviceBuffer kinds(static_cast<size_t>(tiles), "the block-mask builder's block kinds");
  DeviceBuffer known;
  if (!options.known.empty()) {
    known = DeviceBuffer(size_t(tiles), "the block-mask builder's known kinds");
    known.upload_async(options.known.data(), size_t(tiles), options.stream);
  }
  FaBlockMaskParams p{};
  p.kinds = kinds.as<unsigned char>();
  p.known = known ? known.as<const unsigned char>() : nullptr;
  p.num_tiles = tiles;
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
  const DeviceInfo& info = device_info(static_cast<int>(guard.device()));
  const int64_t max_ctas = int64_t(std::max(1, info.sm_count)) * kCtasPerSm;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, max_ctas));
  launch(classify, Dim3(grid), Dim3(kThreads), 0, options.stream, args);
  std::vector<uint8_t> host(static_cast<size_t>(tiles));
  kinds.download_async(host.data(), host.size(), options.stream);
  synchronize(options.stream);
  return host;
}

BlockMask build_block_mask(CUfunction classify, const FaCaptures& captures, int batch, int heads,
                           int64_t len_q, int64_t len_kv, const BlockMaskBuildOptions& options) {
  std::vector<uint8_t> kinds = classify_blocks(classify, captures, batch, heads, len_q, len_kv, options);
  return BlockMask::from_kinds(batch, heads, len_q, len_kv, std::move(kinds), options.q_block,
                               options.kv_block);
}

}  // namespace fa::rt
