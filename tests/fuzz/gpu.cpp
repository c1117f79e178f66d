// The fuzzer's GPU mode (fuzz.h check_gpu): the case's kernels on random inputs against the
// float64 reference, forward (out, lse), in half the cases again as a ragged batch over a paged
// KV cache (check_layouts), and backward (dQ, dK, dV) where the score_mod has a derivative, with the
// tolerances of fajit run / tests/gpu (bf16 1e-2, f16 5e-3 relative for out, 2e-2 absolute for lse; gradients
// bf16 3e-2, f16 1e-2). Outputs are poisoned (NaN) first, and NaN/inf are checked elementwise: a value may be
// non-finite only where the reference's is.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fajit/captures.h"
#include "fajit/detail/reference.h"
#include "fajit/kernel.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/half.h"
#include "fajit/runtime/memory.h"
#include "fuzz.h"

namespace fa_fuzz {
namespace {

struct Compared {
  double rel = 0;         // ||got - ref|| / ||ref|| over the entries where ref is finite
  size_t unexpected = 0;  // non-finite where the reference is finite, or finite where it is not
  size_t first_bad = 0;
};

Compared compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Compared c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i]) || !std::isfinite(got[i])) {
      bool same = (std::isnan(ref[i]) && std::isnan(got[i])) || (std::isinf(ref[i]) && got[i] == ref[i]);
      if (!same && c.unexpected++ == 0) c.first_bad = i;
      continue;
    }
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  c.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

std::vector<double> download(const fa::rt::DeviceBuffer& buf, size_t n, fa::DType t) {
  std::vector<uint16_t> bits(n);
  buf.download(bits.data(), n * 2);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = fa::from_bits(bits[i], t);
  return out;
}

// The case again as a ragged batch over a paged KV cache (fa::Sequences): sequence b keeps the
// first lq[b] queries and lkv[b] keys of batch b (random, 0 and 1 among them), packed with
// cu_seqlens; its keys once packed (cu_seqlens_k) and once in pages of a random size shuffled
// over a pool. The two runs must agree bit for bit, and each sequence must match the float64
// reference of that sequence alone (b + 1 batches with stride 0 so mods that read b see it).
std::string check_layouts(const Case& c, const fa::Kernel& k, const fa::Program& program,
                          const fa::Captures& cap, const fa::Bindings& env, const fa::RoundedTensor& q,
                          const fa::RoundedTensor& kk, const fa::RoundedTensor& v, std::mt19937_64& rng) {
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
  if (std::memcmp(outs[0].data(), outs[1].data(), no * 2) != 0 ||
      std::memcmp(lses[0].data(), lses[1].data(), nl * 4) != 0)
    return "ragged: the paged run differs from the packed run (" + lens + ")";

  fa::ModProgram sp = fa::ModProgram::score_of(program), mp = fa::ModProgram::mask_of(program);
  std::vector<double> got, want, got_l, want_l;
  for (int b = 0; b < B; ++b) {
    if (lq[b] == 0) continue;
    auto row = [&](int h, int i) { return size_t(cu_q[b] + i) * Hq + h; };
    if (lk[b] == 0) {
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < lq[b]; ++i) {
          for (int d = 0; d < DV; ++d)
            got.push_back(fa::from_bits(outs[0][row(h, i) * DV + d], t)), want.push_back(0);
          got_l.push_back(lses[0][size_t(h) * tq + cu_q[b] + i]), want_l.push_back(-INFINITY);
        }
      continue;
    }
    fa::ReferenceOptions ro;
    ro.score_mod = &sp, ro.mask_mod = &mp, ro.bindings = &env;
    ro.q_strides = std::array<int64_t, 4>{0, int64_t(Lq) * DQ, DQ, 1};
    ro.k_strides = std::array<int64_t, 4>{0, int64_t(Lkv) * DQ, DQ, 1};
    ro.v_strides = std::array<int64_t, 4>{0, int64_t(Lkv) * DV, DV, 1};
    const fa::ReferenceResult r = fa::reference_attention(
        {b + 1, Hq, Hkv, lq[b], lk[b], DQ, DV}, q.values.data() + size_t(b) * Hq * Lq * DQ,
        kk.values.data() + size_t(b) * Hkv * Lkv * DQ, v.values.data() + size_t(b) * Hkv * Lkv * DV, ro);
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < lq[b]; ++i) {
        const size_t rr = (size_t(b) * Hq + h) * lq[b] + i;
        for (int d = 0; d < DV; ++d)
          got.push_back(fa::from_bits(outs[0][row(h, i) * DV + d], t)), want.push_back(r.out[rr * DV + d]);
        got_l.push_back(lses[0][size_t(h) * tq + cu_q[b] + i]), want_l.push_back(r.lse[rr]);
      }
  }
  const double tol = t == fa::DType::bf16 ? 1e-2 : 5e-3;
  const Compared co = compare(got, want), cl = compare(got_l, want_l);
  double lse_err = 0;
  for (size_t i = 0; i < got_l.size(); ++i)
    if (std::isfinite(want_l[i]) && std::isfinite(got_l[i]))
      lse_err = std::max(lse_err, std::fabs(got_l[i] - want_l[i]));
  if (co.unexpected || co.rel > tol || cl.unexpected || lse_err > 2e-2)
    return fmt::format(
        "ragged forward vs float64 reference ({}): out rel err {:.3e} (bound {:.0e}), {} unexpected "
        "non-finite; "
        "lse max err {:.3e}, {} unexpected non-finite",
        lens, co.rel, tol, co.unexpected, lse_err, cl.unexpected);
  return "";
}

}  // namespace

std::string gpu_unavailable() {
  return fa::rt::cuda_available() ? "" : "no GPU here (" + fa::rt::cuda_unavailable_reason() + ")";
}

std::string check_gpu(const Case& c) {
  if (std::string why = gpu_unavailable(); !why.empty()) return "--gpu: " + why;
  const Shape& s = c.shape;
  const fa::DType t = s.dtype;
  fa::Program program = program_of(c);
  fa::Options opts;
  opts.dtype = t;
  opts.head_dim_qk = s.dim_qk;
  opts.head_dim_v = s.dim_v;
  fa::Kernel k = fa::compile(program, opts);
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
  fa::rt::DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nv * 2), dout(no * 2), dlse(nl * 4);
  dq.upload(q.bits.data(), nq * 2);
  dk.upload(kk.bits.data(), nk * 2);
  dv.upload(v.bits.data(), nv * 2);
  dout.memset8(0xff);  // poison: NaN in fp16, bf16 and f32
  dlse.memset8(0xff);
  fa::TensorView tq(dq.as<void>(), t, {B, Hq, Lq, s.dim_qk}), tk(dk.as<void>(), t, {B, Hkv, Lkv, s.dim_qk}),
      tv(dv.as<void>(), t, {B, Hkv, Lkv, s.dim_v}), to(dout.as<void>(), t, {B, Hq, Lq, s.dim_v}),
      tl(dlse.as<void>(), fa::DType::f32, {B, Hq, Lq});
  fa::BlockMask mask = k.block_mask(B, Hq, Lq, Lkv, cap);
  fa::ForwardOptions fo;
  fo.lse = &tl;
  k.forward(tq, tk, tv, to, mask, cap, fo);
  fa::rt::synchronize(nullptr);
  std::vector<double> out = download(dout, no, t);
  std::vector<float> lse_f(nl);
  dlse.download(lse_f.data(), nl * 4);
  std::vector<double> lse(lse_f.begin(), lse_f.end());

  fa::ModProgram sp = fa::ModProgram::score_of(program), mp = fa::ModProgram::mask_of(program);
  fa::ReferenceOptions ro;
  ro.score_mod = &sp;
  ro.mask_mod = &mp;
  ro.bindings = &env;
  const fa::ReferenceShape rs{B, Hq, Hkv, Lq, Lkv, s.dim_qk, s.dim_v};
  fa::ReferenceResult ref =
      fa::reference_attention(rs, q.values.data(), kk.values.data(), v.values.data(), ro);
  const double tol = t == fa::DType::bf16 ? 1e-2 : 5e-3;
  Compared co = compare(out, ref.out);
  double lse_err = 0;
  size_t lse_bad = 0;
  for (size_t i = 0; i < nl; ++i) {
    if (!std::isfinite(ref.lse[i]) || !std::isfinite(lse[i])) {
      lse_bad += !(ref.lse[i] == lse[i] || (std::isnan(ref.lse[i]) && std::isnan(lse[i])));
      continue;
    }
    lse_err = std::max(lse_err, std::fabs(lse[i] - ref.lse[i]));
  }
  if (co.unexpected || co.rel > tol || lse_bad || lse_err > 2e-2)
    return fmt::format(
        "forward vs float64 reference: out rel err {:.3e} (bound {:.0e}), {} unexpected non-finite (first at "
        "flat "
        "index {}); lse max err {:.3e} (bound 2e-2), {} unexpected non-finite",
        co.rel, tol, co.unexpected, co.first_bad, lse_err, lse_bad);

  // Half the cases (those small enough for a second reference) again as a ragged, paged batch.
  if (rng() % 2 == 0 && double(B) * B * Hq * Lq * Lkv <= double(1 << 26))
    if (std::string e = check_layouts(c, k, program, cap, env, q, kk, v, rng); !e.empty()) return e;

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
  fa::rt::DeviceBuffer d_do(no * 2), d_dq(nq * 2), d_dk(nk * 2), d_dv(nv * 2);
  d_do.upload(g_out.bits.data(), no * 2);
  for (fa::rt::DeviceBuffer* b : {&d_dq, &d_dk, &d_dv}) b->memset8(0xff);
  fa::TensorView tdo(d_do.as<void>(), t, {B, Hq, Lq, s.dim_v}),
      tdq(d_dq.as<void>(), t, {B, Hq, Lq, s.dim_qk}), tdk(d_dk.as<void>(), t, {B, Hkv, Lkv, s.dim_qk}),
      tdv(d_dv.as<void>(), t, {B, Hkv, Lkv, s.dim_v});
  k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap);
  fa::rt::synchronize(nullptr);
  fa::ReferenceOptions rb = ro;
  if (grad)
    rb.score_grad = &*grad;
  else
    rb.score_mod = nullptr;
  rb.delta_out = out.data();  // delta from the kernel's own O, as tests/gpu/backward_test.cpp
  fa::ReferenceGrads g = fa::reference_attention_backward(rs, q.values.data(), kk.values.data(),
                                                          v.values.data(), dout_vals.data(), nullptr, rb);
  const double gtol = t == fa::DType::bf16 ? 3e-2 : 1e-2;
  std::string bad;
  for (auto [name, buf, n, r] :
       {std::tuple{"dq", &d_dq, nq, &g.dq}, {"dk", &d_dk, nk, &g.dk}, {"dv", &d_dv, nv, &g.dv}}) {
    Compared cg = compare(download(*buf, n, t), *r);
    if (cg.unexpected || cg.rel > gtol)
      bad += fmt::format("{} rel err {:.3e}, {} unexpected non-finite (first at {}); ", name, cg.rel,
                         cg.unexpected, cg.first_bad);
  }
  if (!bad.empty()) return fmt::format("backward vs float64 reference (bound {:.0e}): {}", gtol, bad);
  return "";
}

}  // namespace fa_fuzz
