// Shared pieces of fajit_gpu_tests: host 16-bit rounding (fajit/runtime/half.h), the mod
// variants under test with the captures they need (device copies for the kernel, host copies
// for the reference), and small device helpers. Everything here is header-only and test-only.
#pragma once

#include <gtest/gtest.h>
#include "device_tables.h"
#include "fa_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fajit/detail/interp.h"
#include "fajit/detail/program_impl.h"
#include "fajit/detail/reference.h"
#include "fajit/error.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/half.h"
#include "fajit/runtime/memory.h"

namespace fa_gpu_test {

// The GPU tests check the measured default kernels; autotuning has tests of its own
// (forward_test.cpp, Options::autotune explicit). A FAJIT_AUTOTUNE the caller set wins.
inline const bool g_autotune_off_by_default = [] { return setenv("FAJIT_AUTOTUNE", "0", 0) == 0; }();

// ---- host 16-bit conversions: fajit/runtime/half.h (round to nearest even, as the reference
// must see the exact values the GPU reads), with the tests' argument order ---------------------
inline uint16_t to_bits(fa::DType t, float f) { return fa::to_bits(f, t); }
inline float from_bits(fa::DType t, uint16_t b) { return fa::from_bits(b, t); }

// Poison patterns: every element a launch must write is set to these first.
constexpr uint16_t kPoison16 = 0xFFFF;       // NaN in f16 and bf16
constexpr uint32_t kPoison32 = 0x7fc00000u;  // f32 quiet NaN

inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// ---- captures: one set of values, bound to the kernel (device) and the reference (host) ----
class CaptureSet {
 public:
  void buffer_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    auto b = std::make_unique<Buf>();
    b->name = name, b->is_float = true, b->shape = std::move(shape), b->f = std::move(v);
    bufs_.push_back(std::move(b));
  }
  void buffer_i32(const std::string& name, std::vector<int64_t> shape, std::vector<int32_t> v) {
    auto b = std::make_unique<Buf>();
    b->name = name, b->is_float = false, b->shape = std::move(shape), b->i = std::move(v);
    bufs_.push_back(std::move(b));
  }
  void scalar_i32(const std::string& name, int32_t v) { si_[name] = v; }
  void scalar_f32(const std::string& name, float v) { sf_[name] = v; }

  // Copies every buffer to the device (once); needs a GPU. `strided`: every element lands at
  // twice its index, the gaps holding a poison value (NaN / INT_MIN), so the kernels see an
  // innermost stride of 2 and take their wide-captures twins (KernelSpec::wide_captures).
  void upload(bool strided = false) {
    for (auto& b : bufs_) {
      if (b->dev) continue;
      b->stride = strided ? 2 : 1;
      const size_t n = b->numel();
      std::vector<uint32_t> bits(n * b->stride, b->is_float ? 0x7fc00000u : 0x80000000u);
      for (size_t e = 0; e < n; ++e)
        std::memcpy(&bits[e * b->stride], b->is_float ? static_cast<const void*>(&b->f[e]) : &b->i[e], 4);
      b->dev = fa::rt::DeviceBuffer(bits.size() * 4);
      b->dev.upload(bits.data(), bits.size() * 4);
    }
  }
  fa::Captures captures() const {
    fa::Captures c;
    for (const auto& b : bufs_) {
      const fa::DType t = b->is_float ? fa::DType::f32 : fa::DType::i32;
      void* p = b->dev ? b->dev.as<void>() : nullptr;
      const int64_t s = b->stride;
      if (b->shape.size() == 1)
        c.buffer(b->name, fa::TensorView(p, t, {b->shape[0]}, {s}));
      else
        c.buffer(b->name, fa::TensorView(p, t, {b->shape[0], b->shape[1]}, {b->shape[1] * s, s}));
    }
    for (const auto& [n, v] : si_) c.scalar(n, v);
    for (const auto& [n, v] : sf_) c.scalar(n, v);
    return c;
  }
  fa::Bindings bindings() const {
    fa::Bindings env;
    for (const auto& b : bufs_) {
      if (b->is_float)
        env.buffer(b->name, fa::HostBuffer::f32(b->f.data(), b->shape));
      else
        env.buffer(b->name, fa::HostBuffer::i32(b->i.data(), b->shape));
    }
    for (const auto& [n, v] : si_) env.scalar_i32(n, v);
    for (const auto& [n, v] : sf_) env.scalar_f32(n, v);
    return env;
  }
  std::string describe() const {
    std::string s;
    for (const auto& [n, v] : si_) s += " " + n + "=" + std::to_string(v);
    for (const auto& [n, v] : sf_) s += " " + n + "=" + std::to_string(v);
    return s;
  }

 private:
  struct Buf {
    std::string name;
    bool is_float = true;
    std::vector<int64_t> shape;
    std::vector<float> f;
    std::vector<int32_t> i;
    fa::rt::DeviceBuffer dev;
    int64_t stride = 1;  // of the innermost dimension on the device (upload)
    size_t numel() const {
      size_t n = 1;
      for (int64_t d : shape) n *= size_t(d);
      return n;
    }
  };
  std::vector<std::unique_ptr<Buf>> bufs_;
  std::map<std::string, int32_t> si_;
  std::map<std::string, float> sf_;
};

// ---- the mod variants under test --------------------------------------------------------
struct Dims {
  int B = 1, H = 1, Lq = 1, Lkv = 1;
};

struct Variant {
  std::string name;
  std::function<fa::ScoreMod()> score;
  std::function<fa::MaskMod()> mask;
  // Fills the captures for these sizes; `param` (< 0: a default) is the variant's main knob.
  std::function<void(CaptureSet&, const Dims&, int param, std::mt19937&)> fill;
  int mask_batch = 0;  // expected BlockMask::batch(): 0 = 1 (broadcast), 1 = B
  int mask_heads = 0;  // expected BlockMask::heads(): 0 = 1 (broadcast), 1 = H
};

// Random document ids: consecutive documents of 1..max_len tokens, `n` ids.
inline std::vector<int32_t> random_docs(int n, int max_len, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::uniform_int_distribution<int> len(1, max_len);
  int doc = 0, left = len(rng);
  for (int i = 0; i < n; ++i) {
    if (left == 0) ++doc, left = len(rng);
    ids[size_t(i)] = doc, --left;
  }
  return ids;
}

inline const Variant& variant(const std::string& name) {
  static const std::vector<Variant> all = [] {
    using namespace fa;
    std::vector<Variant> v;
    auto none = [](CaptureSet&, const Dims&, int, std::mt19937&) {};
    v.push_back({"none", identity_score, noop_mask, none});
    v.push_back({"causal", identity_score, mods::causal, none});
    v.push_back({"causal_alibi", [] { return mods::alibi(); }, mods::causal,
                 [](CaptureSet& c, const Dims& d, int, std::mt19937&) { c.scalar_i32("num_heads", d.H); }});
    v.push_back({"alibi_slopes", [] { return mods::alibi(buffer<float>("slopes", 1)); }, noop_mask,
                 [](CaptureSet& c, const Dims& d, int, std::mt19937& rng) {
                   std::uniform_real_distribution<float> u(0.005f, 0.3f);
                   std::vector<float> s(size_t(d.H));
                   for (float& x : s) x = u(rng);
                   c.buffer_f32("slopes", {d.H}, s);
                 }});
    // A relative slope by head, score - slopes[h] * (q - kv) (codegen finds it kv-linear: the
    // kernels add the bias as one FMA from a per-tile base), with slopes that form must leave to
    // the plain one (+-inf, NaN, FLT_MAX, 1e12, and 1000.3 and 1e5: its base's rounding would move
    // the diagonal's bias, an exact 0, by up to 4e-3 and 0.5, the row's whole weight being there)
    // beside ordinary ones and -15.7, just inside the bound (kv_linear_rate_ok). param 1: the
    // finite ones only (rows stay finite: the backward's cases).
    v.push_back({"slope_extremes",
                 [] {
                   return ScoreMod{"slope_extremes", [](Score s, Index, Index h, Index q, Index kv) {
                                     return s - buffer<float>("slopes", 1)(h) * (q - kv);
                                   }};
                 },
                 mods::causal,
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937&) {
                   const float all[] = {0.0625f, INFINITY, -15.7f,    1.00003e5f,
                                        NAN,     3.0e38f,  -INFINITY, 1000.3f};
                   const float finite[] = {0.0625f, 1000.3f, -15.7f, 1e12f, -0.01f, 3.0e38f};
                   std::vector<float> s(size_t(d.H));
                   for (int h = 0; h < d.H; ++h) s[size_t(h)] = p == 1 ? finite[h % 6] : all[h % 8];
                   c.buffer_f32("slopes", {d.H}, s);
                 }});
    // A kv-linear score_mod whose rate reads q and b: the forward kernels and the dQ side gather
    // it per row; the dK/dV kernel keeps the plain form (kScoreKvRateByQ).
    v.push_back({"query_slope",
                 [] {
                   return ScoreMod{"query_slope", [](Score s, Index b, Index h, Index q, Index kv) {
                                     return s + (buffer<float>("slopes", 1)(h) + q * 1e-4f + b * 0.01f) *
                                                    (kv - q);
                                   }};
                 },
                 mods::causal,
                 [](CaptureSet& c, const Dims& d, int, std::mt19937& rng) {
                   std::uniform_real_distribution<float> u(-0.05f, 0.2f);
                   std::vector<float> s(size_t(d.H));
                   for (float& x : s) x = u(rng);
                   c.buffer_f32("slopes", {d.H}, s);
                 }});
    v.push_back({"document_softcap", [] { return mods::softcap(); }, [] { return mods::document(); },
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937& rng) {
                   // doc_ids[q] and doc_ids[kv] index one buffer: exactly max(Lq, Lkv) long, so
                   // any read of an out-of-range q or kv is out of bounds (memcheck sees it).
                   c.buffer_i32("doc_ids", {std::max(d.Lq, d.Lkv)},
                                random_docs(std::max(d.Lq, d.Lkv), p > 0 ? p : 300, rng));
                   c.scalar_f32("softcap", 2.5f);
                 }});
    // Causal packing with per-batch documents: doc_ids [B, max(Lq, Lkv)] (b-dependent mask).
    v.push_back({"document2d_causal", identity_score,
                 [] {
                   return MaskMod{"document2d_causal", [](Index b, Index, Index q, Index kv) {
                                    auto doc = buffer<int32_t>("doc_ids", 2);
                                    return q >= kv && doc(b, q) == doc(b, kv);
                                  }};
                 },
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937& rng) {
                   const int n = std::max(d.Lq, d.Lkv);
                   std::vector<int32_t> ids;
                   for (int b = 0; b < d.B; ++b) {
                     auto row = random_docs(n, p > 0 ? p : 200 + 150 * b, rng);
                     ids.insert(ids.end(), row.begin(), row.end());
                   }
                   c.buffer_i32("doc_ids", {d.B, n}, ids);
                 },
                 1, 0});
    v.push_back(
        {"sliding", identity_score, [] { return mods::sliding_window(); },
         [](CaptureSet& c, const Dims&, int p, std::mt19937&) { c.scalar_i32("window", p >= 0 ? p : 200); }});
    // Sliding window whose width grows with the head (h-dependent mask).
    v.push_back(
        {"head_sliding", identity_score,
         [] {
           return MaskMod{"head_sliding", [](Index, Index h, Index q, Index kv) {
                            Index w = scalar<int32_t>("window");
                            return q >= kv && q - kv <= w + h * 37;
                          }};
         },
         [](CaptureSet& c, const Dims&, int p, std::mt19937&) { c.scalar_i32("window", p >= 0 ? p : 50); }, 0,
         1});
    // Causal with the queries at the end of the keys (a decoding step over a KV cache):
    // q + offset >= kv, offset = Lkv - Lq by default.
    v.push_back({"causal_offset", identity_score,
                 [] {
                   return MaskMod{"causal_offset", [](Index, Index, Index q, Index kv) {
                                    return q + scalar<int32_t>("offset") >= kv;
                                  }};
                 },
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937&) {
                   c.scalar_i32("offset", p >= 0 ? p : std::max(0, d.Lkv - d.Lq));
                 }});
    // A mask that keeps one interval of keys a row (codegen's kMaskKvRange: the kernels mask a
    // partial tile by the row's two bounds), in every form it takes (kv - q, kv against a row
    // value, q - kv, a boolean of the row), with bounds per head at the ends of int32: a 40-key
    // window; q + INT_MAX, which wraps below 0 for every row but the first (the bound must be the
    // wrapped value, as mask_mod computes it); an empty interval (lo > hi: fully masked rows);
    // a window ahead of the diagonal [q + 200, q + 300]; q + INT_MIN (nothing); rows under 5 of
    // every fourth head empty. Fully masked rows, wrap-around and far-off bounds together.
    v.push_back({"kv_range_extremes", identity_score,
                 [] {
                   return MaskMod{"kv_range_extremes", [](Index, Index h, Index q, Index kv) {
                                    auto lo = buffer<int32_t>("lo", 1), hi = buffer<int32_t>("hi", 1),
                                         w = buffer<int32_t>("w", 1);
                                    return kv - q >= lo(h) && kv <= q + hi(h) && q - kv <= w(h) &&
                                           (h % 4 != 3 || q >= 5);
                                  }};
                 },
                 [](CaptureSet& c, const Dims& d, int, std::mt19937&) {
                   const int32_t imax = 2147483647, imin = -imax - 1;
                   const int32_t lo[] = {-40, imin, 3, -2000000000, -300, 1 - imax};
                   const int32_t hi[] = {0, imax, -3, 7, 300, imin};
                   const int32_t w[] = {1000000, imax, imax, 100, -200, imax};
                   std::vector<int32_t> l(size_t(d.H)), u(size_t(d.H)), x(size_t(d.H));
                   for (int h = 0; h < d.H; ++h)
                     l[size_t(h)] = lo[h % 6], u[size_t(h)] = hi[h % 6], x[size_t(h)] = w[h % 6];
                   c.buffer_i32("lo", {d.H}, l);
                   c.buffer_i32("hi", {d.H}, u);
                   c.buffer_i32("w", {d.H}, x);
                 },
                 0, 1});
    v.push_back({"prefix_lm", identity_score, [] { return mods::prefix_lm(); },
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937&) {
                   c.scalar_i32("prefix", p >= 0 ? p : std::max(1, d.Lkv / 3));
                 }});
    v.push_back({"padding", identity_score, [] { return mods::padding(); },
                 [](CaptureSet& c, const Dims& d, int p, std::mt19937&) {
                   c.scalar_i32("n_pad", p >= 0 ? p : d.Lq / 3);
                 }});
    v.push_back({"dilated", identity_score, [] { return mods::dilated_sliding_window(); },
                 [](CaptureSet& c, const Dims&, int p, std::mt19937&) {
                   c.scalar_i32("window", p >= 0 ? p : 200);
                   c.scalar_i32("dilation", 3);
                 }});
    // Causal with a per-head offset added to every score: 0, ±3e9 (all of a row's scores round
    // to one f32, the LSE is offset + log(n)), 2e7 (scores on a grid of 2), -1e10, 5e4. Rows of
    // such magnitude once overflowed the softmax's exp2 to inf (the GPU fuzzer's find): the
    // kernels form p exactly from |m·log2 e| >= 2^24.
    v.push_back({"head_offset",
                 [] {
                   return ScoreMod{"head_offset", [](Score s, Index, Index h, Index, Index) {
                                     return s + buffer<float>("offset", 1)(h);
                                   }};
                 },
                 mods::causal,
                 [](CaptureSet& c, const Dims& d, int, std::mt19937&) {
                   const float cycle[] = {0.f, 3e9f, -3e9f, 2e7f, -1e10f, 5e4f};
                   std::vector<float> off(size_t(d.H));
                   for (int h = 0; h < d.H; ++h) off[size_t(h)] = cycle[h % 6];
                   c.buffer_f32("offset", {d.H}, off);
                 }});
    // Causal with score + score / score: a padded query row past len_q (zero Q, score 0) gives
    // 0/0 = NaN there, which once reached dK/dV through a P = exp2(NaN) (the GPU fuzzer's find):
    // the backward's P is 0 past len_q whatever the score.
    v.push_back(
        {"self_ratio",
         [] {
           return ScoreMod{"self_ratio", [](Score s, Index, Index, Index, Index) { return s + s / s; }};
         },
         mods::causal, none});
    // Causal with a +inf score at key 5 in head 1 and a NaN one at key 9 in head 2's even rows:
    // those rows' O and LSE are NaN (softmax's), their max_scores +inf and NaN; the other rows
    // and heads are plain causal.
    v.push_back({"inf_nan_keys",
                 [] {
                   return ScoreMod{"inf_nan_keys", [](Score s, Index, Index h, Index q, Index kv) {
                                     return where(h == 1 && kv == 5, Score(INFINITY),
                                                  where(h == 2 && kv == 9 && q % 2 == 0, Score(NAN), s));
                                   }};
                 },
                 mods::causal, none});
    // score + ramp·kv (ramp = param / 1000, default 0.03): each 128-key tile's max lies a few
    // log2 units above the last one's, so the online softmax keeps its reference for a tile or
    // two (p up to 2^8 in the P·V) and then moves it, with O rescaled by far more than usual.
    v.push_back({"kv_ramp",
                 [] {
                   return ScoreMod{"kv_ramp", [](Score s, Index, Index, Index, Index kv) {
                                     return s + scalar<float>("ramp") * kv;
                                   }};
                 },
                 noop_mask,
                 [](CaptureSet& c, const Dims&, int p, std::mt19937&) {
                   c.scalar_f32("ramp", p >= 0 ? float(p) * 1e-3f : 0.03f);
                 }});
    // Per-key values only (a key-padding mask and a per-key bias, both by (b, kv)): codegen's
    // column values, which the kernels gather across a warp ahead of the scores and shuffle to
    // the lanes that need them (a float for score_mod, a bool for mask_mod). The buffers are
    // exactly [B, Lkv]: an out-of-range kv reads out of bounds. key_pad_bias is causal as well;
    // key_keep_bias is not (decoding: every key a query sees is in a partial block).
    auto key_bias = [] {
      return ScoreMod{"key_bias", [](Score s, Index b, Index, Index, Index kv) {
                        return s + buffer<float>("kbias", 2)(b, kv);
                      }};
    };
    auto key_values = [](CaptureSet& c, const Dims& d, int, std::mt19937& rng) {
      std::uniform_real_distribution<float> u(-2.f, 2.f);
      std::bernoulli_distribution kept(0.8);
      std::vector<float> bias(size_t(d.B) * size_t(d.Lkv));
      std::vector<int32_t> keep(bias.size());
      for (size_t i = 0; i < bias.size(); ++i) bias[i] = u(rng), keep[i] = kept(rng) ? 1 : 0;
      c.buffer_f32("kbias", {d.B, d.Lkv}, bias);
      c.buffer_i32("keep", {d.B, d.Lkv}, keep);
    };
    v.push_back({"key_pad_bias", key_bias,
                 [] {
                   return MaskMod{"key_pad_causal", [](Index b, Index, Index q, Index kv) {
                                    return q >= kv && buffer<int32_t>("keep", 2)(b, kv) > 0;
                                  }};
                 },
                 key_values, 1, 0});
    v.push_back({"key_keep_bias", key_bias,
                 [] {
                   return MaskMod{"key_keep", [](Index b, Index, Index, Index kv) {
                                    return buffer<int32_t>("keep", 2)(b, kv) > 0;
                                  }};
                 },
                 key_values, 1, 0});
    v.push_back({"relative_bias", [] { return mods::relative_bias(); }, noop_mask,
                 [](CaptureSet& c, const Dims& d, int, std::mt19937& rng) {
                   // Exactly Lq + Lkv - 1 entries: an out-of-range q or kv reads out of bounds.
                   std::uniform_real_distribution<float> u(-1.5f, 1.5f);
                   std::vector<float> bias(size_t(d.Lq + d.Lkv - 1));
                   for (float& x : bias) x = u(rng);
                   c.buffer_f32("rel_bias", {d.Lq + d.Lkv - 1}, bias);
                   c.scalar_i32("rel_offset", d.Lkv - 1);
                 }});
    return v;
  }();
  for (const Variant& x : all)
    if (x.name == name) return x;
  throw std::runtime_error("no variant " + name);
}

// The interpreter programs of a kernel's own mods (the same fa IR the CUDA came from).
struct ModPrograms {
  fa::ModProgram score, mask;
};
inline ModPrograms mod_programs(const fa::Program& p) {
  return {fa::ModProgram::compile(p.impl().score.getOperation()),
          fa::ModProgram::compile(p.impl().mask.getOperation())};
}

// Calls `f` and returns fa::Error's message ("" when it does not throw, "<other>: ..." for
// any other exception).
using fa::test::device_tables_of;
using fa::test::DeviceTablesMask;
using fa::test::error_of;

}  // namespace fa_gpu_test
