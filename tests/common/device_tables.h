// A block mask over device tables, for the tests and the fuzzer's GPU mode (needs a GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/runtime/memory.h"

namespace fa::test {

// A mask's kv tables copied to the device and read there by the kernels
// (BlockMask::from_device_kv_blocks: what fajit.torch gives a decoding step's slice of a mask
// and a launch inside a CUDA-graph capture). Needs a GPU; the tables live as long as this.
struct DeviceTablesMask {
  fa::rt::DeviceBuffer tables;
  fa::BlockMask mask;
};
inline std::unique_ptr<DeviceTablesMask> device_tables_of(const fa::BlockMask& m) {
  auto out = std::make_unique<DeviceTablesMask>();
  const std::vector<int32_t>* parts[] = {&m.kv_num_blocks(), &m.kv_indices(), &m.full_kv_num_blocks(),
                                         &m.full_kv_indices()};
  size_t total = 0;
  for (const auto* v : parts) total += v->size();
  out->tables = fa::rt::DeviceBuffer(total * sizeof(int32_t));
  const int32_t* at[4];
  size_t off = 0;
  for (int i = 0; i < 4; ++i) {
    out->tables.upload(parts[i]->data(), parts[i]->size() * sizeof(int32_t), off * sizeof(int32_t));
    at[i] = out->tables.as<const int32_t>() + off;
    off += parts[i]->size();
  }
  out->mask = fa::BlockMask::from_device_kv_blocks(m.batch(), m.heads(), m.len_q(), m.len_kv(), at[0], at[1],
                                                   at[2], at[3], m.q_block(), m.kv_block());
  return out;
}

}  // namespace fa::test
