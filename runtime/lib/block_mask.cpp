#include "fajit/runtime/block_mask.h"

#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/params.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/memory.h"

namespace fa {

struct BlockMask::State {
  int batch = 1, heads = 1;
  int64_t len_q = 0, len_kv = 0;
  int q_block = 0, kv_block = 0;
  int nq = 0, nkv = 0;
  std::vector<uint8_t> kinds;
  std::vector<int32_t> kv_num, kv_idx, full_kv_num, full_kv_idx;
  std::vector<int32_t> q_num, q_idx, full_q_num, full_q_idx;

  struct Device {
    rt::DeviceBuffer buffer;  // all eight tables, back to back
    BlockMaskDeviceTables tables;
  };
  std::mutex mutex;
  std::map<CUcontext, Device> devices;
};

namespace {

using State = BlockMask::State;

int blocks_for(int64_t len, int block) { return static_cast<int>((len + block - 1) / block); }

std::shared_ptr<State> make_state(int batch, int heads, int64_t len_q, int64_t len_kv,
                                  int q_block, int kv_block) {
  if (batch <= 0 || heads <= 0)
    throw Error(fmt::format("block mask: batch and heads must be positive, got B={}, H={}",
                            batch, heads));
  if (len_q <= 0 || len_kv <= 0)
    throw Error(fmt::format("block mask: lengths must be positive, got Lq={}, Lkv={}", len_q,
                            len_kv));
  if (len_q > INT32_MAX || len_kv > INT32_MAX)
    throw Error(fmt::format("block mask: lengths exceed the int32 range, got Lq={}, Lkv={}",
                            len_q, len_kv));
  if (q_block <= 0 || kv_block <= 0 || q_block % 16 != 0 || kv_block % 16 != 0)
    throw Error(fmt::format("block mask: block sizes must be positive multiples of 16, got {}x{}",
                            q_block, kv_block));
  auto s = std::make_shared<State>();
  s->batch = batch;
  s->heads = heads;
  s->len_q = len_q;
  s->len_kv = len_kv;
  s->q_block = q_block;
  s->kv_block = kv_block;
  s->nq = blocks_for(len_q, q_block);
  s->nkv = blocks_for(len_kv, kv_block);
  const int64_t tiles = int64_t(batch) * heads * s->nq * s->nkv;
  if (tiles > (int64_t(1) << 31) - 1)
    throw Error(fmt::format("block mask: {} tiles exceed the int32 range", tiles));
  return s;
}

// Fills all eight tables from s.kinds.
void build_tables(State& s) {
  const int64_t bh = int64_t(s.batch) * s.heads;
  const int nq = s.nq, nkv = s.nkv;
  s.kv_num.assign(bh * nq, 0);
  s.full_kv_num.assign(bh * nq, 0);
  s.kv_idx.assign(bh * nq * nkv, 0);
  s.full_kv_idx.assign(bh * nq * nkv, 0);
  s.q_num.assign(bh * nkv, 0);
  s.full_q_num.assign(bh * nkv, 0);
  s.q_idx.assign(bh * nkv * nq, 0);
  s.full_q_idx.assign(bh * nkv * nq, 0);
  for (int64_t g = 0; g < bh; ++g) {
    const uint8_t* k = s.kinds.data() + g * nq * nkv;
    for (int qb = 0; qb < nq; ++qb) {  // q rows and, in the same ascending sweep, kv columns
      const int64_t row = g * nq + qb;
      for (int kb = 0; kb < nkv; ++kb) {
        const uint8_t kind = k[int64_t(qb) * nkv + kb];
        if (kind == uint8_t(BlockKind::kEmpty)) continue;
        const int64_t col = g * nkv + kb;
        if (kind == uint8_t(BlockKind::kFull)) {
          s.full_kv_idx[row * nkv + s.full_kv_num[row]++] = kb;
          s.full_q_idx[col * nq + s.full_q_num[col]++] = qb;
        } else {
          s.kv_idx[row * nkv + s.kv_num[row]++] = kb;
          s.q_idx[col * nq + s.q_num[col]++] = qb;
        }
      }
    }
  }
}

}  // namespace

BlockMask BlockMask::from_kinds(int batch, int heads, int64_t len_q, int64_t len_kv,
                                const std::vector<uint8_t>& kinds, int q_block, int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  const size_t want = size_t(batch) * heads * s->nq * s->nkv;
  if (kinds.size() != want)
    throw Error(fmt::format("block mask: expected {} block kinds [Bm={}, Hm={}, {}, {}], got {}",
                            want, batch, heads, s->nq, s->nkv, kinds.size()));
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] > uint8_t(BlockKind::kFull))
      throw Error(fmt::format("block mask: block kind {} at index {} is not 0, 1 or 2",
                              int(kinds[i]), i));
  }
  s->kinds = kinds;
  build_tables(*s);
  return BlockMask(std::move(s));
}

BlockMask BlockMask::all_full(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                              int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  s->kinds.assign(size_t(batch) * heads * s->nq * s->nkv, uint8_t(BlockKind::kFull));
  build_tables(*s);
  return BlockMask(std::move(s));
}

BlockMask BlockMask::from_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                    const std::vector<int32_t>& kv_num_blocks,
                                    const std::vector<int32_t>& kv_indices,
                                    const std::vector<int32_t>& full_kv_num_blocks,
                                    const std::vector<int32_t>& full_kv_indices, int q_block,
                                    int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  const int nq = s->nq, nkv = s->nkv;
  const size_t rows = size_t(batch) * heads * nq;
  auto check_size = [&](const char* name, const std::vector<int32_t>& v, size_t want) {
    if (v.size() != want)
      throw Error(fmt::format("{}: expected {} entries [Bm={}, Hm={}, {}{}], got {}", name, want,
                              batch, heads, nq, want == rows ? "" : fmt::format(", {}", nkv),
                              v.size()));
  };
  check_size("kv_num_blocks", kv_num_blocks, rows);
  check_size("kv_indices", kv_indices, rows * nkv);
  const bool has_full = !full_kv_num_blocks.empty() || !full_kv_indices.empty();
  if (has_full) {
    check_size("full_kv_num_blocks", full_kv_num_blocks, rows);
    check_size("full_kv_indices", full_kv_indices, rows * nkv);
  }
  s->kinds.assign(rows * nkv, uint8_t(BlockKind::kEmpty));
  auto place = [&](const char* num_name, const char* idx_name, const std::vector<int32_t>& num,
                   const std::vector<int32_t>& idx, BlockKind kind) {
    for (size_t row = 0; row < rows; ++row) {
      const int b = int(row / (size_t(heads) * nq)), h = int(row / nq % heads),
                qb = int(row % nq);
      if (num[row] < 0 || num[row] > nkv)
        throw Error(fmt::format("{}: count {} at (b={}, h={}, q-block={}) is outside [0, {}]",
                                num_name, num[row], b, h, qb, nkv));
      for (int i = 0; i < num[row]; ++i) {
        const int32_t kb = idx[row * nkv + i];
        if (kb < 0 || kb >= nkv)
          throw Error(fmt::format("{}: entry {} at (b={}, h={}, q-block={}) is {}, outside [0, {})",
                                  idx_name, i, b, h, qb, kb, nkv));
        uint8_t& k = s->kinds[row * nkv + kb];
        if (k != uint8_t(BlockKind::kEmpty))
          throw Error(fmt::format("{}: block (b={}, h={}, q-block={}, kv-block={}) is listed twice",
                                  idx_name, b, h, qb, kb));
        k = uint8_t(kind);
      }
    }
  };
  place("kv_num_blocks", "kv_indices", kv_num_blocks, kv_indices, BlockKind::kPartial);
  if (has_full)
    place("full_kv_num_blocks", "full_kv_indices", full_kv_num_blocks, full_kv_indices,
          BlockKind::kFull);
  build_tables(*s);
  return BlockMask(std::move(s));
}

const BlockMask::State& BlockMask::state() const {
  if (!state_) throw Error("block mask: empty (default-constructed) mask");
  return *state_;
}

int BlockMask::batch() const { return state().batch; }
int BlockMask::heads() const { return state().heads; }
int64_t BlockMask::len_q() const { return state().len_q; }
int64_t BlockMask::len_kv() const { return state().len_kv; }
int BlockMask::q_block() const { return state().q_block; }
int BlockMask::kv_block() const { return state().kv_block; }
int BlockMask::num_q_blocks() const { return state().nq; }
int BlockMask::num_kv_blocks() const { return state().nkv; }
const std::vector<uint8_t>& BlockMask::kinds() const { return state().kinds; }
const std::vector<int32_t>& BlockMask::kv_num_blocks() const { return state().kv_num; }
const std::vector<int32_t>& BlockMask::kv_indices() const { return state().kv_idx; }
const std::vector<int32_t>& BlockMask::full_kv_num_blocks() const { return state().full_kv_num; }
const std::vector<int32_t>& BlockMask::full_kv_indices() const { return state().full_kv_idx; }
const std::vector<int32_t>& BlockMask::q_num_blocks() const { return state().q_num; }
const std::vector<int32_t>& BlockMask::q_indices() const { return state().q_idx; }
const std::vector<int32_t>& BlockMask::full_q_num_blocks() const { return state().full_q_num; }
const std::vector<int32_t>& BlockMask::full_q_indices() const { return state().full_q_idx; }

BlockKind BlockMask::kind(int b, int h, int q_blk, int kv_blk) const {
  const State& s = state();
  if (b < 0 || b >= s.batch || h < 0 || h >= s.heads || q_blk < 0 || q_blk >= s.nq ||
      kv_blk < 0 || kv_blk >= s.nkv)
    throw Error(fmt::format("block mask: block (b={}, h={}, q-block={}, kv-block={}) is outside "
                            "[{}, {}, {}, {}]",
                            b, h, q_blk, kv_blk, s.batch, s.heads, s.nq, s.nkv));
  return BlockKind(s.kinds[((int64_t(b) * s.heads + h) * s.nq + q_blk) * s.nkv + kv_blk]);
}

BlockMaskDensity BlockMask::density() const {
  const State& s = state();
  BlockMaskDensity d;
  for (uint8_t k : s.kinds) {
    if (k == uint8_t(BlockKind::kFull)) ++d.full;
    else if (k == uint8_t(BlockKind::kPartial)) ++d.partial;
    else ++d.empty;
  }
  const int64_t all = d.full + d.partial + d.empty;
  d.fraction = all ? double(d.full + d.partial) / double(all) : 0.0;
  return d;
}

std::string BlockMask::to_string(int b, int h) const {
  const State& s = state();
  (void)kind(b, h, 0, 0);  // range check
  const BlockMaskDensity d = density();
  std::string out = fmt::format(
      "BlockMask(B={}, H={}, Lq={}, Lkv={}, block={}x{}, density={:.3f}: {} full, {} partial, "
      "{} empty) b={} h={}\n",
      s.batch, s.heads, s.len_q, s.len_kv, s.q_block, s.kv_block, d.fraction, d.full, d.partial,
      d.empty, b, h);
  const uint8_t* k = s.kinds.data() + (int64_t(b) * s.heads + h) * s.nq * s.nkv;
  for (int qb = 0; qb < s.nq; ++qb) {
    for (int kb = 0; kb < s.nkv; ++kb) {
      const uint8_t v = k[int64_t(qb) * s.nkv + kb];
      out += v == uint8_t(BlockKind::kFull) ? '#' : v == uint8_t(BlockKind::kPartial) ? '+' : '.';
    }
    out += '\n';
  }
  return out;
}

void BlockMask::check_compatible(int batch, int heads, int64_t len_q, int64_t len_kv) const {
  const State& s = state();
  if (s.len_q != len_q || s.len_kv != len_kv)
    throw Error(fmt::format("block mask was built for Lq={}, Lkv={}; got Lq={}, Lkv={}", s.len_q,
                            s.len_kv, len_q, len_kv));
  if (s.batch != 1 && s.batch != batch)
    throw Error(fmt::format("block mask was built for B={}; got B={} (expected 1 or {})",
                            s.batch, batch, batch));
  if (s.heads != 1 && s.heads != heads)
    throw Error(fmt::format("block mask was built for H={}; got H={} (expected 1 or {})",
                            s.heads, heads, heads));
}

BlockMaskDeviceTables BlockMask::device_tables() const {
  State& s = const_cast<State&>(state());
  rt::ContextGuard guard;
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.devices.find(guard.context());
  if (it != s.devices.end()) return it->second.tables;

  const std::vector<int32_t>* parts[] = {&s.kv_num, &s.kv_idx, &s.full_kv_num, &s.full_kv_idx,
                                         &s.q_num,  &s.q_idx,  &s.full_q_num,  &s.full_q_idx};
  std::vector<int32_t> packed;
  size_t offsets[8];
  for (int i = 0; i < 8; ++i) {
    offsets[i] = packed.size();
    packed.insert(packed.end(), parts[i]->begin(), parts[i]->end());
    while (packed.size() % 4) packed.push_back(0);  // 16-byte aligned tables
  }
  State::Device dev;
  dev.buffer = rt::DeviceBuffer(packed.size() * sizeof(int32_t));
  dev.buffer.upload(packed.data(), packed.size() * sizeof(int32_t));
  const int* base = dev.buffer.as<const int>();
  const int** slots[] = {&dev.tables.kv_num_blocks,      &dev.tables.kv_indices,
                         &dev.tables.full_kv_num_blocks, &dev.tables.full_kv_indices,
                         &dev.tables.q_num_blocks,       &dev.tables.q_indices,
                         &dev.tables.full_q_num_blocks,  &dev.tables.full_q_indices};
  for (int i = 0; i < 8; ++i) *slots[i] = base + offsets[i];
  BlockMaskDeviceTables tables = dev.tables;
  s.devices.emplace(guard.context(), std::move(dev));
  return tables;
}

void BlockMask::fill(FaBlockTables& t) const {
  const State& s = state();
  const BlockMaskDeviceTables d = device_tables();
  t.kv_num_blocks = d.kv_num_blocks;
  t.kv_indices = d.kv_indices;
  t.full_kv_num_blocks = d.full_kv_num_blocks;
  t.full_kv_indices = d.full_kv_indices;
  t.row_stride_h = s.heads == 1 ? 0 : s.nq;
  t.row_stride_b = s.batch == 1 ? 0 : int64_t(s.heads) * s.nq;
  t.num_q_blocks = s.nq;
  t.num_kv_blocks = s.nkv;
  t.q_block = s.q_block;
  t.kv_block = s.kv_block;
}

}  // namespace fa
