#include "fajit/tensor.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fajit/error.h"

namespace fa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "unknown";
}

int dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8:
    case DType::boolean: return 1;
  }
  return 1;
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_)
    : data(data_), dtype(dtype_) {
  if (shape_.size() > static_cast<size_t>(kMaxTensorRank))
    throw Error(fmt::format("tensor view: at most {} dimensions are supported, got {}", kMaxTensorRank,
                            shape_.size()));
  rank = static_cast<int>(shape_.size());
  int i = 0;
  for (int64_t s : shape_) shape[i++] = s;
  int64_t running = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[d] = running;
    running *= shape[d] > 0 ? shape[d] : 1;
  }
}

TensorView::TensorView(void* data_, DType dtype_, std::initializer_list<int64_t> shape_,
                       std::initializer_list<int64_t> strides_)
    : TensorView(data_, dtype_, shape_) {
  if (strides_.size() != shape_.size())
    throw Error(
        fmt::format("tensor view: {} strides given for {} dimensions", strides_.size(), shape_.size()));
  int i = 0;
  for (int64_t s : strides_) stride[i++] = s;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

std::string TensorView::to_string() const {
  std::string dims, strides;
  for (int d = 0; d < rank; ++d) {
    dims += fmt::format("{}{}", d ? ", " : "", shape[d]);
    strides += fmt::format("{}{}", d ? ", " : "", stride[d]);
  }
  return fmt::format("{}[{}] strides [{}]", dtype_name(dtype), dims, strides);
}

namespace {

constexpr int kRowBytes = 16;  // vectorised loads: every row starts on a 16-byte boundary

struct Named {
  const char* tensor;  // "q"
  const TensorView& t;
  const char* const* dims;  // {"B", "Hq", "Lq", "Dqk"}
  int rank;
};

std::string dim_list(const Named& n) {
  std::string s = "[";
  for (int d = 0; d < n.rank; ++d) s += fmt::format("{}{}", d ? ", " : "", n.dims[d]);
  return s + "]";
}

// Rank, pointer, sizes and strides of one tensor on its own.
void check_basic(const Named& n) {
  const TensorView& t = n.t;
  if (t.rank != n.rank)
    throw Error(fmt::format("{}: expected {} dimensions {}, got {}", n.tensor, n.rank, dim_list(n), t.rank));
  if (!t.data) throw Error(fmt::format("{}: data pointer is null", n.tensor));
  for (int d = 0; d < n.rank; ++d) {
    if (t.shape[d] <= 0)
      throw Error(fmt::format("{}: {} must be positive, got {}", n.tensor, n.dims[d], t.shape[d]));
    if (t.shape[d] > INT_MAX)
      throw Error(fmt::format("{}: {} = {} exceeds the int32 range", n.tensor, n.dims[d], t.shape[d]));
  }
  for (int d = 0; d < n.rank; ++d) {
    if (t.stride[d] < 0)
      throw Error(
          fmt::format("{}: stride of {} must be non-negative, got {}", n.tensor, n.dims[d], t.stride[d]));
  }
  const int last = n.rank - 1;
  if (t.stride[last] != 1 && t.shape[last] != 1)
    throw Error(fmt::format("{}: last dimension ({}) must be contiguous (stride 1), got stride {}", n.tensor,
                            n.dims[last], t.stride[last]));
}

void check_same(const Named& n, int d, const Named& ref, int ref_d) {
  if (n.t.shape[d] != ref.t.shape[ref_d])
    throw Error(fmt::format("{}: {} must match {} ({}), got {}", n.tensor, n.dims[d], ref.tensor,
                            ref.t.shape[ref_d], n.t.shape[d]));
}

// 16-byte aligned base and rows: pointer, head dim and the strides of every dimension that
// has more than one entry.
void check_rows_aligned(const Named& n) {
  const TensorView& t = n.t;
  const int elem = dtype_size(t.dtype);
  const int per_row = kRowBytes / elem;
  if (reinterpret_cast<uintptr_t>(t.data) % kRowBytes != 0)
    throw Error(fmt::format("{}: data pointer must be {}-byte aligned", n.tensor, kRowBytes));
  const int last = n.rank - 1;
  if (t.shape[last] % per_row != 0)
    throw Error(fmt::format("{}: {} must be a multiple of {} for {}-byte rows, got {}", n.tensor,
                            n.dims[last], per_row, kRowBytes, t.shape[last]));
  for (int d = 0; d < last; ++d) {
    if (t.shape[d] > 1 && t.stride[d] % per_row != 0)
      throw Error(fmt::format("{}: stride of {} must be a multiple of {} elements ({} bytes), got {}",
                              n.tensor, n.dims[d], per_row, kRowBytes, t.stride[d]));
  }
}

}  // namespace

AttentionShape validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& o, const TensorView* lse) {
  static const char* const kQ[] = {"B", "Hq", "Lq", "Dqk"};
  static const char* const kK[] = {"B", "Hkv", "Lkv", "Dqk"};
  static const char* const kV[] = {"B", "Hkv", "Lkv", "Dv"};
  static const char* const kO[] = {"B", "Hq", "Lq", "Dv"};
  static const char* const kLse[] = {"B", "Hq", "Lq"};
  const Named nq{"q", q, kQ, 4}, nk{"k", k, kK, 4}, nv{"v", v, kV, 4}, no{"o", o, kO, 4};

  check_basic(nq);
  check_basic(nk);
  check_basic(nv);
  check_basic(no);
  if (lse) check_basic(Named{"lse", *lse, kLse, 3});

  if (q.dtype != DType::f16 && q.dtype != DType::bf16)
    throw Error(fmt::format("q: dtype must be f16 or bf16, got {}", dtype_name(q.dtype)));
  for (const Named* n : {&nk, &nv, &no}) {
    if (n->t.dtype != q.dtype)
      throw Error(fmt::format("{}: dtype must match q ({}), got {}", n->tensor, dtype_name(q.dtype),
                              dtype_name(n->t.dtype)));
  }
  if (lse && lse->dtype != DType::f32)
    throw Error(fmt::format("lse: dtype must be f32, got {}", dtype_name(lse->dtype)));

  check_same(nk, 0, nq, 0);  // B
  check_same(nk, 3, nq, 3);  // Dqk
  check_same(nv, 0, nq, 0);  // B
  check_same(nv, 1, nk, 1);  // Hkv
  check_same(nv, 2, nk, 2);  // Lkv
  check_same(no, 0, nq, 0);  // B
  check_same(no, 1, nq, 1);  // Hq
  check_same(no, 2, nq, 2);  // Lq
  check_same(no, 3, nv, 3);  // Dv
  if (lse) {
    const Named nl{"lse", *lse, kLse, 3};
    for (int d = 0; d < 3; ++d) check_same(nl, d, nq, d);
  }
  if (q.shape[1] % k.shape[1] != 0)
    throw Error(fmt::format("q: Hq ({}) must be a multiple of Hkv ({})", q.shape[1], k.shape[1]));
  if (q.shape[0] * q.shape[1] > INT_MAX)
    throw Error(fmt::format("q: B*Hq = {} exceeds the int32 range", q.shape[0] * q.shape[1]));

  check_rows_aligned(nq);
  check_rows_aligned(nk);
  check_rows_aligned(nv);
  check_rows_aligned(no);
  if (lse && reinterpret_cast<uintptr_t>(lse->data) % 4 != 0)
    throw Error("lse: data pointer must be 4-byte aligned");

  AttentionShape s;
  s.batch = static_cast<int>(q.shape[0]);
  s.heads_q = static_cast<int>(q.shape[1]);
  s.heads_kv = static_cast<int>(k.shape[1]);
  s.len_q = static_cast<int>(q.shape[2]);
  s.len_kv = static_cast<int>(k.shape[2]);
  s.dim_qk = static_cast<int>(q.shape[3]);
  s.dim_v = static_cast<int>(v.shape[3]);
  s.dtype = q.dtype;
  return s;
}

void validate_row_output(const char* name, const TensorView& t, const TensorView& q) {
  static const char* const kQ[] = {"B", "Hq", "Lq", "Dqk"};
  static const char* const kRows[] = {"B", "Hq", "Lq"};
  const Named nt{name, t, kRows, 3}, nq{"q", q, kQ, 4};
  check_basic(nt);
  if (t.dtype != DType::f32)
    throw Error(fmt::format("{}: dtype must be f32, got {}", name, dtype_name(t.dtype)));
  for (int d = 0; d < 3; ++d) check_same(nt, d, nq, d);
  if (reinterpret_cast<uintptr_t>(t.data) % 4 != 0)
    throw Error(fmt::format("{}: data pointer must be 4-byte aligned", name));
}

AttentionShape validate_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& o, const TensorView& lse, const TensorView& dout,
                                           const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                           const TensorView* dlse) {
  const AttentionShape s = validate_attention(q, k, v, o, &lse);
  static const char* const kQ[] = {"B", "Hq", "Lq", "Dqk"};
  static const char* const kK[] = {"B", "Hkv", "Lkv", "Dqk"};
  static const char* const kV[] = {"B", "Hkv", "Lkv", "Dv"};
  static const char* const kO[] = {"B", "Hq", "Lq", "Dv"};
  static const char* const kLse[] = {"B", "Hq", "Lq"};
  struct Pair {
    Named grad, primal;
  };
  const Pair pairs[] = {{{"dout", dout, kO, 4}, {"o", o, kO, 4}},
                        {{"dq", dq, kQ, 4}, {"q", q, kQ, 4}},
                        {{"dk", dk, kK, 4}, {"k", k, kK, 4}},
                        {{"dv", dv, kV, 4}, {"v", v, kV, 4}}};
  for (const Pair& pr : pairs) {
    check_basic(pr.grad);
    if (pr.grad.t.dtype != pr.primal.t.dtype)
      throw Error(fmt::format("{}: dtype must match {} ({}), got {}", pr.grad.tensor, pr.primal.tensor,
                              dtype_name(pr.primal.t.dtype), dtype_name(pr.grad.t.dtype)));
    for (int d = 0; d < 4; ++d) check_same(pr.grad, d, pr.primal, d);
    check_rows_aligned(pr.grad);
  }
  if (dlse) {
    const Named nd{"dlse", *dlse, kLse, 3}, nl{"lse", lse, kLse, 3};
    check_basic(nd);
    if (dlse->dtype != DType::f32)
      throw Error(fmt::format("dlse: dtype must be f32, got {}", dtype_name(dlse->dtype)));
    for (int d = 0; d < 3; ++d) check_same(nd, d, nl, d);
    if (reinterpret_cast<uintptr_t>(dlse->data) % 4 != 0)
      throw Error("dlse: data pointer must be 4-byte aligned");
  }
  return s;
}

namespace {
// [first, last] byte addresses a view touches; false when it is empty.
bool byte_span(const TensorView& t, uintptr_t& first, uintptr_t& last) {
  if (t.data == nullptr || t.rank == 0 || t.numel() == 0) return false;
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < t.rank; ++d) {
    const int64_t reach = (t.shape[d] - 1) * t.stride[d];
    (reach < 0 ? lo : hi) += reach;
  }
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype));
  first = reinterpret_cast<uintptr_t>(t.data) + lo * size;
  last = reinterpret_cast<uintptr_t>(t.data) + hi * size + size - 1;
  return true;
}

// A view's addresses as a base plus terms: its element at base + Σ i_d·stride_d (bytes), i_d in
// [lo_d, hi_d], each `size` bytes. A dense view (its elements tile its span: a permutation of a
// contiguous block) is one element the size of its span, with no terms.
struct Term {
  int64_t stride, lo, hi;
};
struct Addresses {
  int64_t base = 0, size = 0;
  std::vector<Term> terms;
};
Addresses addresses_of(const TensorView& t, uintptr_t first, uintptr_t last) {
  Addresses a;
  const int64_t esize = static_cast<int64_t>(dtype_size(t.dtype));
  std::vector<std::pair<int64_t, int64_t>> dims;  // |stride| (elements), extent
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] != 0)
      dims.push_back({t.stride[d] < 0 ? -t.stride[d] : t.stride[d], t.shape[d]});
  std::sort(dims.begin(), dims.end());
  bool dense = true;
  int64_t next = 1;
  for (auto [stride, extent] : dims) dense = dense && stride == next, next = stride * extent;
  if (dense) {
    a.base = static_cast<int64_t>(first), a.size = static_cast<int64_t>(last - first + 1);
    return a;
  }
  a.base = reinterpret_cast<int64_t>(t.data), a.size = esize;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] != 0) a.terms.push_back({t.stride[d] * esize, 0, t.shape[d] - 1});
  return a;
}

// Whether Σ k_i·stride_i over terms (strides > 0, descending; k_i in [lo_i, hi_i]) can lie in
// the open interval (lo, hi): 1 yes, 0 no, -1 when the search outgrows `budget` nodes.
int reachable(const Term* t, size_t n, __int128 lo, __int128 hi, int& budget) {
  if (--budget < 0) return -1;
  if (n == 0) return lo < 0 && 0 < hi ? 1 : 0;
  __int128 rmin = 0, rmax = 0;  // what the terms after the first can add
  for (size_t i = 1; i < n; ++i)
    rmin += __int128(t[i].lo) * t[i].stride, rmax += __int128(t[i].hi) * t[i].stride;
  // k·s in (lo - rmax, hi - rmin)
  const __int128 s = t[0].stride, a = lo - rmax, b = hi - rmin;
  // From the least k with k·s > a (or one below it) to the greatest with k·s < b: the leaves
  // test the interval exactly, so a candidate too many only costs a node.
  __int128 kmin = a >= 0 ? a / s + 1 : -((-a) / s);
  __int128 kmax = b > 0 ? (b - 1) / s : -((-b) / s) - 1;
  if (kmin < t[0].lo) kmin = t[0].lo;
  if (kmax > t[0].hi) kmax = t[0].hi;
  int result = 0;
  for (__int128 k = kmin; k <= kmax; ++k) {
    const int r = reachable(t + 1, n - 1, lo - k * s, hi - k * s, budget);
    if (r == 1) return 1;
    if (r < 0) result = -1;
    if (budget < 0) return -1;
  }
  return result;
}
}  // namespace

bool overlaps(const TensorView& a, const TensorView& b) {
  uintptr_t a0, a1, b0, b1;
  if (!byte_span(a, a0, a1) || !byte_span(b, b0, b1)) return false;
  if (a0 > b1 || b0 > a1) return false;
  // a's element at A + X (ea bytes) and b's at B + Y (eb bytes) share a byte iff
  // X - Y lies in (B - A - ea, B - A + eb); X - Y is a sum of terms k·s, equal strides merged.
  const Addresses x = addresses_of(a, a0, a1), y = addresses_of(b, b0, b1);
  std::vector<Term> terms = x.terms;
  for (Term t : y.terms) {
    t = {t.stride, -t.hi, -t.lo};
    auto same = std::find_if(terms.begin(), terms.end(), [&](const Term& u) { return u.stride == t.stride; });
    if (same != terms.end())
      same->lo += t.lo, same->hi += t.hi;
    else
      terms.push_back(t);
  }
  for (Term& t : terms)
    if (t.stride < 0) t = {-t.stride, -t.hi, -t.lo};
  std::sort(terms.begin(), terms.end(), [](const Term& u, const Term& v) { return u.stride > v.stride; });
  const __int128 d = __int128(y.base) - x.base;
  int budget = 4096;
  return reachable(terms.data(), terms.size(), d - x.size, d + y.size, budget) == 1;
}

namespace {
// Whether two elements of v may share memory: a dimension of stride 0 (size > 1), or, taking the
// dimensions by stride, one whose stride does not clear the span of those below it (a safe
// test: it refuses some exotic interleavings that happen not to collide).
bool overlaps_itself(const TensorView& v) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of dimensions of size > 1
  for (int d = 0; d < v.rank; ++d)
    if (v.shape[d] > 1) dims.push_back({v.stride[d] < 0 ? -v.stride[d] : v.stride[d], v.shape[d]});
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // elements below the next dimension's stride
  for (const auto& [stride, size] : dims) {
    if (stride < span) return true;
    span = stride * (size - 1) + span;
  }
  return false;
}
}  // namespace

void check_outputs_apart(const std::vector<NamedView>& outputs, const std::vector<NamedView>& inputs) {
  auto text = [](const NamedView& n) {
    return n.key ? fmt::format(fmt::runtime(n.name), *n.key) : std::string(n.name);
  };
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    if (!out->view) continue;
    if (overlaps_itself(*out->view)) {
      const TensorView& v = *out->view;
      throw Error(
          fmt::format("{}: its elements overlap one another (shape [{}], strides [{}]); give it a layout in "
                      "which every element has memory of its own",
                      text(*out), fmt::join(v.shape, v.shape + v.rank, ", "),
                      fmt::join(v.stride, v.stride + v.rank, ", ")));
    }
    auto check = [&](const NamedView& other) {
      if (other.view && overlaps(*out->view, *other.view))
        throw Error(fmt::format("{}: its memory overlaps that of {}; give it a buffer of its own", text(*out),
                                text(other)));
    };
    for (const NamedView& in : inputs) check(in);
    for (auto earlier = outputs.begin(); earlier != out; ++earlier) check(*earlier);
  }
}

}  // namespace fa
