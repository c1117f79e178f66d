// The fuzzer's GPU mode (fuzz.h check_gpu): the case's kernels on random inputs against the
// float64 reference, forward (out, lse) and backward (dQ, dK, dV) where the score_mod has a
// derivative, with the tolerances of fajit run / tests/gpu (bf16 1e-2, f16 5e-3 relative for
// out, 2e-2 absolute for lse; gradients bf16 3e-2, f16 1e-2). Outputs are poisoned (NaN) first,
// and NaN/inf are checked elementwise: a value may be non-finite only where the reference's is.
#include <cmath>
#include <optional>
#include <random>
#include <tuple>

#include <fmt/format.h>

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

  // Captures: the case's buffers on the device, its scalars.
  fa::Captures cap;
  std::vector<fa::rt::DeviceBuffer> keep;
  for (const BufferSpec& b : c.buffers) {
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
  // The backward's head-dim limit (dK and dV in registers) is pinned by the unit tests.
  if (fa::head_dim_mma(s.dim_qk) + fa::head_dim_mma(s.dim_v) > 256) return "";
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
