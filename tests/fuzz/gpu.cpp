// The fuzzer's GPU mode (fuzz.h check_gpu): the case's kernels on random inputs against the
// float64 reference, forward (out, lse), in half the cases again as a ragged batch over a paged
// KV cache (check_layouts), and backward (dQ, dK, dV) where the score_mod has a derivative, with the
// tolerances of fajit run / tests/gpu (bf16 1e-2, f16 5e-3 relative for out, 2e-2 absolute for lse; gradients
// bf16 3e-2, f16 1e-2). Outputs are poisoned (NaN) first, and NaN/inf are checked elementwise: a value may be
// non-finite only where the reference's is.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <iterator>
#include <map>

#include "compare.h"
#include "device_tables.h"
#include "fajit/captures.h"
#include "fajit/detail/program_impl.h"
#include "fajit/detail/reference.h"
#include "fajit/kernel.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/half.h"
#include "fajit/runtime/memory.h"
#include "fuzz.h"

namespace fa_fuzz {
namespace {

// Adds the scope's duration to `*into` (a Stats timer; none when null).
class Timed {
 public:
  explicit Timed(double* into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    if (into_) *into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  double* into_;
  std::chrono::steady_clock::time_point t0_;
};

// P or dS as a kernel's matrix multiply takes it: rounded to its 16-bit type T
// (ReferenceOptions::round_operand).
template <fa::DType T>
double round_operand(double x) {
  return fa::from_bits(fa::to_bits(static_cast<float>(x), T), T);
}

// ---- strided device operands -----------------------------------------------------------------
// A [B, H, L, D] operand's device layout: contiguous; (B, L, H, D) as torch's transpose(1, 2) of
// a [B, L, H, D] tensor; or rows padded to D + pad elements. The host keeps values contiguous;
// the buffer is poisoned (0xff) where the view does not reach, so a write outside it shows.
struct Strided {
  int B, H, L, D;
  std::array<int64_t, 4> stride;
  size_t span;  // elements of the buffer
  fa::rt::DeviceBuffer buf;

  Strided(int mode, int pad, int B_, int H_, int L_, int D_) : B(B_), H(H_), L(L_), D(D_) {
    const int64_t Dp = D + (mode == 2 ? pad : 0);
    if (mode == 1)
      stride = {int64_t(L) * H * D, D, int64_t(H) * D, 1};
    else
      stride = {int64_t(H) * L * Dp, int64_t(L) * Dp, Dp, 1};
    span = size_t(B) * H * L * Dp;
    buf = fa::rt::DeviceBuffer(std::max<size_t>(span, 8) * 2);
  }
  size_t at(size_t i) const {  // the buffer element of contiguous element i
    const size_t d = i % D, l = i / D % L, h = i / D / L % H, b = i / D / L / H;
    return b * stride[0] + h * stride[1] + l * stride[2] + d;
  }
  void upload(const std::vector<uint16_t>& bits) {
    std::vector<uint16_t> dev(span, 0xffff);
    for (size_t i = 0; i < bits.size(); ++i) dev[at(i)] = bits[i];
    buf.upload(dev.data(), span * 2);
  }
  void poison() { buf.memset8(0xff); }
  // The values (contiguous); `outside` counts buffer elements beyond the view that were written.
  std::vector<double> download(fa::DType t, size_t* outside = nullptr) const {
    std::vector<uint16_t> dev(span);
    buf.download(dev.data(), span * 2);
    std::vector<double> out(size_t(B) * H * L * D);
    std::vector<char> in_view(outside ? span : 0, 0);
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = fa::from_bits(dev[at(i)], t);
      if (outside) in_view[at(i)] = 1;
    }
    if (outside) {
      *outside = 0;
      for (size_t j = 0; j < span; ++j) *outside += !in_view[j] && dev[j] != 0xffff;
    }
    return out;
  }
  fa::TensorView view(fa::DType t) {
    return fa::TensorView(buf.as<void>(), t, {B, H, L, D}, {stride[0], stride[1], stride[2], stride[3]});
  }
};

// The case again as a ragged batch over a paged KV cache (fa::Sequences): sequence b keeps the
// first lq[b] queries and lkv[b] keys of batch b (random, 0 and 1 among them), packed with
// cu_seqlens; its keys once packed (cu_seqlens_k) and once in pages of a random size shuffled
// over a pool. The two runs must agree bit for bit, and each sequence must match the float64
// reference of that sequence alone (b + 1 batches with stride 0 so mods that read b see it).
std::string check_layouts(const Case& c, const fa::Kernel& k, const fa::Program& program,
                          const fa::Captures& cap, const fa::Bindings& env, const fa::RoundedTensor& q,
                          const fa::RoundedTensor& kk, const fa::RoundedTensor& v, std::mt19937_64& rng,
                          Stats* st) {
  const Shape& s = c.shape;
  const fa::DType t = s.dtype;
  const int B = s.batch, Hq = s.heads_q, Hkv = s.heads_kv, Lq = s.len_q, Lkv = s.len_kv, DQ = s.dim_qk,
            DV = s.dim_v;
  std::vector<int32_t> lq(B), lk(B), cu_q(B + 1, 0), cu_k(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    const int pick = static_cast<int>(rng() % 4);  // 0: full, 1: 0 or 1, else random
    lq[b] = pick == 0 ? Lq : pick == 1 ? std::min<int>(Lq, static_cast<int>(rng() % 2)) : 1 + rng() % Lq;
    lk[b] = pick == 0 ? Lkv : pick == 1 ? std::min<int>(Lkv, static_cast<int>(rng() % 2)) : 1 + rng() % Lkv;
    cu_q[b + 1] = cu_q[b] + lq[b], cu_k[b + 1] = cu_k[b] + lk[b];
  }
  const int page_sizes[] = {1, 16, 64, 128, 256};
  const int ps = page_sizes[rng() % 5], max_pages = (Lkv + ps - 1) / ps;
  const int64_t tq = std::max(cu_q[B], 1), tk = std::max(cu_k[B], 1);
  // packed rows [total, H, D] from the dense [B, H, L, D] tensors
  auto pack = [&](const fa::RoundedTensor& x, const std::vector<int32_t>& len, const std::vector<int32_t>& cu,
                  int H, int L, int D, int64_t total) {
    std::vector<uint16_t> out(size_t(total) * H * D);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < len[b]; ++i)
          std::memcpy(&out[(size_t(cu[b] + i) * H + h) * D], &x.bits[((size_t(b) * H + h) * L + i) * D],
                      size_t(D) * 2);
    return out;
  };
  const std::vector<uint16_t> pq = pack(q, lq, cu_q, Hq, Lq, DQ, tq),
                              pk = pack(kk, lk, cu_k, Hkv, Lkv, DQ, tk),
                              pv = pack(v, lk, cu_k, Hkv, Lkv, DV, tk);
  int num_pages = 0;
  for (int b = 0; b < B; ++b) num_pages += (lk[b] + ps - 1) / ps;
  num_pages = std::max(num_pages, 1);
  std::vector<int32_t> perm(num_pages), table(size_t(B) * max_pages, -1);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int b = 0, next = 0; b < B; ++b)
    for (int j = 0; j * ps < lk[b]; ++j) table[size_t(b) * max_pages + j] = perm[next++];
  auto pool = [&](const std::vector<uint16_t>& packed, int D) {
    std::vector<uint16_t> out(size_t(num_pages) * ps * Hkv * D, 0);
    for (int b = 0; b < B; ++b)
      for (int kv = 0; kv < lk[b]; ++kv)
        std::memcpy(&out[(size_t(table[size_t(b) * max_pages + kv / ps]) * ps + kv % ps) * Hkv * D],
                    &packed[size_t(cu_k[b] + kv) * Hkv * D], size_t(Hkv) * D * 2);
    return out;
  };
  const std::vector<uint16_t> kpool = pool(pk, DQ), vpool = pool(pv, DV);
  auto dev = [](const void* host, size_t bytes) {
    fa::rt::DeviceBuffer d(std::max<size_t>(bytes, 16));
    d.upload(host, bytes);
    return d;
  };
  fa::rt::DeviceBuffer dq = dev(pq.data(), pq.size() * 2), dk = dev(pk.data(), pk.size() * 2),
                       dv = dev(pv.data(), pv.size() * 2), dkp = dev(kpool.data(), kpool.size() * 2),
                       dvp = dev(vpool.data(), vpool.size() * 2), dcq = dev(cu_q.data(), cu_q.size() * 4),
                       dck = dev(cu_k.data(), cu_k.size() * 4), dlk = dev(lk.data(), lk.size() * 4),
                       dpt = dev(table.data(), table.size() * 4);
  fa::TensorView cqv(dcq.as<void>(), fa::DType::i32, {B + 1}), ckv(dck.as<void>(), fa::DType::i32, {B + 1}),
      lkv(dlk.as<void>(), fa::DType::i32, {B}), ptv(dpt.as<void>(), fa::DType::i32, {B, max_pages});
  const fa::BlockMask mask = k.block_mask(B, Hq, Lq, Lkv, cap);
  const size_t no = size_t(tq) * Hq * DV, nl = size_t(tq) * Hq;
  std::vector<uint16_t> outs[2];
  std::vector<float> lses[2];
  for (int paged = 0; paged < 2; ++paged) {
    fa::rt::DeviceBuffer o(no * 2), l(nl * 4);
    o.memset8(0xff);
    l.memset8(0xff);
    fa::TensorView tl(l.as<void>(), fa::DType::f32, {Hq, tq});
    fa::ForwardOptions fo;
    fo.lse = &tl;
    fo.sequences.check_tables = true;
    fo.sequences.cu_seqlens_q = &cqv, fo.sequences.max_seqlen_q = Lq, fo.sequences.max_seqlen_k = Lkv;
    if (paged) {
      fo.sequences.page_table = &ptv, fo.sequences.seqlens_k = &lkv;
      k.forward(fa::TensorView(dq.as<void>(), t, {tq, Hq, DQ}),
                fa::TensorView(dkp.as<void>(), t, {num_pages, ps, Hkv, DQ}),
                fa::TensorView(dvp.as<void>(), t, {num_pages, ps, Hkv, DV}),
                fa::TensorView(o.as<void>(), t, {tq, Hq, DV}), mask, cap, fo);
    } else {
      fo.sequences.cu_seqlens_k = &ckv;
      k.forward(fa::TensorView(dq.as<void>(), t, {tq, Hq, DQ}),
                fa::TensorView(dk.as<void>(), t, {tk, Hkv, DQ}),
                fa::TensorView(dv.as<void>(), t, {tk, Hkv, DV}),
                fa::TensorView(o.as<void>(), t, {tq, Hq, DV}), mask, cap, fo);
    }
    fa::rt::synchronize(nullptr);
    outs[paged].resize(no), lses[paged].resize(nl);
    o.download(outs[paged].data(), no * 2);
    l.download(lses[paged].data(), nl * 4);
  }
  const std::string lens =
      fmt::format("ragged lengths q {} kv {}, page size {}", fmt::join(lq, ","), fmt::join(lk, ","), ps);
  size_t n_out = 0, n_lse = 0, first = no;  // elements that differ, bit for bit
  for (size_t i = 0; i < no; ++i)
    if (outs[0][i] != outs[1][i] && n_out++ == 0) first = i;
  for (size_t i = 0; i < nl; ++i) n_lse += std::memcmp(&lses[0][i], &lses[1][i], 4) != 0;
  if (n_out + n_lse > 0) {
    std::string at;
    if (first < no)
      at = fmt::format("; first at token {} head {} d {}: packed {:.6g}, paged {:.6g}", first / DV / Hq,
                       first / DV % Hq, first % DV, fa::from_bits(outs[0][first], t),
                       fa::from_bits(outs[1][first], t));
    return fmt::format(
        "ragged: the paged run differs from the packed run ({}): {} of {} out elements, {} of {} lse{}", lens,
        n_out, no, n_lse, nl, at);
  }

  fa::ModProgram sp = fa::ModProgram::score_of(program), mp = fa::ModProgram::mask_of(program);
  const fa::BoundMod sb = sp.bind(env), mb = mp.bind(env);
  std::vector<double> got, want, got_l, want_l;
  std::vector<RowId> rows;
  for (int b = 0; b < B; ++b) {
    if (lq[b] == 0) continue;
    auto row = [&](int h, int i) { return size_t(cu_q[b] + i) * Hq + h; };
    std::optional<fa::ReferenceResult> r;
    if (lk[b] > 0) {
      fa::ReferenceOptions ro;
      ro.score_mod = &sp, ro.mask_mod = &mp, ro.bindings = &env;
      ro.q_strides = std::array<int64_t, 4>{0, int64_t(Lq) * DQ, DQ, 1};
      ro.k_strides = std::array<int64_t, 4>{0, int64_t(Lkv) * DQ, DQ, 1};
      ro.v_strides = std::array<int64_t, 4>{0, int64_t(Lkv) * DV, DV, 1};
      Timed timed(st ? &st->t_reference : nullptr);
      r = fa::reference_attention(
          {b + 1, Hq, Hkv, lq[b], lk[b], DQ, DV}, q.values.data() + size_t(b) * Hq * Lq * DQ,
          kk.values.data() + size_t(b) * Hkv * Lkv * DQ, v.values.data() + size_t(b) * Hkv * Lkv * DV, ro);
    }
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < lq[b]; ++i) {  // a sequence without keys: out 0, lse -inf
        const size_t rr = (size_t(b) * Hq + h) * lq[b] + i;
        for (int d = 0; d < DV; ++d)
          got.push_back(fa::from_bits(outs[0][row(h, i) * DV + d], t)),
              want.push_back(r ? r->out[rr * DV + d] : 0);
        got_l.push_back(lses[0][size_t(h) * tq + cu_q[b] + i]), want_l.push_back(r ? r->lse[rr] : -INFINITY);
        rows.push_back({b, h, i, lk[b]});
      }
  }
  const double tol = t == fa::DType::bf16 ? 1e-2 : 5e-3;
  const RowContext x{c, sb, mb, q, kk, v};
  if (std::string e = compare_forward(x, rows, got, want, got_l, want_l, tol, rng, st); !e.empty())
    return "ragged forward vs float64 reference (" + lens + "): " + e;
  return "";
}

}  // namespace

std::string gpu_unavailable() {
  return fa::rt::cuda_available() ? "" : "no GPU here (" + fa::rt::cuda_unavailable_reason() + ")";
}

std::string check_gpu(const Case& c, Stats* st) {
  if (std::string why = gpu_unavailable(); !why.empty()) return "--gpu: " + why;
  const Shape& s = c.shape;
  const fa::DType t = s.dtype;
  fa::Program program = program_of(c);
  fa::Options opts;
  opts.dtype = t;
  opts.head_dim_qk = s.dim_qk;
  opts.head_dim_v = s.dim_v;
  std::optional<fa::Kernel> compiled;
  {
    Timed timed(st ? &st->t_compile : nullptr);
    compiled.emplace(fa::compile(program, opts));
  }
  const fa::Kernel& k = *compiled;
  fa::rt::ContextGuard guard;

  // Captures: the case's buffers on the device, its scalars; only those the program still reads
  // (simplification may drop a read, e.g. a scalar under a folded condition, and the kernel
  // refuses a capture it does not have).
  std::set<std::string> read;
  for (const fa::Program::Capture& pc : program.captures()) read.insert(pc.name);
  fa::Captures cap;
  std::vector<fa::rt::DeviceBuffer> keep;
  for (const BufferSpec& b : c.buffers) {
    if (!read.count(b.name)) continue;
    size_t bytes = (b.is_float ? b.f.size() : b.i.size()) * 4;
    keep.emplace_back(bytes);
    keep.back().upload(
        b.is_float ? static_cast<const void*>(b.f.data()) : static_cast<const void*>(b.i.data()), bytes);
    fa::DType dt = b.is_float ? fa::DType::f32 : fa::DType::i32;
    cap.buffer(b.name, b.shape.size() == 1
                           ? fa::TensorView(keep.back().as<void>(), dt, {b.shape[0]})
                           : fa::TensorView(keep.back().as<void>(), dt, {b.shape[0], b.shape[1]}));
  }
  for (const ScalarSpec& sc : c.scalars) {
    if (!read.count(sc.name)) continue;
    if (sc.is_float)
      cap.scalar(sc.name, static_cast<float>(sc.value));
    else
      cap.scalar(sc.name, static_cast<int32_t>(sc.value));
  }
  fa::Bindings env = bindings_of(c);

  std::mt19937_64 rng(c.seed * 31 + static_cast<uint64_t>(c.index));
  const int B = s.batch, Hq = s.heads_q, Hkv = s.heads_kv, Lq = s.len_q, Lkv = s.len_kv;
  const size_t nq = size_t(B) * Hq * Lq * s.dim_qk, nk = size_t(B) * Hkv * Lkv * s.dim_qk,
               nv = size_t(B) * Hkv * Lkv * s.dim_v, no = size_t(B) * Hq * Lq * s.dim_v,
               nl = size_t(B) * Hq * Lq;
  fa::RoundedTensor q = fa::random_rounded(nq, t, rng), kk = fa::random_rounded(nk, t, rng),
                    v = fa::random_rounded(nv, t, rng);
  // Device layouts: 60 % contiguous, 20 % (B, L, H, D), 20 % padded rows; one mode per case
  // for every operand, output and gradient.
  const int mode = rng() % 5 < 3 ? 0 : 1 + int(rng() % 2), pad = 8 * (1 + int(rng() % 3));
  if (st) st->strided += mode != 0;
  Strided sq(mode, pad, B, Hq, Lq, s.dim_qk), sk(mode, pad, B, Hkv, Lkv, s.dim_qk),
      sv(mode, pad, B, Hkv, Lkv, s.dim_v), so(mode, pad, B, Hq, Lq, s.dim_v);
  fa::rt::DeviceBuffer dlse(nl * 4);
  sq.upload(q.bits);
  sk.upload(kk.bits);
  sv.upload(v.bits);
  so.poison();  // poison: NaN in fp16, bf16 and f32
  dlse.memset8(0xff);
  const fa::TensorView tq = sq.view(t), tk = sk.view(t), tv = sv.view(t), to = so.view(t);
  fa::TensorView tl(dlse.as<void>(), fa::DType::f32, {B, Hq, Lq});
  const fa::BlockMask built = k.block_mask(B, Hq, Lq, Lkv, cap);
  // A third of the cases (a stream of their own, so the inputs stay those of earlier runs) hand
  // the kernels the mask's kv tables on the device, read in place (BlockMask::from_device_kv_blocks,
  // as fajit.torch's decoding steps and CUDA-graph captures do); the backward then takes its
  // transposed tables from a copy.
  std::unique_ptr<fa::test::DeviceTablesMask> dt;
  if (std::mt19937_64((c.seed * 131 + static_cast<uint64_t>(c.index)) ^ 0x6465767461626cull)() % 3 == 0) {
    dt = fa::test::device_tables_of(built);
    if (st) ++st->device_tables;
  }
  const fa::BlockMask& mask = dt ? dt->mask : built;
  fa::ForwardOptions fo;
  fo.lse = &tl;
  k.forward(tq, tk, tv, to, mask, cap, fo);
  fa::rt::synchronize(nullptr);
  size_t outside = 0;
  std::vector<double> out = so.download(t, &outside);
  if (outside)
    return fmt::format("forward wrote {} elements outside the output view ({})", outside, to.to_string());
  std::vector<float> lse_f(nl);
  dlse.download(lse_f.data(), nl * 4);
  std::vector<double> lse(lse_f.begin(), lse_f.end());

  fa::ModProgram sp = fa::ModProgram::score_of(program), mp = fa::ModProgram::mask_of(program);
  fa::ReferenceOptions ro;
  ro.score_mod = &sp;
  ro.mask_mod = &mp;
  ro.bindings = &env;
  const fa::ReferenceShape rs{B, Hq, Hkv, Lq, Lkv, s.dim_qk, s.dim_v};
  fa::ReferenceResult ref;
  {
    Timed timed(st ? &st->t_reference : nullptr);
    ref = fa::reference_attention(rs, q.values.data(), kk.values.data(), v.values.data(), ro);
  }
  if (st) ++st->gpu_forward;
  const double tol = t == fa::DType::bf16 ? 1e-2 : 5e-3;
  const fa::BoundMod sb = sp.bind(env), mb = mp.bind(env);
  const RowContext x{c, sb, mb, q, kk, v};
  std::vector<RowId> rows;
  rows.reserve(nl);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < Lq; ++i) rows.push_back({b, h, i, Lkv});
  if (std::string e = compare_forward(x, rows, out, ref.out, lse, ref.lse, tol, rng, st); !e.empty())
    return "forward vs float64 reference: " + e;

  // A quarter of the cases (by index) run the forward again asking for each row's largest
  // score (the row-max twin, into outputs of its own): the maxima against the reference's. The
  // first call, the outputs the backward reads and the case's random stream stay as the
  // recorded regressions replay them.
  if (c.index % 4 == 3) {
    Strided so2(mode, pad, B, Hq, Lq, s.dim_v);
    so2.poison();
    fa::rt::DeviceBuffer dlse2(nl * 4), dmax(nl * 4);
    dmax.memset8(0xff);
    const fa::TensorView tl2(dlse2.as<void>(), fa::DType::f32, {B, Hq, Lq}),
        tmax(dmax.as<void>(), fa::DType::f32, {B, Hq, Lq});
    fa::ForwardOptions fm;
    fm.lse = &tl2;
    fm.max_scores = &tmax;
    k.forward(tq, tk, tv, so2.view(t), mask, cap, fm);
    fa::rt::synchronize(nullptr);
    std::vector<float> max_f(nl);
    dmax.download(max_f.data(), nl * 4);
    if (st) ++st->with_max_scores;
    if (std::string e = compare_max_scores(x, rows, std::vector<double>(max_f.begin(), max_f.end()),
                                           ref.max_score, rng, st);
        !e.empty())
      return "forward max_scores vs float64 reference: " + e;
  }

  // Half the cases (those small enough for a second reference) again as a ragged, paged batch.
  if (rng() % 2 == 0 && double(B) * B * Hq * Lq * Lkv <= double(1 << 26)) {
    if (st) ++st->gpu_layouts;
    if (std::string e = check_layouts(c, k, program, cap, env, q, kk, v, rng, st); !e.empty()) return e;
  }

  // Backward: where the score_mod has a derivative and the forward is finite everywhere.
  std::optional<fa::ModProgram> grad;
  if (!program.score_is_identity()) {
    try {
      grad.emplace(fa::ModProgram::grad_of(program));
    } catch (const fa::Error&) {
      return "";  // no derivative: the CPU checks verified the refusal
    }
  }
  for (double x : ref.out)
    if (!std::isfinite(x)) return "";
  fa::RoundedTensor g_out = fa::random_rounded(no, t, rng);
  std::vector<double> dout_vals(g_out.values.begin(), g_out.values.end());
  Strided sdo(mode, pad, B, Hq, Lq, s.dim_v), sdq(mode, pad, B, Hq, Lq, s.dim_qk),
      sdk(mode, pad, B, Hkv, Lkv, s.dim_qk), sdv(mode, pad, B, Hkv, Lkv, s.dim_v);
  sdo.upload(g_out.bits);
  for (Strided* x : {&sdq, &sdk, &sdv}) x->poison();
  fa::BackwardOptions bo;
  // A quarter of the cases with a dLSE (a loss that reads the LSE), a quarter deterministic.
  std::vector<double> dlse_vals;
  fa::rt::DeviceBuffer d_dlse(nl * 4);
  fa::TensorView tdlse(d_dlse.as<void>(), fa::DType::f32, {B, Hq, Lq});
  if (rng() % 4 == 0) {
    std::vector<float> dl(nl);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& x : dl) x = u(rng);
    d_dlse.upload(dl.data(), nl * 4);
    dlse_vals.assign(dl.begin(), dl.end());
    bo.dlse = &tdlse;
    if (st) ++st->with_dlse;
  }
  bo.deterministic = rng() % 4 == 0;
  if (st) st->deterministic += bo.deterministic;
  // Every f32 buffer the score_mod reads gets a gradient, into zeroed fp32 tensors.
  std::map<std::string, fa::rt::DeviceBuffer> d_bgrad;
  for (const std::string& name : fa::detail::gradient_buffers(program)) {
    const fa::TensorView& primal = cap.buffers().at(name);
    fa::rt::DeviceBuffer& buf = d_bgrad[name];
    buf = fa::rt::DeviceBuffer(size_t(primal.numel()) * 4);
    buf.memset8(0);
    bo.buffer_grads.emplace(
        name, primal.rank == 1
                  ? fa::TensorView(buf.as<void>(), fa::DType::f32, {primal.shape[0]})
                  : fa::TensorView(buf.as<void>(), fa::DType::f32, {primal.shape[0], primal.shape[1]}));
  }
  if (st) st->buffer_grads += int64_t(d_bgrad.size());
  k.backward(tq, tk, tv, to, tl, sdo.view(t), sdq.view(t), sdk.view(t), sdv.view(t), mask, cap, bo);
  fa::rt::synchronize(nullptr);
  fa::ReferenceOptions rb = ro;
  if (grad)
    rb.score_grad = &*grad;
  else
    rb.score_mod = nullptr;
  rb.delta_out = out.data();  // delta from the kernel's own O, as tests/gpu/backward_test.cpp
  rb.lse = lse.data();        // and P from its own (f32) LSE, all a backward is given
  fa::ReferenceGrads g;
  {
    Timed timed(st ? &st->t_reference : nullptr);
    g = fa::reference_attention_backward(rs, q.values.data(), kk.values.data(), v.values.data(),
                                         dout_vals.data(), dlse_vals.empty() ? nullptr : dlse_vals.data(),
                                         rb);
  }
  if (st) ++st->gpu_backward;
  const double gtol = t == fa::DType::bf16 ? 3e-2 : 1e-2;
  // A gradient past what its tensor holds (f16 65504, bf16 and the fp32 buffer gradients
  // FLT_MAX) is ±inf in any kernel's answer: the reference's is too.
  const double dtype_max = t == fa::DType::f16 ? 65520.0 : double(std::numeric_limits<float>::max());
  auto saturate = [](std::vector<double>& xs, double limit) {
    for (double& x : xs)
      if (std::fabs(x) >= limit) x = std::copysign(INFINITY, x);
  };
  auto saturate_all = [&](fa::ReferenceGrads& r) {
    for (std::vector<double>* x : {&r.dq, &r.dk, &r.dv}) saturate(*x, dtype_max);
    for (auto& [name, x] : r.buffer_grads) saturate(x, double(std::numeric_limits<float>::max()));
  };
  saturate_all(g);
  // dQ, dK, dV (any layout: compared as contiguous [B, H, L, D]) and the buffer gradients
  // (fp32, flat; H = L = 1, D = their size for the messages). `pick` finds the same gradient in
  // another ReferenceGrads; `rows` marks its rows, if it has any (else null: a buffer gradient).
  struct Grad {
    std::string name;
    std::vector<double> got;
    const std::vector<double>* ref;
    int H, L, D;
    std::function<const std::vector<double>*(const fa::ReferenceGrads&)> pick;
    std::function<const std::vector<char>*(const UnstableGradients&)> rows;
  };
  std::vector<Grad> grads;
  size_t outside_dq = 0, outside_dk = 0, outside_dv = 0;
  grads.push_back({"dq", sdq.download(t, &outside_dq), &g.dq, Hq, Lq, s.dim_qk,
                   [](const fa::ReferenceGrads& r) { return &r.dq; },
                   [](const UnstableGradients& u) { return &u.dq_rows; }});
  grads.push_back({"dk", sdk.download(t, &outside_dk), &g.dk, Hkv, Lkv, s.dim_qk,
                   [](const fa::ReferenceGrads& r) { return &r.dk; },
                   [](const UnstableGradients& u) { return &u.kv_rows; }});
  grads.push_back({"dv", sdv.download(t, &outside_dv), &g.dv, Hkv, Lkv, s.dim_v,
                   [](const fa::ReferenceGrads& r) { return &r.dv; },
                   [](const UnstableGradients& u) { return &u.kv_rows; }});
  if (outside_dq + outside_dk + outside_dv)
    return fmt::format("backward wrote outside the gradient views: dq {}, dk {}, dv {} elements", outside_dq,
                       outside_dk, outside_dv);
  for (auto& [name, buf] : d_bgrad) {
    const std::vector<double>& r = g.buffer_grads.at(name);
    std::vector<float> got(r.size());
    buf.download(got.data(), got.size() * 4);
    grads.push_back({"d" + name, std::vector<double>(got.begin(), got.end()), &r, 1, 1, int(r.size()),
                     [n = name](const fa::ReferenceGrads& x) { return &x.buffer_grads.at(n); },
                     [](const UnstableGradients&) { return nullptr; }});
  }
  bool over = false;
  for (const Grad& gr : grads) {
    const Compared cg = compare(gr.got, *gr.ref);
    over |= cg.unexpected || cg.rel > gtol;
  }
  if (!over) return "";
  // Over the bound: the reference again with every q·k moved by ±Dqk·2^-24·Σ|q·k| and every
  // dP - Δ by ±Dv·2^-24·(Σ|dO·v| + Σ|dO·o|) (the bounds of the kernels' f32 sums). Its spread
  // is the reference's own uncertainty: a kernel within the bound plus twice the spread, and
  // non-finite exactly where every reference is the same non-finite, agrees as far as f32 can
  // tell (an ill-conditioned derivative: s / (s / w) = w, whose derivative 0 is a difference
  // of two large terms; a row with one key, where dS = dP - Δ = 0 meets a derivative of 1e6).
  // A third: P from the reference's own LSE instead of the kernel's f32 one. The kernel's P is
  // exp(x - LSE) of its own scores; where a transcendental's last ulp or the f32 q·k moves a
  // score of 1e7 by a few units (pow(q, h) + score), the kernel's LSE and the reference's
  // scores are that far apart, and only its own LSE gives the reference a softmax of its own.
  // A fourth: P and dS rounded to the 16-bit type the kernels' matrix multiplies take them in;
  // f16 holds nothing below 2^-25, so a gradient summed only from smaller P or dS (every row
  // dominated by one key elsewhere) is 0 in any f16 kernel where the exact one is 1e-12.
  fa::ReferenceGrads moved[4];
  for (size_t k = 0; k < std::size(moved); ++k) {
    fa::ReferenceOptions rm = rb;
    if (k < 2) {
      rm.dot_shift = (k ? -1 : 1) * s.dim_qk * 0x1p-24;
      rm.dp_shift = (k ? -1 : 1) * s.dim_v * 0x1p-24;
    } else if (k == 2) {
      rm.lse = nullptr;
    } else {
      rm.round_operand =
          t == fa::DType::bf16 ? round_operand<fa::DType::bf16> : round_operand<fa::DType::f16>;
    }
    Timed timed(st ? &st->t_reference : nullptr);
    moved[k] = fa::reference_attention_backward(rs, q.values.data(), kk.values.data(), v.values.data(),
                                                dout_vals.data(),
                                                dlse_vals.empty() ? nullptr : dlse_vals.data(), rm);
    saturate_all(moved[k]);
  }
  // Rows fed by a pair whose score or derivative has no answer at f32 (unstable_gradients: a
  // pole at a score near 0, where the kernel's q·k may lie on the other side) are left out,
  // and with any such pair the buffer gradients, which sum over every pair; so is an element
  // on whose finiteness the references disagree. All counted.
  UnstableGradients unstable;
  if (grad) {
    Timed timed(st ? &st->t_reference : nullptr);
    unstable = unstable_gradients(x, grad->bind(env), lse);
  }
  std::string bad;
  int64_t left_out = 0;  // gradient elements
  for (const Grad& gr : grads) {
    const std::vector<double>& ref = *gr.ref;
    constexpr size_t kAlts = std::size(moved);
    const std::vector<double>* alt[kAlts];
    for (size_t k = 0; k < kAlts; ++k) alt[k] = gr.pick(moved[k]);
    const std::vector<char>* rows = gr.rows(unstable);
    double num = 0, den = 0, spread_num = 0, worst_err = -1;
    size_t unexpected = 0, w = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double x = gr.got[i], r = ref[i];
      double a[kAlts];
      for (size_t k = 0; k < kAlts; ++k) a[k] = (*alt[k])[i];
      const bool all_finite =
          std::isfinite(r) && std::all_of(a, a + kAlts, [](double y) { return std::isfinite(y); });
      // Left out: fed by an unstable pair, or the references disagree on whether (or which)
      // non-finite the answer is — the reference's own answer under the f32 moves has no bound.
      if ((rows ? (*rows)[i / size_t(gr.D)] : unstable.pairs > 0) ||
          (!all_finite && !std::all_of(a, a + kAlts, [&](double y) { return same_nonfinite(y, r); }))) {
        ++left_out;
        continue;
      }
      double err = 0;
      if (!all_finite || !std::isfinite(x)) {  // every reference the same non-finite, or all finite
        if (!same_nonfinite(x, r)) ++unexpected, err = INFINITY;
      } else {
        err = std::fabs(x - r);
        num += err * err, den += r * r;
        double d = 0;
        for (double ai : a) d = std::max(d, std::fabs(ai - r));
        spread_num += d * d;
      }
      if (err > worst_err) worst_err = err, w = i;
    }
    const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num),
                 spread = den > 0 ? std::sqrt(spread_num / den) : std::sqrt(spread_num);
    if (unexpected || rel > gtol + 2 * spread) {
      const int D = gr.D, L = gr.L, H = gr.H;
      bad += fmt::format(
          "{} rel err {:.3e} (the reference's own spread {:.1e}), {} unexpected non-finite, worst got {:.6g} "
          "want {:.6g} (moved {:.6g}, {:.6g}, own LSE {:.6g}, 16-bit P and dS {:.6g}) at b {} h {} row {} d "
          "{}; ",
          gr.name, rel, spread, unexpected, gr.got[w], ref[w], (*alt[0])[w], (*alt[1])[w], (*alt[2])[w],
          (*alt[3])[w], w / D / L / H, w / D / L % H, w / D % L, w % D);
    }
  }
  if (st) st->unstable_grad_elems += left_out, st->unstable_grad_cases += left_out > 0;
  if (!bad.empty())
    return fmt::format(
        "backward vs float64 reference (bound {:.0e}; {} pairs with no answer at f32, {} gradient "
        "elements left out): {}",
        gtol, unstable.pairs, left_out, bad);
  if (st) ++st->ill_backward;
  return "";
}

}  // namespace fa_fuzz
