// `fajit run`: compiles one variant, runs it on the GPU on fresh random inputs, checks it
// against the float64 CPU reference and times it. Without a GPU it says why and succeeds, so
// the main job works on any machine.
#include "run_cmd.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "fajit/detail/interp.h"
#include "fajit/detail/reference.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/half.h"
#include "fajit/runtime/memory.h"

namespace fajit_cli {
namespace {

// Relative error ||got - ref|| / ||ref|| of a 16-bit device tensor, and its NaN count.
std::pair<double, size_t> rel_error(const fa::rt::DeviceBuffer& buf, const std::vector<double>& ref,
                                    fa::DType t) {
  std::vector<uint16_t> bits(ref.size());
  buf.download(bits.data(), bits.size() * 2);
  double num = 0, den = 0;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = fa::from_bits(bits[i], t);
    if (std::isnan(g)) ++bad;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), bad};
}

// Median wall time of `iters` calls of f after 3 warm-up calls, synchronizing around each.
template <typename F>
double median_ms(int iters, F&& f) {
  std::vector<double> times;
  for (int i = 0; i < 3 + iters; ++i) {
    fa::rt::synchronize(nullptr);
    auto s = std::chrono::steady_clock::now();
    f();
    fa::rt::synchronize(nullptr);
    if (i >= 3)
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int run_variant(const RunOptions& o) {
  if (!fa::rt::cuda_available()) {
    std::cout << "no GPU here (" << fa::rt::cuda_unavailable_reason() << "): skipping the run\n";
    return 0;
  }
  fa::Options copts;
  copts.dtype = o.dtype;
  const int DQK = o.head_dim, DV = o.head_dim_v ? o.head_dim_v : o.head_dim;
  copts.head_dim_qk = DQK;
  copts.head_dim_v = DV;
  auto mask_p = fa::mods::mask_preset(o.mask.empty() ? "noop" : o.mask);
  auto score_p = fa::mods::score_preset(o.score.empty() ? "identity" : o.score);
  fa::Program program = fa::trace(score_p.mod, mask_p.mod);

  auto t0 = std::chrono::steady_clock::now();
  fa::Kernel k = fa::compile(program, copts);
  double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::rt::ContextGuard guard;
  std::cout << fmt::format("device: {}  kernel: {}  ({} in {:.1f} ms)\n", fa::rt::current_device_info().name,
                           k.spec().to_string(), fa::to_string(k.origin()), compile_ms);

  const int B = o.batch, H = o.heads, L = o.len;
  std::mt19937 rng(std::random_device{}());
  const size_t rows = static_cast<size_t>(B) * H * L, n_qk = rows * DQK, n_v = rows * DV;
  fa::RoundedTensor q = fa::random_rounded(n_qk, o.dtype, rng), kk = fa::random_rounded(n_qk, o.dtype, rng),
                    v = fa::random_rounded(n_v, o.dtype, rng);

  // Captures with defaults for whatever the preset did not fix.
  fa::Captures cap;
  fa::Bindings env;
  std::vector<int32_t> doc_ids(L);
  std::vector<float> slopes(H), rel_bias(2 * L - 1);
  for (int i = 0, doc = 0; i < L; ++i) {
    if (i > 0 && rng() % 97 == 0) ++doc;
    doc_ids[i] = doc;
  }
  for (float& s : slopes) s = std::ldexp(1.0f, -static_cast<int>(rng() % 8) - 1);
  for (float& r : rel_bias) r = std::normal_distribution<float>(0.0f, 0.5f)(rng);
  std::vector<fa::rt::DeviceBuffer> keep;
  std::map<std::string, double> scalars = {{"num_heads", H}, {"softcap", 30.0}, {"rel_offset", L - 1},
                                           {"window", 256},  {"prefix", L / 4}, {"n_pad", 3},
                                           {"dilation", 2}};
  for (auto& [name, value] : mask_p.scalar_values) scalars[name] = value;
  for (auto& [name, value] : score_p.scalar_values) scalars[name] = value;
  for (const fa::CaptureSlot& s : k.capture_slots()) {
    if (s.is_buffer) {
      const void* src = s.name == "doc_ids"  ? static_cast<const void*>(doc_ids.data())
                        : s.name == "slopes" ? static_cast<const void*>(slopes.data())
                                             : static_cast<const void*>(rel_bias.data());
      int64_t len = s.name == "doc_ids" ? L : s.name == "slopes" ? H : 2 * L - 1;
      keep.emplace_back(static_cast<size_t>(len) * 4);
      keep.back().upload(src, static_cast<size_t>(len) * 4);
      cap.buffer(s.name,
                 fa::TensorView(keep.back().as<void>(), s.is_float ? fa::DType::f32 : fa::DType::i32, {len}));
      if (s.is_float)
        env.buffer(s.name, fa::HostBuffer::f32(static_cast<const float*>(src), {len}));
      else
        env.buffer(s.name, fa::HostBuffer::i32(static_cast<const int32_t*>(src), {len}));
    } else if (s.is_float) {
      cap.scalar(s.name, static_cast<float>(scalars.at(s.name)));
      env.scalar_f32(s.name, static_cast<float>(scalars.at(s.name)));
    } else {
      cap.scalar(s.name, static_cast<int32_t>(scalars.at(s.name)));
      env.scalar_i32(s.name, static_cast<int32_t>(scalars.at(s.name)));
    }
  }

  const size_t bytes_qk = n_qk * 2, bytes_v = n_v * 2;
  fa::rt::DeviceBuffer dq(bytes_qk), dk(bytes_qk), dv(bytes_v), dout(bytes_v), dlse(rows * 4);
  dq.upload(q.bits.data(), bytes_qk);
  dk.upload(kk.bits.data(), bytes_qk);
  dv.upload(v.bits.data(), bytes_v);
  dout.memset8(0xff);  // poison: NaN in both fp16 and bf16
  dlse.memset8(0xff);
  fa::TensorView tq(dq.as<void>(), o.dtype, {B, H, L, DQK}), tk(dk.as<void>(), o.dtype, {B, H, L, DQK}),
      tv(dv.as<void>(), o.dtype, {B, H, L, DV}), to(dout.as<void>(), o.dtype, {B, H, L, DV}),
      tl(dlse.as<void>(), fa::DType::f32, {B, H, L});

  t0 = std::chrono::steady_clock::now();
  fa::BlockMask mask = k.block_mask(B, H, L, L, cap);
  double mask_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::ForwardOptions fo;
  fo.lse = &tl;
  k.forward(tq, tk, tv, to, mask, cap, fo);
  fa::rt::synchronize(nullptr);
  std::vector<uint16_t> out(n_v);
  std::vector<float> lse(rows);
  dout.download(out.data(), bytes_v);
  dlse.download(lse.data(), lse.size() * 4);

  fa::ModProgram sp = fa::ModProgram::score_of(program);
  fa::ModProgram mp = fa::ModProgram::mask_of(program);
  fa::ReferenceOptions ro;
  ro.score_mod = &sp;
  ro.mask_mod = &mp;
  ro.bindings = &env;
  fa::ReferenceResult ref = fa::reference_attention({B, H, H, L, L, DQK, DV}, q.values.data(),
                                                    kk.values.data(), v.values.data(), ro);
  double num = 0, den = 0, lse_err = 0;
  size_t bad = 0;
  for (size_t i = 0; i < n_v; ++i) {
    double g = fa::from_bits(out[i], o.dtype);
    if (std::isnan(g)) ++bad;
    num += (g - ref.out[i]) * (g - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      if (!(std::isinf(lse[i]) && lse[i] < 0)) ++bad;
    } else {
      lse_err = std::max(lse_err, std::fabs(lse[i] - ref.lse[i]));
    }
  }
  double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  double tol = o.dtype == fa::DType::bf16 ? 1e-2 : 5e-3;
  bool ok = bad == 0 && rel < tol && lse_err < 2e-2;
  auto d = mask.density();
  std::cout << fmt::format(
      "B={} H={} L={} D={}/{}  block mask: {:.1f}% dense ({} full, {} partial, {} empty) in {:.2f} ms\n", B,
      H, L, DQK, DV, 100.0 * d.fraction, d.full, d.partial, d.empty, mask_ms);
  std::cout << fmt::format(
      "vs float64 reference: rel err {:.2e} (bound {:.0e}), max |lse err| {:.2e}, {} bad values: {}\n", rel,
      tol, lse_err, bad, ok ? "OK" : "MISMATCH");

  // Timing: warm-up, then the median of repeated launches.
  const double ms = median_ms(o.iters, [&] { k.forward(tq, tk, tv, to, mask, cap, fo); });
  double kept = 0;  // pairs kept by the mask for b = h = 0 (the presets do not depend on b, h)
  for (int qi = 0; qi < L; ++qi)
    for (int kv = 0; kv < L; ++kv) kept += mp.eval_mask(0, 0, qi, kv, env) ? 1 : 0;
  double flops = 2.0 * B * H * kept * (DQK + DV);
  std::cout << fmt::format(
      "forward: {:.3f} ms (median of {}), {:.1f} TFLOP/s on the unmasked work (host-timed)\n", ms, o.iters,
      flops / ms / 1e9);
  if (!o.backward) return ok ? 0 : 1;

  // ---- backward: random dO, gradients into poisoned buffers, each checked against float64.
  fa::RoundedTensor g_out = fa::random_rounded(n_v, o.dtype, rng);
  std::vector<double> dout_vals(g_out.values.begin(), g_out.values.end());
  fa::rt::DeviceBuffer d_do(bytes_v), d_dq(bytes_qk), d_dk(bytes_qk), d_dv(bytes_v);
  d_do.upload(g_out.bits.data(), bytes_v);
  for (fa::rt::DeviceBuffer* b : {&d_dq, &d_dk, &d_dv}) b->memset8(0xff);
  fa::TensorView tdo(d_do.as<void>(), o.dtype, {B, H, L, DV}), tdq(d_dq.as<void>(), o.dtype, {B, H, L, DQK}),
      tdk(d_dk.as<void>(), o.dtype, {B, H, L, DQK}), tdv(d_dv.as<void>(), o.dtype, {B, H, L, DV});
  fa::rt::synchronize(nullptr);
  t0 = std::chrono::steady_clock::now();
  k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap);
  fa::rt::synchronize(nullptr);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::ReferenceOptions rb = ro;
  std::optional<fa::ModProgram> grad;
  if (program.score_is_identity()) {
    rb.score_mod = nullptr;
  } else {
    grad.emplace(fa::ModProgram::grad_of(program));
    rb.score_grad = &*grad;
  }
  std::vector<double> o_vals(out.begin(), out.end());  // delta from the kernel's own O
  for (size_t i = 0; i < n_v; ++i) o_vals[i] = fa::from_bits(out[i], o.dtype);
  rb.delta_out = o_vals.data();
  const fa::ReferenceGrads g =
      fa::reference_attention_backward({B, H, H, L, L, DQK, DV}, q.values.data(), kk.values.data(),
                                       v.values.data(), dout_vals.data(), nullptr, rb);
  const double gtol = o.dtype == fa::DType::bf16 ? 3e-2 : 1e-2;
  bool gok = true;
  std::string line;
  for (auto [name, buf, ref] : {std::tuple{"dq", &d_dq, &g.dq}, {"dk", &d_dk, &g.dk}, {"dv", &d_dv, &g.dv}}) {
    auto [err, nan] = rel_error(*buf, *ref, o.dtype);
    gok = gok && nan == 0 && err < gtol;
    line += fmt::format("{} {:.2e}{} ", name, err, nan ? fmt::format(" ({} NaN)", nan) : "");
  }
  std::cout << fmt::format("backward: {} (first call, compile included: {:.0f} ms)\n",
                           k.backward_spec().to_string(), first_ms);
  std::cout << fmt::format("gradients vs float64 reference: rel err {}(bound {:.0e}): {}\n", line, gtol,
                           gok ? "OK" : "MISMATCH");
  const double bms =
      median_ms(o.iters, [&] { k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap); });
  std::cout << fmt::format(
      "backward: {:.3f} ms (median of {}), {:.1f} TFLOP/s (2.5x the forward's FLOPs, host-timed)\n", bms,
      o.iters, 2.5 * flops / bms / 1e9);
  return ok && gok ? 0 : 1;
}

}  // namespace fajit_cli
