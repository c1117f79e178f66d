// fa::ragged_views: validation of ragged / paged calls and the dense-shaped views the kernels take.
#include "fajit/sequences.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fajit/error.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"

namespace fa {
namespace {

// An int32 device table of `rank` dimensions, contiguous along the last.
void check_table(const TensorView& t, const char* name, int rank) {
  if (t.dtype != DType::i32)
    throw Error(fmt::format("{}: dtype must be i32, got {}", name, dtype_name(t.dtype)));
  if (t.rank != rank) throw Error(fmt::format("{}: expected {} dimension(s), got {}", name, rank, t.rank));
  if (t.data == nullptr) throw Error(fmt::format("{}: data pointer is null", name));
  if (reinterpret_cast<uintptr_t>(t.data) % 4 != 0)
    throw Error(fmt::format("{}: data pointer must be 4-byte aligned", name));
  for (int d = 0; d < rank; ++d)
    if (t.shape[d] < 1)
      throw Error(fmt::format("{}: dimension {} must be positive, got {}", name, d, t.shape[d]));
  if (t.stride[rank - 1] != 1 && t.shape[rank - 1] != 1)
    throw Error(fmt::format("{}: must be contiguous (stride 1), got stride {}", name, t.stride[rank - 1]));
  if (rank == 2 && t.stride[0] < t.shape[1])
    throw Error(fmt::format("{}: row stride {} is shorter than a row ({})", name, t.stride[0], t.shape[1]));
}

// The batch every table must agree on: the first table fixes it, the others are checked.
struct Batch {
  int64_t b = -1;
  const char* from = nullptr;
  // A table of n entries (rows) along its first dimension, B + plus of them.
  void agree(int64_t n, int plus, const char* name, const char* what) {
    if (b < 0) {
      b = n - plus, from = name;
    } else if (n - plus != b) {
      throw Error(
          fmt::format("{}: expected {} {} B = {} from {}), got {}", name, b + plus, what, b, from, n));
    }
  }
};

// A row stride the kernels step with 16-byte accesses: a multiple of 8 elements (checked even
// where validate_attention would skip it: a packed dimension of size 1 still strides sequences).
void check_row_stride(const char* name, const char* dim, int64_t stride) {
  if (stride % 8 != 0)
    throw Error(fmt::format("{}: stride of {} must be a multiple of 8 elements (16 bytes), got {}", name, dim,
                            stride));
}

// A packed [total, H, D] tensor as [B, H, max_len, D] with batch stride 0.
TensorView packed_view(const TensorView& t, const char* name, int64_t batch, int64_t max_len) {
  if (t.rank != 3)
    throw Error(fmt::format("{}: a packed tensor has 3 dimensions [total, H, D], got {}", name, t.rank));
  check_row_stride(name, "total", t.stride[0]);
  return TensorView(t.data, t.dtype, {batch, t.shape[1], max_len, t.shape[2]},
                    {0, t.stride[1], t.stride[0], t.stride[2]});
}

// A table's entries on the host (the caller made the stream's writes to it visible).
std::vector<int32_t> download(const TensorView& t) {
  const int64_t n = t.rank == 1 ? t.shape[0] : (t.shape[0] - 1) * t.stride[0] + t.shape[1];
  std::vector<int32_t> host(static_cast<size_t>(n));
  FA_CU(cuMemcpyDtoH, host.data(), reinterpret_cast<CUdeviceptr>(t.data), host.size() * 4);
  return host;
}

// Offsets non-decreasing from >= 0 to at most `total`, no sequence longer than max_len.
void check_offsets(const std::vector<int32_t>& cu, const char* name, int64_t total, const char* rows,
                   int max_len, const char* max_name) {
  if (cu[0] < 0) throw Error(fmt::format("{}: offsets must be non-negative, got {} at 0", name, cu[0]));
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    if (cu[b + 1] < cu[b])
      throw Error(
          fmt::format("{}: offsets must not decrease, got {} then {} at {}", name, cu[b], cu[b + 1], b + 1));
    if (cu[b + 1] - cu[b] > max_len)
      throw Error(fmt::format("{}: sequence {} has {} rows, more than {} ({})", name, b, cu[b + 1] - cu[b],
                              max_name, max_len));
  }
  if (cu.back() > total)
    throw Error(
        fmt::format("{}: last offset {} is past the end of {} ({} rows)", name, cu.back(), rows, total));
}

// lse [Hq, total_q] of packed queries as [B, Hq, max_q] (batch stride 0): `name` is lse or dlse.
TensorView packed_lse_view(const TensorView& lse, const char* name, const TensorView& q, int64_t batch,
                           int64_t max_q) {
  if (lse.rank != 2)
    throw Error(
        fmt::format("{}: packed queries take {} [Hq, total_q], got {} dimensions", name, name, lse.rank));
  if (lse.shape[0] != q.shape[1] || lse.shape[1] != q.shape[0])
    throw Error(fmt::format("{}: expected [Hq, total_q] = [{}, {}], got [{}, {}]", name, q.shape[1],
                            q.shape[0], lse.shape[0], lse.shape[1]));
  // the kernels index a sequence's LSE entries from its first row one by one
  if (lse.stride[1] != 1)
    throw Error(fmt::format("{}: total_q must be contiguous (stride 1), got stride {}", name, lse.stride[1]));
  return TensorView(lse.data, lse.dtype, {batch, lse.shape[0], max_q}, {0, lse.stride[0], 1});
}

// A packed gradient `t` (named `name`) of the packed tensor `like` (named `like_name`): the
// same number of rows.
TensorView packed_like(const TensorView& t, const char* name, const TensorView& like, const char* like_name,
                       const char* total, int64_t batch, int64_t max_len) {
  TensorView view = packed_view(t, name, batch, max_len);
  if (t.shape[0] != like.shape[0])
    throw Error(
        fmt::format("{}: {} must match {} ({}), got {}", name, total, like_name, like.shape[0], t.shape[0]));
  return view;
}

}  // namespace

RaggedGradViews ragged_grad_views(const TensorView& q, const TensorView& k, const TensorView& dout,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const TensorView* dlse, const Sequences& s) {
  if (s.page_table)
    throw Error("page_table: the backward takes packed (cu_seqlens_k) or dense keys, not a paged cache");
  if (s.seqlens_k)
    throw Error(
        "seqlens_k: the backward takes packed (cu_seqlens_k) or dense keys, not a padded cache (every key of "
        "a dense k, v is a key of its sequence)");
  RaggedGradViews r;
  r.has_dlse = dlse != nullptr;
  const int64_t B = s.cu_seqlens_q ? s.cu_seqlens_q->shape[0] - 1 : s.cu_seqlens_k->shape[0] - 1;
  if (s.cu_seqlens_q) {
    r.dout = packed_like(dout, "dout", q, "q", "total_q", B, s.max_seqlen_q);
    r.dq = packed_like(dq, "dq", q, "q", "total_q", B, s.max_seqlen_q);
    if (dlse) r.dlse = packed_lse_view(*dlse, "dlse", q, B, s.max_seqlen_q);
  } else {
    r.dout = dout, r.dq = dq;
    if (dlse) r.dlse = *dlse;
  }
  if (s.cu_seqlens_k) {
    r.dk = packed_like(dk, "dk", k, "k", "total_kv", B, s.max_seqlen_k);
    r.dv = packed_like(dv, "dv", k, "k", "total_kv", B, s.max_seqlen_k);
  } else {
    r.dk = dk, r.dv = dv;
  }
  return r;
}

TensorView ragged_rows_view(const TensorView& t, const char* name, const TensorView& q, const Sequences& s) {
  if (!s.cu_seqlens_q) return t;
  return packed_lse_view(t, name, q, s.cu_seqlens_q->shape[0] - 1, s.max_seqlen_q);
}

RaggedViews ragged_views(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                         const TensorView* lse, const Sequences& s, void* stream) {
  // Each table given: its own checks, and the B it implies agrees with the others'.
  struct Table {
    const TensorView* t;
    const char* name;
    int rank, plus;  // dimensions; first dimension = B + plus
    const char* what;
  };
  Batch batch;
  for (const Table& t : {Table{s.cu_seqlens_q, "cu_seqlens_q", 1, 1, "entries (B+1,"},
                         Table{s.cu_seqlens_k, "cu_seqlens_k", 1, 1, "entries (B+1,"},
                         Table{s.seqlens_k, "seqlens_k", 1, 0, "entries (B,"},
                         Table{s.page_table, "page_table", 2, 0, "rows (B,"}}) {
    if (t.t == nullptr) continue;
    check_table(*t.t, t.name, t.rank);
    batch.agree(t.t->shape[0], t.plus, t.name, t.what);
  }
  if (batch.b < 0)
    throw Error("sequences: no table given (cu_seqlens_q, cu_seqlens_k, seqlens_k or page_table)");
  if (s.max_seqlen_q != 0 && !s.cu_seqlens_q)
    throw Error(fmt::format("max_seqlen_q ({}) is for packed queries: give cu_seqlens_q, or leave it 0",
                            s.max_seqlen_q));
  if (batch.b < 1) throw Error(fmt::format("{}: needs at least one sequence", batch.from));
  if (s.cu_seqlens_k && s.page_table)
    throw Error("cu_seqlens_k and page_table: keys are either packed or paged, give one");
  if (s.page_table && !s.seqlens_k) throw Error("page_table needs seqlens_k (each sequence's key count)");
  if (s.cu_seqlens_k && s.seqlens_k)
    throw Error("cu_seqlens_k and seqlens_k: packed keys take their counts from cu_seqlens_k, give one");
  const int64_t B = batch.b;

  RaggedViews r;
  // Queries: packed, or dense [B, Hq, Lq, D] for the tables' B.
  if (s.cu_seqlens_q) {
    if (s.max_seqlen_q < 1)
      throw Error(fmt::format("max_seqlen_q must be positive with cu_seqlens_q, got {}", s.max_seqlen_q));
    r.q = packed_view(q, "q", B, s.max_seqlen_q);
    r.o = packed_view(o, "o", B, s.max_seqlen_q);
    if (o.shape[0] != q.shape[0])
      throw Error(fmt::format("o: total_q must match q ({}), got {}", q.shape[0], o.shape[0]));
  } else {
    if (q.rank == 4 && q.shape[0] != B)
      throw Error(fmt::format("q: B must match the tables' {} (from {}), got {}", B, batch.from, q.shape[0]));
    r.q = q, r.o = o;
  }
  if (lse) r.lse = ragged_rows_view(*lse, "lse", q, s);
  r.has_lse = lse != nullptr;

  // Keys: packed, paged, or dense (with seqlens_k: a padded cache).
  int64_t num_pages = 0, page_size = 0;
  if (s.cu_seqlens_k) {
    if (s.max_seqlen_k < 1)
      throw Error(fmt::format("max_seqlen_k must be positive with cu_seqlens_k, got {}", s.max_seqlen_k));
    r.k = packed_view(k, "k", B, s.max_seqlen_k);
    r.v = packed_view(v, "v", B, s.max_seqlen_k);
    if (v.shape[0] != k.shape[0])
      throw Error(fmt::format("v: total_kv must match k ({}), got {}", k.shape[0], v.shape[0]));
  } else if (s.page_table) {
    for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}})
      if (t->rank != 4)
        throw Error(fmt::format("{}: a paged pool has 4 dimensions [num_pages, page_size, Hkv, D], got {}",
                                name, t->rank));
    num_pages = k.shape[0], page_size = k.shape[1];
    for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}}) {
      check_row_stride(name, "num_pages", t->stride[0]);
      check_row_stride(name, "page_size", t->stride[1]);
      // the kernels address a row as page * page stride + row * row stride, in 32-bit bytes each
      for (auto [dim, stride] : {std::pair{"num_pages", t->stride[0]}, {"page_size", t->stride[1]}})
        if (std::abs(stride) * dtype_size(t->dtype) > INT32_MAX)
          throw Error(
              fmt::format("{}: stride of {} is {} elements; a paged pool's page and row strides must "
                          "each stay under 2^31 bytes",
                          name, dim, stride));
    }
    if (v.shape[0] != num_pages)
      throw Error(fmt::format("v: num_pages must match k ({}), got {}", num_pages, v.shape[0]));
    if (v.shape[1] != page_size)
      throw Error(fmt::format("v: page_size must match k ({}), got {}", page_size, v.shape[1]));
    if (num_pages > INT32_MAX)
      throw Error(fmt::format("k: num_pages = {} exceeds the int32 range", num_pages));
    if (s.max_seqlen_k < 1)
      throw Error(fmt::format("max_seqlen_k must be positive with a page table, got {}", s.max_seqlen_k));
    const int64_t capacity = s.page_table->shape[1] * page_size;
    if (s.max_seqlen_k > capacity)
      throw Error(fmt::format("max_seqlen_k ({}) exceeds the page table's capacity ({} pages of {} keys)",
                              s.max_seqlen_k, s.page_table->shape[1], page_size));
    // [B, Hkv, max_k, D]: stride_b is the page stride (the kernel gathers rows page by page)
    r.k = TensorView(k.data, k.dtype, {B, k.shape[2], s.max_seqlen_k, k.shape[3]},
                     {k.stride[0], k.stride[2], k.stride[1], k.stride[3]});
    r.v = TensorView(v.data, v.dtype, {B, v.shape[2], s.max_seqlen_k, v.shape[3]},
                     {v.stride[0], v.stride[2], v.stride[1], v.stride[3]});
    r.paged = true;
  } else {
    if (k.rank == 4 && k.shape[0] != B)
      throw Error(fmt::format("k: B must match the tables' {} (from {}), got {}", B, batch.from, k.shape[0]));
    if (s.max_seqlen_k != 0 && k.rank == 4 && s.max_seqlen_k != k.shape[2])
      throw Error(fmt::format("max_seqlen_k: a dense cache holds Lkv = {} keys per sequence, got {}",
                              k.shape[2], s.max_seqlen_k));
    r.k = k, r.v = v;
  }

  if (!s.check_tables) return r;
  // the tables as the stream will see them: whatever it still has queued, once
  rt::ContextGuard guard;
  FA_CU(cuStreamSynchronize, reinterpret_cast<CUstream>(stream));
  if (s.cu_seqlens_q)
    check_offsets(download(*s.cu_seqlens_q), "cu_seqlens_q", q.shape[0], "q", s.max_seqlen_q, "max_seqlen_q");
  if (s.cu_seqlens_k)
    check_offsets(download(*s.cu_seqlens_k), "cu_seqlens_k", k.shape[0], "k", s.max_seqlen_k, "max_seqlen_k");
  if (s.seqlens_k) {
    const std::vector<int32_t> n = download(*s.seqlens_k);
    const int64_t max_k = r.k.shape[2];
    for (size_t b = 0; b < n.size(); ++b)
      if (n[b] < 0 || n[b] > max_k)
        throw Error(fmt::format("seqlens_k: sequence {} has {} keys, outside 0..{}", b, n[b], max_k));
    if (s.page_table) {
      const std::vector<int32_t> pt = download(*s.page_table);
      const int64_t row = s.page_table->stride[0];
      for (size_t b = 0; b < n.size(); ++b)
        for (int64_t j = 0; j * page_size < n[b]; ++j) {
          const int32_t page = pt[static_cast<size_t>(int64_t(b) * row + j)];
          if (page < 0 || page >= num_pages)
            throw Error(fmt::format("page_table: entry [{}][{}] = {} is outside the pool's {} pages", b, j,
                                    page, num_pages));
        }
    }
  }
  return r;
}

}  // namespace fa
