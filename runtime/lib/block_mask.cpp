#include "fajit/block_mask.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include <sys/mman.h>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/params.h"
#include "fajit/runtime/block_mask_builder.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"

namespace fa {

namespace {

// One direction's four tables: num [rows], idx [rows, cols], full_num, full_idx.
struct TableSet {
  std::vector<int32_t> num, idx, full_num, full_idx;
};

}  // namespace

// Only the parameters and `kinds` are set at construction. The host kv and q table sets are
// built on first request (std::call_once; *_ready says a set is complete). Device tables are
// uploaded per context under `mutex`, the kv set and the q set separately; a set whose host
// tables were not requested is streamed to the device from `kinds` without keeping them.
struct BlockMask::State {
  int batch = 1, heads = 1;
  int64_t len_q = 0, len_kv = 0;
  int q_block = 0, kv_block = 0;
  int nq = 0, nkv = 0;
  int q_offset = 0;  // rows of the first query block before query 0 (regrouped_led)
  std::vector<uint8_t> kinds;
  // A regrouped mask's tiles split into 64-row sub-blocks, 2 bits each (params.h,
  // FaBlockTables::kv_sub_kinds), where regrouped() changed q_block to 128, 192 or 256 rows;
  // else empty. Same layout as kinds.
  std::vector<uint8_t> sub_kinds;
  bool matches_mask_mod = false;  // set_matches_mask_mod
  std::once_flag uniform_once;    // regroupable: every tile of one kind
  bool uniform = false;

  std::once_flag kv_once, q_once;
  std::atomic<bool> kv_ready{false}, q_ready{false};
  TableSet kv, q;

  struct Device {
    rt::DeviceBuffer kv_buffer, q_buffer;  // each: num, idx, full_num, full_idx back to back
    rt::DeviceBuffer sub_buffer;           // kv_sub_kinds, with the kv set
    BlockMaskDeviceTables tables;
    const unsigned char* kv_sub_kinds = nullptr;
  };
  // A mask over the caller's device tables (from_device_kv_blocks): the kernels read them in
  // place; `kinds` is filled from one host copy when first needed (ensure_kinds).
  struct DeviceKv {
    CUcontext context = nullptr;
    const int32_t *num = nullptr, *idx = nullptr, *full_num = nullptr, *full_idx = nullptr;
  };
  std::optional<DeviceKv> device_kv;
  // A mask built on the device (from_device_kinds): its kinds and tables there; `kinds` (and a
  // regrouped one's sub_kinds) filled from one copy when first needed (ensure_kinds).
  std::shared_ptr<const DeviceKinds> device_kinds;
  std::once_flag kinds_once;

  std::mutex mutex;
  std::map<CUcontext, Device> devices;
  std::map<std::tuple<int, int, int>, BlockMask> regrouped;  // by (q_block, kv_block, q_offset) (under mutex)
  // A built-on-device mask's, by (q_block, kv_block, stream) (under mutex).
  std::map<std::tuple<int, int, CUstream>, BlockMask> device_regrouped;
};

namespace {

using State = BlockMask::State;

int blocks_for(int64_t len, int block) { return static_cast<int>((len + block - 1) / block); }

std::shared_ptr<State> make_state(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                                  int kv_block) {
  if (batch <= 0 || heads <= 0)
    throw Error(fmt::format("block mask: batch and heads must be positive, got B={}, H={}", batch, heads));
  if (len_q <= 0 || len_kv <= 0)
    throw Error(fmt::format("block mask: lengths must be positive, got Lq={}, Lkv={}", len_q, len_kv));
  if (len_q > INT32_MAX || len_kv > INT32_MAX)
    throw Error(fmt::format("block mask: lengths exceed the int32 range, got Lq={}, Lkv={}", len_q, len_kv));
  if (q_block <= 0 || kv_block <= 0 || q_block % 16 != 0 || kv_block % 16 != 0)
    throw Error(fmt::format("block mask: block sizes must be positive multiples of 16, got {}x{}", q_block,
                            kv_block));
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

// The kinds of the tiles the kv tables of a mask of s's sizes list: partial from kv_num_blocks /
// kv_indices, full from the full_* pair (null: none), the rest empty. Throws on a count outside
// [0, nkv], an index outside [0, nkv) and a tile listed twice, naming the table and the tile.
std::vector<uint8_t> kinds_of_kv_tables(const State& s, const int32_t* num, const int32_t* idx,
                                        const int32_t* full_num, const int32_t* full_idx) {
  const int nq = s.nq, nkv = s.nkv, heads = s.heads;
  const size_t rows = size_t(s.batch) * heads * nq;
  std::vector<uint8_t> kinds(rows * nkv, uint8_t(BlockKind::kEmpty));
  auto place = [&](const char* num_name, const char* idx_name, const int32_t* n, const int32_t* ix,
                   BlockKind kind) {
    for (size_t row = 0; row < rows; ++row) {
      const int b = int(row / (size_t(heads) * nq)), h = int(row / nq % heads), qb = int(row % nq);
      if (n[row] < 0 || n[row] > nkv)
        throw Error(fmt::format("{}: count {} at (b={}, h={}, q-block={}) is outside [0, {}]", num_name,
                                n[row], b, h, qb, nkv));
      for (int i = 0; i < n[row]; ++i) {
        const int32_t kb = ix[row * nkv + i];
        if (kb < 0 || kb >= nkv)
          throw Error(fmt::format("{}: entry {} at (b={}, h={}, q-block={}) is {}, outside [0, {})", idx_name,
                                  i, b, h, qb, kb, nkv));
        uint8_t& k = kinds[row * nkv + kb];
        if (k != uint8_t(BlockKind::kEmpty))
          throw Error(fmt::format("{}: block (b={}, h={}, q-block={}, kv-block={}) is listed twice", idx_name,
                                  b, h, qb, kb));
        k = uint8_t(kind);
      }
    }
  };
  place("kv_num_blocks", "kv_indices", num, idx, BlockKind::kPartial);
  if (full_num) place("full_kv_num_blocks", "full_kv_indices", full_num, full_idx, BlockKind::kFull);
  return kinds;
}

// Makes a device mask's context current for its scope (pushed when another one is).
class InContext {
 public:
  explicit InContext(CUcontext ctx) {
    CUcontext cur = nullptr;
    FA_CU(cuCtxGetCurrent, &cur);
    if (cur != ctx) {
      FA_CU(cuCtxPushCurrent, ctx);
      pushed_ = true;
    }
  }
  ~InContext() {
    CUcontext popped = nullptr;
    if (pushed_) (void)rt::driver().cuCtxPopCurrent(&popped);
  }
  InContext(const InContext&) = delete;
  InContext& operator=(const InContext&) = delete;

 private:
  bool pushed_ = false;
};

// A copy of a device-table mask's tables as they are now, checked into fresh kinds (in the
// tables' own context). cuCtxSynchronize first: the tables may still be being written on any
// stream (inside a CUDA-graph capture this fails: the kernels must not read a copy there).
std::vector<uint8_t> kinds_of_device_tables(const State& s) {
  InContext in_context(s.device_kv->context);
  const State::DeviceKv& d = *s.device_kv;
  const size_t rows = size_t(s.batch) * s.heads * s.nq, cells = rows * size_t(s.nkv);
  std::vector<int32_t> num(rows), idx(cells), full_num, full_idx;
  FA_CU(cuCtxSynchronize);
  auto down = [](std::vector<int32_t>& v, const int32_t* p) {
    FA_CU(cuMemcpyDtoH, v.data(), reinterpret_cast<CUdeviceptr>(p), v.size() * sizeof(int32_t));
  };
  down(num, d.num);
  down(idx, d.idx);
  if (d.full_num) {
    full_num.resize(rows);
    full_idx.resize(cells);
    down(full_num, d.full_num);
    down(full_idx, d.full_idx);
  }
  return kinds_of_kv_tables(s, num.data(), idx.data(), d.full_num ? full_num.data() : nullptr,
                            d.full_num ? full_idx.data() : nullptr);
}

// A built-on-device mask's kinds (and a regrouped one's raw sub-block kinds) into s.kinds /
// s.sub_kinds, one copy after cuCtxSynchronize in its context: they are written on the mask's
// stream, or a regrouping's.
void download_device_kinds(State& s) {
  const BlockMask::DeviceKinds& d = *s.device_kinds;
  InContext in_context(d.context);
  const size_t tiles = size_t(s.batch) * s.heads * s.nq * s.nkv;
  FA_CU(cuCtxSynchronize);
  s.kinds.resize(tiles);
  FA_CU(cuMemcpyDtoH, s.kinds.data(), reinterpret_cast<CUdeviceptr>(d.kinds), tiles);
  if (d.sub_kinds) {
    s.sub_kinds.resize(tiles);
    FA_CU(cuMemcpyDtoH, s.sub_kinds.data(), reinterpret_cast<CUdeviceptr>(d.sub_kinds), tiles);
  }
}

// FAJIT_CHECK_DEVICE_TABLES=1: fill() checks a device-table mask's entries on every call (a copy
// and a sync each time).
bool check_device_tables() {
  const char* v = std::getenv("FAJIT_CHECK_DEVICE_TABLES");
  return v && *v && std::string_view(v) != "0";
}

// Throws unless `ctx` is a device-table mask's own context.
void check_device_kv_context(const State& s, CUcontext ctx) {
  if (ctx != s.device_kv->context)
    throw Error(
        "block mask: its tables are device memory of another CUDA context (from_device_kv_blocks); "
        "use the mask on that device");
}

// s.kinds, filled first for a mask on the device: a snapshot of its tables (checked) or of its
// kinds at the first call that needs them on the host (the kernels read the tables themselves).
const State& ensure_kinds(const State& cs) {
  if (!cs.device_kv && !cs.device_kinds) return cs;
  State& s = const_cast<State&>(cs);
  std::call_once(s.kinds_once, [&] {
    if (s.device_kinds)
      download_device_kinds(s);
    else
      s.kinds = kinds_of_device_tables(s);
  });
  return s;
}

// The first i' in [i, n) with p[i'] != v, or n.
inline int64_t run_end(const uint8_t* p, int64_t i, int64_t n, uint8_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  const uint64_t pattern = 0x0101010101010101ull * v;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (const uint64_t x = w ^ pattern) return i + (__builtin_ctzll(x) >> 3);
  }
#endif
  while (i < n && p[i] == v) ++i;
  return i;
}

// `count` rows of a table set from `count` kinds rows of `cols` bytes: counts into num[i] /
// full_num[i], ascending indices into idx / full_idx row i, walking each row run by run. With
// zero_tail the rows are padded with 0 (else the caller zeroed them).
void generate_rows(const uint8_t* kinds, int64_t count, int cols, int32_t* num, int32_t* idx,
                   int32_t* full_num, int32_t* full_idx, bool zero_tail) {
  for (int64_t r = 0; r < count; ++r) {
    const uint8_t* k = kinds + r * cols;
    int32_t* part = idx + r * cols;
    int32_t* full = full_idx + r * cols;
    int32_t np = 0, nf = 0;
    for (int64_t c = 0; c < cols;) {
      const uint8_t v = k[c];
      const int64_t e = run_end(k, c + 1, cols, v);
      if (v == uint8_t(BlockKind::kPartial)) {
        for (int64_t j = c; j < e; ++j) part[np++] = int32_t(j);
      } else if (v == uint8_t(BlockKind::kFull)) {
        for (int64_t j = c; j < e; ++j) full[nf++] = int32_t(j);
      }
      c = e;
    }
    num[r] = np;
    full_num[r] = nf;
    if (zero_tail) {
      std::memset(part + np, 0, size_t(cols - np) * sizeof(int32_t));
      std::memset(full + nf, 0, size_t(cols - nf) * sizeof(int32_t));
    }
  }
}

// Transposes an 8x8 byte block: x[i] holds row i (byte j = column j, little-endian).
inline void transpose8x8(uint64_t x[8]) {
  auto swap = [](uint64_t& a, uint64_t& b, int shift, uint64_t mask) {
    const uint64_t t = ((a >> shift) ^ b) & mask;
    b ^= t;
    a ^= t << shift;
  };
  for (int i = 0; i < 8; i += 2) swap(x[i], x[i + 1], 8, 0x00FF00FF00FF00FFull);
  for (int i : {0, 1, 4, 5}) swap(x[i], x[i + 2], 16, 0x0000FFFF0000FFFFull);
  for (int i = 0; i < 4; ++i) swap(x[i], x[i + 4], 32, 0x00000000FFFFFFFFull);
}

// The kinds rows a table set is generated from. kv: the rows of `kinds` [g, nq, nkv]. q: its
// columns (the q tables are the kv tables of the transpose), transposed a strip of kStrip kv
// blocks at a time into a small buffer, so no transposed copy of the whole mask is made.
class RowSource {
 public:
  RowSource(const State& s, bool q) : s_(ensure_kinds(s)), q_(q) {
    if (q_) strip_.resize(size_t(std::min(kStrip, s.nkv)) * s.nq);
  }
  int64_t rows() const { return int64_t(s_.batch) * s_.heads * (q_ ? s_.nkv : s_.nq); }
  int cols() const { return q_ ? s_.nq : s_.nkv; }

  // Rows r0, r0 + 1, ...: at least one and at most `want` (fewer at a strip's end); returns
  // how many and points *rows at them.
  int64_t get(int64_t r0, int64_t want, const uint8_t** rows) {
    if (!q_) {
      *rows = s_.kinds.data() + r0 * s_.nkv;
      return want;
    }
    const int nq = s_.nq, nkv = s_.nkv;
    const int64_t g = r0 / nkv;
    const int k0 = int(r0 % nkv);
    const int n = int(std::min<int64_t>({want, int64_t(kStrip), int64_t(nkv - k0)}));
    const uint8_t* src = s_.kinds.data() + g * nq * nkv + k0;  // src[qb * nkv + j]
    uint8_t* dst = strip_.data();                              // dst[j * nq + qb]
    auto scalar = [&](int q_lo, int q_hi, int j_lo, int j_hi) {
      for (int j = j_lo; j < j_hi; ++j)
        for (int qb = q_lo; qb < q_hi; ++qb) dst[int64_t(j) * nq + qb] = src[int64_t(qb) * nkv + j];
    };
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const int q8 = nq & ~7, n8 = n & ~7;  // 8x8 blocks, then the tails
    for (int qb = 0; qb < q8; qb += 8)
      for (int j = 0; j < n8; j += 8) {
        uint64_t x[8];
        for (int i = 0; i < 8; ++i) std::memcpy(&x[i], src + int64_t(qb + i) * nkv + j, 8);
        transpose8x8(x);
        for (int i = 0; i < 8; ++i) std::memcpy(dst + int64_t(j + i) * nq + qb, &x[i], 8);
      }
    scalar(q8, nq, 0, n);
    scalar(0, q8, n8, n);
#else
    scalar(0, nq, 0, n);
#endif
    *rows = dst;
    return n;
  }

 private:
  static constexpr int kStrip = 64;
  const State& s_;
  bool q_;
  std::vector<uint8_t> strip_;
};

// v.resize(n) on an empty v; large fresh allocations are faulted in with one madvise call
// (MADV_POPULATE_WRITE, Linux 5.14) rather than page by page.
void sized_zeroed(std::vector<int32_t>& v, size_t n) {
#ifdef MADV_POPULATE_WRITE
  constexpr size_t kPage = 4096;
  if (n * sizeof(int32_t) >= (size_t(1) << 20)) {
    v.reserve(n);
    const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    const uintptr_t lo = (p + kPage - 1) & ~(kPage - 1), hi = (p + n * sizeof(int32_t)) & ~(kPage - 1);
    if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
  }
#endif
  v.resize(n);
}

void build_host(TableSet& t, RowSource src) {
  const int64_t rows = src.rows();
  const int cols = src.cols();
  t.num.resize(rows);
  t.full_num.resize(rows);
  sized_zeroed(t.idx, size_t(rows) * cols);  // zeroed: the padding
  sized_zeroed(t.full_idx, size_t(rows) * cols);
  for (int64_t r0 = 0; r0 < rows;) {
    const uint8_t* k;
    const int64_t n = src.get(r0, rows - r0, &k);
    generate_rows(k, n, cols, t.num.data() + r0, t.idx.data() + r0 * cols, t.full_num.data() + r0,
                  t.full_idx.data() + r0 * cols, /*zero_tail=*/false);
    r0 += n;
  }
}

const TableSet& kv_tables(const State& cs) {
  State& s = const_cast<State&>(cs);
  std::call_once(s.kv_once, [&] {
    build_host(s.kv, RowSource(s, /*q=*/false));
    s.kv_ready.store(true, std::memory_order_release);
  });
  return s.kv;
}

const TableSet& q_tables(const State& cs) {
  State& s = const_cast<State&>(cs);
  std::call_once(s.q_once, [&] {
    build_host(s.q, RowSource(s, /*q=*/true));
    s.q_ready.store(true, std::memory_order_release);
  });
  return s.q;
}

constexpr size_t kSingleUploadBytes = size_t(1) << 20;

// Uploads one table set into a new buffer: from the host tables when they exist, else
// generated from the kinds through a staging buffer (the whole set when it is small, else
// chunks of rows). Returns the four device addresses.
void upload_set(rt::DeviceBuffer& buf, const TableSet* host, RowSource src, const int** out) {
  const int64_t rows = src.rows();
  const int cols = src.cols();
  auto pad = [](size_t n) { return (n + 3) / 4 * 4; };  // int32 entries -> 16-byte aligned
  const size_t cells = size_t(rows) * cols;
  const size_t at_num = 0, at_idx = pad(rows), at_full_num = at_idx + pad(cells),
               at_full_idx = at_full_num + pad(rows), total = at_full_idx + pad(cells);
  buf = rt::DeviceBuffer(total * sizeof(int32_t), "the block mask's tables");
  constexpr size_t kI = sizeof(int32_t);
  if (total * kI <= kSingleUploadBytes) {  // small: one staging buffer, one upload
    std::vector<int32_t> stage(total);     // zeroed: the padding
    if (host) {
      std::copy(host->num.begin(), host->num.end(), stage.begin() + at_num);
      std::copy(host->idx.begin(), host->idx.end(), stage.begin() + at_idx);
      std::copy(host->full_num.begin(), host->full_num.end(), stage.begin() + at_full_num);
      std::copy(host->full_idx.begin(), host->full_idx.end(), stage.begin() + at_full_idx);
    } else {
      for (int64_t r0 = 0; r0 < rows;) {
        const uint8_t* k;
        const int64_t n = src.get(r0, rows - r0, &k);
        generate_rows(k, n, cols, stage.data() + at_num + r0, stage.data() + at_idx + r0 * cols,
                      stage.data() + at_full_num + r0, stage.data() + at_full_idx + r0 * cols,
                      /*zero_tail=*/false);
        r0 += n;
      }
    }
    buf.upload(stage.data(), total * kI);
  } else if (host) {
    buf.upload(host->num.data(), rows * kI, at_num * kI);
    buf.upload(host->idx.data(), cells * kI, at_idx * kI);
    buf.upload(host->full_num.data(), rows * kI, at_full_num * kI);
    buf.upload(host->full_idx.data(), cells * kI, at_full_idx * kI);
  } else {
    // ~256 KiB of each index table per upload (H200 host, fill at 128k: 1.05-1.09 ms; 1 MiB
    // chunks 1.16-1.18 ms, 4 MiB 1.5-1.8 ms).
    const int64_t chunk = std::max<int64_t>(1, (int64_t(1) << 16) / cols);
    std::vector<int32_t> num(rows), full_num(rows), stage(size_t(2 * chunk) * cols);
    int32_t* part = stage.data();
    int32_t* full = stage.data() + size_t(chunk) * cols;
    for (int64_t r0 = 0; r0 < rows;) {
      const uint8_t* k;
      const int64_t n = src.get(r0, std::min(chunk, rows - r0), &k);
      generate_rows(k, n, cols, num.data() + r0, part, full_num.data() + r0, full,
                    /*zero_tail=*/true);
      const size_t bytes = size_t(n) * cols * kI;
      buf.upload(part, bytes, (at_idx + size_t(r0) * cols) * kI);
      buf.upload(full, bytes, (at_full_idx + size_t(r0) * cols) * kI);
      r0 += n;
    }
    buf.upload(num.data(), rows * kI, at_num * kI);
    buf.upload(full_num.data(), rows * kI, at_full_num * kI);
  }
  const int* base = buf.as<const int>();
  out[0] = base + at_num;
  out[1] = base + at_idx;
  out[2] = base + at_full_num;
  out[3] = base + at_full_idx;
}

// kv_sub_kinds as the kernel reads it: row r's entry i is the sub-block kinds of the row's
// i-th partial tile (kv_indices' order: ascending), 0 after the last.
std::vector<uint8_t> partial_sub_kinds(const State& s) {
  std::vector<uint8_t> out(s.sub_kinds.size(), 0);
  const int64_t rows = int64_t(s.sub_kinds.size()) / s.nkv;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* k = s.kinds.data() + r * s.nkv;
    const uint8_t* sub = s.sub_kinds.data() + r * s.nkv;
    uint8_t* o = out.data() + r * s.nkv;
    for (int j = 0; j < s.nkv; ++j)
      if (k[j] == uint8_t(BlockKind::kPartial)) *o++ = sub[j];
  }
  return out;
}

// The device tables in the current context: the kv set always (with kv_sub_kinds where the
// mask has them), the q set when with_q.
BlockMaskDeviceTables device_tables_of(const State& cs, bool with_q, const unsigned char** sub = nullptr) {
  State& s = const_cast<State&>(cs);
  rt::ContextGuard guard;
  if (s.device_kinds) {  // every table built with the mask
    if (guard.context() != s.device_kinds->context)
      throw Error("block mask: it was built on the device of another CUDA context; use it on that device");
    if (sub) *sub = s.device_kinds->kv_sub_kinds;
    return s.device_kinds->tables;
  }
  if (s.device_kv) check_device_kv_context(s, guard.context());
  std::lock_guard<std::mutex> lock(s.mutex);
  State::Device& dev = s.devices[guard.context()];
  if (s.device_kv) {  // the caller's tables, in place
    dev.tables.kv_num_blocks = s.device_kv->num;
    dev.tables.kv_indices = s.device_kv->idx;
    dev.tables.full_kv_num_blocks = s.device_kv->full_num;
    dev.tables.full_kv_indices = s.device_kv->full_idx;
  }
  try {
    if (!s.device_kv && !dev.kv_buffer) {
      const int* p[4];
      const bool ready = s.kv_ready.load(std::memory_order_acquire);
      rt::DeviceBuffer buf;
      upload_set(buf, ready ? &s.kv : nullptr, RowSource(s, /*q=*/false), p);
      dev.kv_buffer = std::move(buf);
      dev.tables.kv_num_blocks = p[0];
      dev.tables.kv_indices = p[1];
      dev.tables.full_kv_num_blocks = p[2];
      dev.tables.full_kv_indices = p[3];
      if (!s.sub_kinds.empty()) {
        dev.sub_buffer = rt::DeviceBuffer(s.sub_kinds.size(), "the block mask's sub-block kinds");
        const std::vector<uint8_t> sub = partial_sub_kinds(s);
        dev.sub_buffer.upload(sub.data(), sub.size());
        dev.kv_sub_kinds = dev.sub_buffer.as<const unsigned char>();
      }
    }
    if (with_q && !dev.q_buffer) {
      const int* p[4];
      const bool ready = s.q_ready.load(std::memory_order_acquire);
      rt::DeviceBuffer buf;
      upload_set(buf, ready ? &s.q : nullptr, RowSource(s, /*q=*/true), p);
      dev.q_buffer = std::move(buf);
      dev.tables.q_num_blocks = p[0];
      dev.tables.q_indices = p[1];
      dev.tables.full_q_num_blocks = p[2];
      dev.tables.full_q_indices = p[3];
    }
  } catch (...) {
    if (!dev.kv_buffer && !dev.q_buffer) s.devices.erase(guard.context());
    throw;
  }
  if (sub) *sub = dev.kv_sub_kinds;
  return dev.tables;
}

// Throws unless every kind is 0, 1 or 2 (a vectorisable max per chunk; the index on failure).
void check_kinds(const std::vector<uint8_t>& kinds) {
  const uint8_t* p = kinds.data();
  const size_t n = kinds.size();
  constexpr size_t kChunk = 4096;
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t e = std::min(n, i + kChunk);
    uint8_t m = 0;
    for (size_t j = i; j < e; ++j) m = std::max(m, p[j]);
    if (m <= uint8_t(BlockKind::kFull)) continue;
    for (size_t j = i; j < e; ++j)
      if (p[j] > uint8_t(BlockKind::kFull))
        throw Error(fmt::format("block mask: block kind {} at index {} is not 0, 1 or 2", int(p[j]), j));
  }
}

}  // namespace

BlockMask BlockMask::from_kinds(int batch, int heads, int64_t len_q, int64_t len_kv,
                                const std::vector<uint8_t>& kinds, int q_block, int kv_block) {
  return from_kinds(batch, heads, len_q, len_kv, std::vector<uint8_t>(kinds), q_block, kv_block);
}

BlockMask BlockMask::from_kinds(int batch, int heads, int64_t len_q, int64_t len_kv,
                                std::vector<uint8_t>&& kinds, int q_block, int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  const size_t want = size_t(batch) * heads * s->nq * s->nkv;
  if (kinds.size() != want)
    throw Error(fmt::format("block mask: expected {} block kinds [Bm={}, Hm={}, {}, {}], got {}", want, batch,
                            heads, s->nq, s->nkv, kinds.size()));
  check_kinds(kinds);
  s->kinds = std::move(kinds);
  return BlockMask(std::move(s));
}

BlockMask BlockMask::all_full(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                              int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  s->kinds.assign(size_t(batch) * heads * s->nq * s->nkv, uint8_t(BlockKind::kFull));
  return BlockMask(std::move(s));
}

BlockMask BlockMask::from_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                    const std::vector<int32_t>& kv_num_blocks,
                                    const std::vector<int32_t>& kv_indices,
                                    const std::vector<int32_t>& full_kv_num_blocks,
                                    const std::vector<int32_t>& full_kv_indices, int q_block, int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  const int nq = s->nq, nkv = s->nkv;
  const size_t rows = size_t(batch) * heads * nq;
  auto check_size = [&](const char* name, const std::vector<int32_t>& v, size_t want) {
    if (v.size() != want)
      throw Error(fmt::format("{}: expected {} entries [Bm={}, Hm={}, {}{}], got {}", name, want, batch,
                              heads, nq, want == rows ? "" : fmt::format(", {}", nkv), v.size()));
  };
  check_size("kv_num_blocks", kv_num_blocks, rows);
  check_size("kv_indices", kv_indices, rows * nkv);
  const bool has_full = !full_kv_num_blocks.empty() || !full_kv_indices.empty();
  if (has_full) {
    check_size("full_kv_num_blocks", full_kv_num_blocks, rows);
    check_size("full_kv_indices", full_kv_indices, rows * nkv);
  }
  s->kinds = kinds_of_kv_tables(*s, kv_num_blocks.data(), kv_indices.data(),
                                has_full ? full_kv_num_blocks.data() : nullptr,
                                has_full ? full_kv_indices.data() : nullptr);
  return BlockMask(std::move(s));
}

BlockMask BlockMask::from_device_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                           const int32_t* kv_num_blocks, const int32_t* kv_indices,
                                           const int32_t* full_kv_num_blocks, const int32_t* full_kv_indices,
                                           int q_block, int kv_block) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  if (!kv_num_blocks || !kv_indices)
    throw Error("block mask: kv_num_blocks and kv_indices are required (device tables)");
  if (!full_kv_num_blocks != !full_kv_indices)
    throw Error("block mask: full_kv_num_blocks and full_kv_indices go together (both or neither)");
  rt::ContextGuard guard;
  s->device_kv =
      State::DeviceKv{guard.context(), kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices};
  return BlockMask(std::move(s));
}

bool BlockMask::on_device() const { return state().device_kv.has_value(); }

bool BlockMask::built_on_device() const { return state().device_kinds != nullptr; }

BlockMask BlockMask::from_device_kinds(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                                       int kv_block, std::shared_ptr<const DeviceKinds> kinds) {
  auto s = make_state(batch, heads, len_q, len_kv, q_block, kv_block);
  if (!kinds || !kinds->kinds) throw Error("block mask: no device kinds");
  s->device_kinds = std::move(kinds);
  return BlockMask(std::move(s));
}

BlockMask BlockMask::host_copy() const {
  const State& s = state();
  if (!s.device_kv && !s.device_kinds) return *this;
  BlockMask m =
      from_kinds(s.batch, s.heads, s.len_q, s.len_kv,
                 s.device_kv ? kinds_of_device_tables(s) : ensure_kinds(s).kinds, s.q_block, s.kv_block);
  m.state_->matches_mask_mod = s.matches_mask_mod;
  return m;
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
const std::vector<uint8_t>& BlockMask::kinds() const { return ensure_kinds(state()).kinds; }
const std::vector<uint8_t>& BlockMask::sub_kinds() const { return ensure_kinds(state()).sub_kinds; }
const std::vector<int32_t>& BlockMask::kv_num_blocks() const { return kv_tables(state()).num; }
const std::vector<int32_t>& BlockMask::kv_indices() const { return kv_tables(state()).idx; }
const std::vector<int32_t>& BlockMask::full_kv_num_blocks() const { return kv_tables(state()).full_num; }
const std::vector<int32_t>& BlockMask::full_kv_indices() const { return kv_tables(state()).full_idx; }
const std::vector<int32_t>& BlockMask::q_num_blocks() const { return q_tables(state()).num; }
const std::vector<int32_t>& BlockMask::q_indices() const { return q_tables(state()).idx; }
const std::vector<int32_t>& BlockMask::full_q_num_blocks() const { return q_tables(state()).full_num; }
const std::vector<int32_t>& BlockMask::full_q_indices() const { return q_tables(state()).full_idx; }

bool BlockMask::matches_mask_mod() const { return state().matches_mask_mod; }

bool BlockMask::regroupable() const {
  const State& s = state();
  if (s.matches_mask_mod) return true;
  if (s.device_kv || s.device_kinds) return false;  // its kinds would cost a copy and a sync: not asked for
  std::call_once(state_->uniform_once, [&] {
    state_->uniform = std::all_of(s.kinds.begin(), s.kinds.end(), [&](uint8_t k) { return k == s.kinds[0]; });
  });
  return s.uniform;
}

BlockMask& BlockMask::set_matches_mask_mod(bool matches) {
  state();  // throws for an empty mask
  state_->matches_mask_mod = matches;
  return *this;
}

namespace {

// A mask regrouped with its first block before query 0 (regrouped_led) is the persistent forward's
// own: never regrouped again.
void refuse_led(const State& s) {
  if (s.q_offset != 0)
    throw Error("block mask: a mask regrouped with its first block before query 0 is not regrouped again");
}

// Throws unless a mask of s's blocks may be regrouped into q_block x kv_block (`regroupable`: its
// blocks may merge).
void check_regroup_of(const State& s, bool regroupable, int q_block, int kv_block) {
  if (s.device_kv)  // a kept regrouping would be a snapshot the kernels read after the tables changed
    throw Error(fmt::format(
        "block mask: its tables are on the device (from_device_kv_blocks), so its {}x{} blocks are not "
        "regrouped into {}x{}; regroup a host_copy() (the tables as they are now)",
        s.q_block, s.kv_block, q_block, kv_block));
  // Splitting blocks (each new one inside one source block) keeps every tile's kind whatever the
  // tables say: a full block's parts are full, an empty one's empty, a partial one's partial.
  const bool splits = q_block > 0 && kv_block > 0 && s.q_block % q_block == 0 && s.kv_block % kv_block == 0;
  if (!splits && !regroupable)
    throw Error(fmt::format(
        "block mask: its {}x{} blocks can be regrouped into {}x{} only when the tables agree with mask_mod "
        "(a mask built by Kernel::block_mask or create_block_mask) or hold one kind of tile; given tables, "
        "build them with blocks {}x{}",
        s.q_block, s.kv_block, q_block, kv_block, q_block, kv_block));
}

// How many 64-row sub-blocks (the Hopper forward's consumer warpgroups) a mask of s's blocks
// regrouped along q into q_block rows (its first block starting q_offset rows early) keeps kinds
// of (0: none).
int sub_blocks(const State& s, int q_block, int q_offset = 0) {
  const int n = q_block / 64;
  return (q_block != s.q_block || q_offset != 0) && q_block % 64 == 0 && n >= 2 && n <= 4 ? n : 0;
}

}  // namespace

BlockMask BlockMask::regrouped_now(int q_block, int kv_block, Stream stream) const {
  const State& s = state();
  if (!s.device_kinds || (q_block == s.q_block && kv_block == s.kv_block))
    return regrouped(q_block, kv_block);
  check_regroup_of(s, regroupable(), q_block, kv_block);
  auto r = make_state(s.batch, s.heads, s.len_q, s.len_kv, q_block, kv_block);
  r->matches_mask_mod = s.matches_mask_mod;
  r->device_kinds =
      rt::regroup_device_kinds(*s.device_kinds, s.batch * s.heads, s.len_q, s.len_kv, s.q_block, s.kv_block,
                               q_block, kv_block, sub_blocks(s, q_block), reinterpret_cast<CUstream>(stream));
  return BlockMask(std::move(r));
}

const BlockMask& BlockMask::regrouped(int q_block, int kv_block) const {
  const State& s = state();
  return regrouped(q_block, kv_block,
                   s.device_kinds ? reinterpret_cast<Stream>(s.device_kinds->stream) : nullptr);
}

const BlockMask& BlockMask::regrouped(int q_block, int kv_block, Stream stream) const {
  const State& s = state();
  refuse_led(s);
  if (q_block == s.q_block && kv_block == s.kv_block) return *this;
  check_regroup_of(s, regroupable(), q_block, kv_block);
  if (s.device_kinds) {  // on the device, once per stream: later uses there are ordered after it
    if (rt::stream_is_capturing(reinterpret_cast<CUstream>(stream)))
      throw Error(
          "block mask: a mask built on the device is not kept regrouped from inside a CUDA-graph capture; "
          "use regrouped_now()");
    std::lock_guard<std::mutex> lock(state_->mutex);
    const auto key = std::make_tuple(q_block, kv_block, reinterpret_cast<CUstream>(stream));
    if (auto it = state_->device_regrouped.find(key); it != state_->device_regrouped.end()) return it->second;
    return state_->device_regrouped.emplace(key, regrouped_now(q_block, kv_block, stream)).first->second;
  }
  return regrouped_on_host(q_block, kv_block, 0);
}

const BlockMask& BlockMask::regrouped_led(int q_block, int kv_block, int q_offset) const {
  const State& s = state();
  if (q_offset == 0) return regrouped(q_block, kv_block);
  if (q_offset < 0 || q_offset % 64 != 0 || q_offset >= q_block)
    throw Error(
        fmt::format("block mask: a first block's q offset must be a multiple of 64 below the block's {} "
                    "rows, got {}",
                    q_block, q_offset));
  refuse_led(s);
  if (s.device_kinds)
    throw Error(
        "block mask: a mask built on the device is not regrouped with a q offset (its kinds are there)");
  check_regroup_of(s, regroupable(), q_block, kv_block);
  // Shifted, the new blocks straddle the source's even where q_block divides them: a merge.
  if (!regroupable())
    throw Error(
        fmt::format("block mask: its {}x{} blocks can be regrouped with a q offset only when the tables "
                    "agree with mask_mod "
                    "(a mask built by Kernel::block_mask or create_block_mask) or hold one kind of tile",
                    s.q_block, s.kv_block));
  return regrouped_on_host(q_block, kv_block, q_offset);
}

int BlockMask::q_offset() const { return state().q_offset; }

const BlockMask& BlockMask::regrouped_on_host(int q_block, int kv_block, int q_offset) const {
  const State& s = state();
  std::lock_guard<std::mutex> lock(state_->mutex);
  const std::tuple<int, int, int> key{q_block, kv_block, q_offset};
  if (auto it = state_->regrouped.find(key); it != state_->regrouped.end()) return it->second;
  auto r = make_state(s.batch, s.heads, s.len_q, s.len_kv, q_block, kv_block);
  r->matches_mask_mod = s.matches_mask_mod;
  r->q_offset = q_offset;
  r->nq = blocks_for(s.len_q + q_offset, q_block);
  // 64-row sub-blocks (the Hopper forward's consumer warpgroups) of blocks regrouped along q:
  // kinds of their own, so a warpgroup skips a tile its rows do not see (rows before 0 or past
  // len_q see nothing).
  const int n_sub = sub_blocks(s, q_block, q_offset);
  // The source blocks [first, last] a new block of `block` overlaps along one axis, the new
  // blocks starting `lead` positions before 0 (positions outside [0, len) are not part of any
  // tile; a new block always holds some).
  auto span = [](int i, int block, int64_t len, int source, int lead = 0) {
    const int64_t start = int64_t(i) * block - lead;
    const int64_t p0 = std::max<int64_t>(start, 0), p1 = std::min<int64_t>(start + block, len) - 1;
    return std::pair<int, int>{int(p0 / source), int(p1 / source)};
  };
  std::vector<std::pair<int, int>> cols(size_t(r->nkv));
  for (int j = 0; j < r->nkv; ++j) cols[size_t(j)] = span(j, kv_block, s.len_kv, s.kv_block);
  const int64_t groups = int64_t(s.batch) * s.heads;
  r->kinds.resize(size_t(groups) * r->nq * r->nkv);  // every tile written below
  // The join of the source tiles over rows [first, last] of the source blocks, new column j.
  auto join_of = [&](int64_t g, int first, int last, int j) {
    const uint8_t* src = s.kinds.data() + (g * s.nq + first) * s.nkv;
    uint8_t join = src[cols[size_t(j)].first];
    for (int qb = first; qb <= last; ++qb, src += s.nkv)
      for (int kb = cols[size_t(j)].first; kb <= cols[size_t(j)].second; ++kb)
        if (src[kb] != join) join = uint8_t(BlockKind::kPartial);
    return join;
  };
  const bool with_sub = n_sub > 0;
  constexpr int kSub = 64;
  if (with_sub) r->sub_kinds.resize(r->kinds.size());
  for (int64_t g = 0; g < groups; ++g)
    for (int i = 0; i < r->nq; ++i) {
      const auto [first, last] = span(i, q_block, s.len_q, s.q_block, q_offset);
      uint8_t* out = r->kinds.data() + (g * r->nq + i) * r->nkv;
      for (int j = 0; j < r->nkv; ++j) out[j] = join_of(g, first, last, j);
      if (!with_sub) continue;
      uint8_t* sub = r->sub_kinds.data() + (g * r->nq + i) * r->nkv;
      for (int c = 0; c < n_sub; ++c) {
        const int64_t row0 = int64_t(i) * q_block - q_offset + int64_t(c) * kSub;
        if (row0 < 0 || row0 >= s.len_q) continue;  // kFaBlockEmpty
        const auto [sf, sl] = span(int(row0 / kSub), kSub, s.len_q, s.q_block);
        for (int j = 0; j < r->nkv; ++j) sub[j] |= uint8_t(join_of(g, sf, sl, j) << (2 * c));
      }
    }
  return state_->regrouped.emplace(key, BlockMask(std::move(r))).first->second;
}

BlockKind BlockMask::kind(int b, int h, int q_blk, int kv_blk) const {
  const State& s = ensure_kinds(state());
  if (b < 0 || b >= s.batch || h < 0 || h >= s.heads || q_blk < 0 || q_blk >= s.nq || kv_blk < 0 ||
      kv_blk >= s.nkv)
    throw Error(
        fmt::format("block mask: block (b={}, h={}, q-block={}, kv-block={}) is outside "
                    "[{}, {}, {}, {}]",
                    b, h, q_blk, kv_blk, s.batch, s.heads, s.nq, s.nkv));
  return BlockKind(s.kinds[((int64_t(b) * s.heads + h) * s.nq + q_blk) * s.nkv + kv_blk]);
}

BlockMaskDensity BlockMask::density() const {
  const State& s = ensure_kinds(state());
  BlockMaskDensity d;
  for (uint8_t k : s.kinds) {
    if (k == uint8_t(BlockKind::kFull))
      ++d.full;
    else if (k == uint8_t(BlockKind::kPartial))
      ++d.partial;
    else
      ++d.empty;
  }
  const int64_t all = d.full + d.partial + d.empty;
  d.fraction = all ? double(d.full + d.partial) / double(all) : 0.0;
  return d;
}

std::string BlockMask::to_string(int b, int h) const {
  const State& s = ensure_kinds(state());
  (void)kind(b, h, 0, 0);  // range check
  const BlockMaskDensity d = density();
  std::string out = fmt::format(
      "BlockMask(B={}, H={}, Lq={}, Lkv={}, block={}x{}, density={:.3f}: {} full, {} partial, "
      "{} empty) b={} h={}\n",
      s.batch, s.heads, s.len_q, s.len_kv, s.q_block, s.kv_block, d.fraction, d.full, d.partial, d.empty, b,
      h);
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
    throw Error(fmt::format("block mask was built for Lq={}, Lkv={}; got Lq={}, Lkv={}", s.len_q, s.len_kv,
                            len_q, len_kv));
  if (s.batch != 1 && s.batch != batch)
    throw Error(
        fmt::format("block mask was built for B={}; got B={} (expected 1 or {})", s.batch, batch, batch));
  if (s.heads != 1 && s.heads != heads)
    throw Error(
        fmt::format("block mask was built for H={}; got H={} (expected 1 or {})", s.heads, heads, heads));
}

BlockMaskDeviceTables BlockMask::device_tables() const { return device_tables_of(state(), /*with_q=*/true); }

void BlockMask::fill(FaBlockTables& t) const {
  const State& s = state();
  if (s.device_kv && check_device_tables())  // FAJIT_CHECK_DEVICE_TABLES=1: their entries, every call
    (void)kinds_of_device_tables(s);
  const unsigned char* sub = nullptr;
  const BlockMaskDeviceTables d = device_tables_of(s, /*with_q=*/false, &sub);
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
  t.kv_sub_kinds = sub;
  t.q_offset = s.q_offset;
}

void BlockMask::fill_transposed(FaBlockTables& t) const {
  const State& s = state();
  if (s.q_offset != 0)  // its columns would be query blocks before query 0: the forward's own
    throw Error("block mask: a mask regrouped with its first block before query 0 has no transposed tables");
  const BlockMaskDeviceTables d = device_tables_of(s, /*with_q=*/true);
  t.kv_num_blocks = d.q_num_blocks;
  t.kv_indices = d.q_indices;
  t.full_kv_num_blocks = d.full_q_num_blocks;
  t.full_kv_indices = d.full_q_indices;
  t.row_stride_h = s.heads == 1 ? 0 : s.nkv;
  t.row_stride_b = s.batch == 1 ? 0 : int64_t(s.heads) * s.nkv;
  t.num_q_blocks = s.nkv;  // rows: KV blocks
  t.num_kv_blocks = s.nq;  // columns: query blocks
  t.q_block = s.kv_block;
  t.kv_block = s.q_block;
  t.kv_sub_kinds = nullptr;
  t.q_offset = 0;
}

}  // namespace fa
