// `fajit run`: compiles one variant, runs it on the GPU on fresh random inputs, checks it
// against the float64 CPU reference and times it. Without a GPU it says why and succeeds, so
// the main job works on any machine.
#include "run_cmd.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "fajit/detail/interp.h"
#include "fajit/detail/mask_analysis.h"
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

// What the command line gives the mods' captures.
struct ModData {
  std::map<std::string, double> scalars;        // the presets' values, then --scalar's
  std::map<std::string, double> given_scalars;  // --scalar's alone (checked against the mods)
  std::map<std::string, BufferArg> buffers;     // --buffer's
};

ModData mod_data(const RunOptions& o) {
  ModData d;
  d.scalars = preset_scalar_values(o.mods);
  add_scalar_args(o.scalars, d.given_scalars);
  for (const auto& [name, v] : d.given_scalars) d.scalars[name] = v;
  d.buffers = parse_buffer_args(o.buffers);
  return d;
}

// Each runtime scalar's value: --scalar's, else the presets', else a default by name (the
// presets' knobs).
std::map<std::string, double> scalar_values(const ModData& mods, int H, int L) {
  std::map<std::string, double> v = {{"num_heads", H}, {"softcap", 30.0}, {"rel_offset", L - 1},
                                     {"window", 256},  {"prefix", L / 4}, {"n_pad", 3},
                                     {"dilation", 2}};
  for (auto& [name, value] : mods.scalars) v[name] = value;
  return v;
}

// A buffer's shape: --buffer's, else a preset buffer's by name (doc ids over L positions,
// per-head slopes, a relative bias over 2L - 1 offsets).
std::vector<int64_t> buffer_shape(const fa::Program::Capture& c, const ModData& mods, int H, int L) {
  if (auto it = mods.buffers.find(c.name); it != mods.buffers.end()) {
    const size_t dims = it->second.shape.size();
    if (int(dims) != c.rank)
      throw fa::Error(
          fmt::format("--buffer '{}': the mods index '{}' with {} ind{}; the shape has {} dimension{}",
                      c.name, c.name, c.rank, c.rank == 1 ? "ex" : "ices", dims, dims == 1 ? "" : "s"));
    return it->second.shape;
  }
  if (c.rank == 1 && c.name == "doc_ids" && !c.is_float) return {L};
  if (c.rank == 1 && c.name == "slopes" && c.is_float) return {H};
  if (c.rank == 1 && c.name == "rel_bias" && c.is_float) return {2 * int64_t(L) - 1};
  throw fa::Error(
      fmt::format("buffer '{}' has no shape; give --buffer {}=D1[xD2...][:LO:HI]", c.name, c.name));
}

// Before any GPU work: every capture of the mods has data, every --buffer / --scalar names one.
void check_capture_args(const fa::Program& program, const ModData& mods, int H, int L) {
  auto find = [&](const std::string& name, bool buffer) {
    for (const fa::Program::Capture& c : program.captures())
      if (c.name == name && c.is_buffer == buffer) return true;
    return false;
  };
  for (const auto& entry : mods.buffers)
    if (!find(entry.first, true))
      throw fa::Error(
          fmt::format("--buffer '{}': the mods capture no buffer '{}'", entry.first, entry.first));
  for (const auto& entry : mods.given_scalars)
    if (!find(entry.first, false))
      throw fa::Error(
          fmt::format("--scalar '{}': the mods capture no scalar '{}'", entry.first, entry.first));
  const std::map<std::string, double> values = scalar_values(mods, H, L);
  for (const fa::Program::Capture& c : program.captures()) {
    if (c.is_buffer)
      (void)buffer_shape(c, mods, H, L);
    else if (!values.count(c.name))
      throw fa::Error(fmt::format("scalar '{}' has no value; give --scalar {}=VALUE", c.name, c.name));
  }
}

// A buffer's values: --buffer's uniform ones (default -1..1 for f32, 0..7 for i32), else a preset
// buffer's (documents of ~97 positions, slopes 2^-1..2^-8, a bias ~ N(0, 0.5)); f32 or i32 bits.
void fill_buffer(std::vector<uint32_t>& out, const fa::Program::Capture& c, const ModData& mods,
                 std::mt19937& rng) {
  auto put_f = [&](size_t i, float f) { std::memcpy(&out[i], &f, 4); };
  auto put_i = [&](size_t i, int32_t v) { std::memcpy(&out[i], &v, 4); };
  if (auto it = mods.buffers.find(c.name); it != mods.buffers.end()) {
    const BufferArg& b = it->second;
    if (c.is_float) {
      std::uniform_real_distribution<double> u(b.has_range ? b.lo : -1.0, b.has_range ? b.hi : 1.0);
      for (size_t i = 0; i < out.size(); ++i) put_f(i, static_cast<float>(u(rng)));
    } else {
      const double lo = b.has_range ? std::ceil(b.lo) : 0, hi = b.has_range ? std::floor(b.hi) : 7;
      if (lo > hi || lo < -2147483648.0 || hi > 2147483647.0)
        throw fa::Error(fmt::format("--buffer '{}': [{}, {}] holds no int32", c.name, b.lo, b.hi));
      std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(lo), static_cast<int64_t>(hi));
      for (size_t i = 0; i < out.size(); ++i) put_i(i, static_cast<int32_t>(u(rng)));
    }
  } else if (c.name == "doc_ids") {
    for (size_t i = 0, doc = 0; i < out.size(); ++i) {
      if (i > 0 && rng() % 97 == 0) ++doc;
      put_i(i, static_cast<int32_t>(doc));
    }
  } else if (c.name == "slopes") {
    for (size_t i = 0; i < out.size(); ++i) put_f(i, std::ldexp(1.0f, -static_cast<int>(rng() % 8) - 1));
  } else {
    for (size_t i = 0; i < out.size(); ++i) put_f(i, std::normal_distribution<float>(0.0f, 0.5f)(rng));
  }
}

// Positions 0..n-1 for a check: all of them, or (past `most`) both ends and an even grid between.
std::vector<int> positions(int n, int most) {
  std::vector<int> p;
  const int step = n <= most ? 1 : (n + most - 1) / most;
  for (int i = 0; i < n; i += step) p.push_back(i);
  if (p.back() != n - 1) p.push_back(n - 1);
  return p;
}

// With --buffer shapes the user's, every index the mods form must fall inside them: checked on
// the CPU before the GPU reads them (an index past a shape would read out of bounds there). Both
// mods at every (q, kv) — score_mod masked or not, as the kernels evaluate it — for b in {0,
// B-1} and h in {0, H-1}; past 2^22 (q, kv) pairs on a grid that keeps both ends. The
// interpreter's error names the capture, the index and the dimension.
void check_buffer_indices(const fa::Program& program, const fa::Bindings& env, const ModData& mods, int B,
                          int H, int Lq, int Lkv) {
  if (mods.buffers.empty()) return;
  const fa::BoundMod score = fa::ModProgram::score_of(program).bind(env);
  const fa::BoundMod mask = fa::ModProgram::mask_of(program).bind(env);
  const std::vector<int> qs = positions(Lq, 2048), kvs = positions(Lkv, 2048);
  for (int b : {0, B - 1})
    for (int h : {0, H - 1})
      for (int q : qs)
        for (int kv : kvs) try {
            (void)score.score(0.5f, b, h, q, kv);
            (void)mask.mask(b, h, q, kv);
          } catch (const fa::Error& e) {
            throw fa::Error(
                fmt::format("{} (at b={}, h={}, q={}, kv={}); give --buffer shapes that cover every "
                            "index the mods form",
                            e.what(), b, h, q, kv));
          }
}

// The mods' captures (check_capture_args passed) on the device for the kernel (cap) and on the
// host for the reference (env).
struct CaptureData {
  fa::Captures cap;
  fa::Bindings env;
  std::vector<std::unique_ptr<std::vector<uint32_t>>> host;  // each buffer's values (f32 or i32 bits)
  std::vector<fa::rt::DeviceBuffer> keep;

  CaptureData(const fa::Program& program, const ModData& mods, int H, int L, std::mt19937& rng) {
    const std::map<std::string, double> scalars = scalar_values(mods, H, L);
    keep.reserve(program.captures().size());
    for (const fa::Program::Capture& c : program.captures()) {
      if (c.is_buffer) {
        const std::vector<int64_t> shape = buffer_shape(c, mods, H, L);
        fa::TensorView view;  // contiguous
        view.dtype = c.is_float ? fa::DType::f32 : fa::DType::i32;
        view.rank = static_cast<int>(shape.size());
        int64_t n = 1;
        for (int d = view.rank - 1; d >= 0; n *= shape[size_t(d)], --d)
          view.shape[d] = shape[size_t(d)], view.stride[d] = n;
        auto values = std::make_unique<std::vector<uint32_t>>(static_cast<size_t>(n));
        fill_buffer(*values, c, mods, rng);
        keep.emplace_back(static_cast<size_t>(n) * 4);
        keep.back().upload(values->data(), static_cast<size_t>(n) * 4);
        view.data = keep.back().as<void>();
        cap.buffer(c.name, view);
        if (c.is_float)
          env.buffer(c.name, fa::HostBuffer::f32(reinterpret_cast<const float*>(values->data()), shape));
        else
          env.buffer(c.name, fa::HostBuffer::i32(reinterpret_cast<const int32_t*>(values->data()), shape));
        host.push_back(std::move(values));
      } else if (const double v = scalars.at(c.name); c.is_float) {
        cap.scalar(c.name, static_cast<float>(v));
        env.scalar_f32(c.name, static_cast<float>(v));
      } else {
        cap.scalar(c.name, fa::i32_scalar_value(c.name, v));
        env.scalar_i32(c.name, fa::i32_scalar_value(c.name, v));
      }
    }
  }
};

// max_scores against the float64 reference's: -inf / +inf / NaN exactly where it has them, else
// within 5e-4 + |ref|·2^-18 (tests/gpu/forward_test.cpp's bound).
struct MaxCheck {
  size_t bad = 0;
  double err = 0;
  void add(float got, double want) {
    if (std::isnan(want)) {
      bad += !std::isnan(got);
    } else if (std::isinf(want)) {
      bad += double(got) != want;
    } else {
      const double e = std::isnan(got) ? INFINITY : std::fabs(double(got) - want);
      err = std::max(err, e);
      bad += !(e < 5e-4 + std::fabs(want) * 0x1p-18);
    }
  }
  std::string line() const { return fmt::format(", max |max_scores err| {:.2e} ({} bad)", err, bad); }
};

// `fajit run` with per-sequence lengths, GQA, a forced kernel path, a ragged batch or a paged
// KV cache: every sequence checked against the float64 reference of that sequence alone, then
// timed; with --backward (not paged) the gradients likewise.
// --deterministic: the gradients a backward left in `grads`, then again from a second run into
// re-poisoned buffers, compared bit for bit; prints the verdict.
bool same_bits_again(std::initializer_list<fa::rt::DeviceBuffer*> grads,
                     const std::function<void()>& backward) {
  std::vector<std::vector<unsigned char>> first;
  for (fa::rt::DeviceBuffer* g : grads) {
    first.emplace_back(g->size());
    g->download(first.back().data(), first.back().size());
    g->memset8(0xff);
  }
  backward();
  fa::rt::synchronize(nullptr);
  size_t differ = 0, i = 0;
  for (fa::rt::DeviceBuffer* g : grads) {
    std::vector<unsigned char> again(g->size());
    g->download(again.data(), again.size());
    for (size_t j = 0; j < again.size(); ++j) differ += again[j] != first[i][j] ? 1 : 0;
    ++i;
  }
  std::cout << fmt::format(
      "deterministic: dq, dk, dv of a second run {}\n",
      differ ? fmt::format("differ in {} bytes: MISMATCH", differ) : "bit-identical: OK");
  return differ == 0;
}

int run_sequences(const RunOptions& o, const fa::Kernel& k, const fa::Program& program, const ModData& mods) {
  const int B = o.batch, Hq = o.heads, Hkv = o.heads_kv ? o.heads_kv : o.heads;
  const int max_q = o.len_q ? o.len_q : o.len, max_kv = o.len_kv ? o.len_kv : o.len;
  const int DQK = o.head_dim, DV = o.head_dim_v ? o.head_dim_v : o.head_dim;
  if (Hq % Hkv != 0) {
    std::cerr << fmt::format("fajit run: --heads ({}) must be a multiple of --heads-kv ({})\n", Hq, Hkv);
    return 2;
  }
  std::mt19937 rng(o.seed >= 0 ? static_cast<unsigned>(o.seed) : std::random_device{}());
  // Lengths: all equal, or (--varlen) random with one sequence at each maximum and, from 3
  // sequences on, one of length 0 and one of length 1.
  std::vector<int32_t> lq(B, max_q), lk(B, max_kv);
  if (o.varlen) {
    for (int b = 0; b < B; ++b) {
      lq[b] = static_cast<int32_t>(rng() % (max_q + 1));
      lk[b] = static_cast<int32_t>(rng() % (max_kv + 1));
    }
    lq[0] = max_q, lk[0] = max_kv;
    if (B >= 3) lq[1] = lk[1] = 0, lq[2] = lk[2] = 1;
  }
  std::vector<int32_t> cu_q(B + 1, 0), cu_k(B + 1, 0);
  for (int b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + lq[b], cu_k[b + 1] = cu_k[b] + lk[b];
  const int64_t tq = std::max(cu_q[B], 1), tk = std::max(cu_k[B], 1);

  // Rows stored packed [total, H, D] (a dense batch is the same memory as [B, L, H, D]).
  fa::RoundedTensor q = fa::random_rounded(size_t(tq) * Hq * DQK, o.dtype, rng),
                    kk = fa::random_rounded(size_t(tk) * Hkv * DQK, o.dtype, rng),
                    v = fa::random_rounded(size_t(tk) * Hkv * DV, o.dtype, rng);
  CaptureData captures(program, mods, Hq, std::max(max_q, max_kv), rng);
  check_buffer_indices(program, captures.env, mods, B, Hq, max_q, max_kv);

  // The paged pool: each sequence's keys in pages of --paged keys, shuffled over the pool.
  const int ps = o.page_size;
  const int max_pages = ps ? (max_kv + ps - 1) / ps : 0;
  std::vector<int32_t> table(size_t(B) * std::max(max_pages, 1), 0);
  int num_pages = 0;
  std::vector<uint16_t> k_pool, v_pool;
  if (ps) {
    for (int b = 0; b < B; ++b) num_pages += (lk[b] + ps - 1) / ps;
    num_pages = std::max(num_pages, 1);
    std::vector<int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int b = 0, next = 0; b < B; ++b)
      for (int j = 0; j * ps < lk[b]; ++j) table[size_t(b) * max_pages + j] = perm[next++];
    auto scatter = [&](const fa::RoundedTensor& t, int D) {
      std::vector<uint16_t> pool(size_t(num_pages) * ps * Hkv * D);
      for (int b = 0; b < B; ++b)
        for (int kv = 0; kv < lk[b]; ++kv)
          std::memcpy(
              &pool[size_t((int64_t(table[size_t(b) * max_pages + kv / ps]) * ps + kv % ps) * Hkv * D)],
              &t.bits[size_t(int64_t(cu_k[b] + kv) * Hkv * D)], size_t(Hkv) * D * 2);
      return pool;
    };
    k_pool = scatter(kk, DQK), v_pool = scatter(v, DV);
  }

  auto upload = [](const void* host, size_t bytes) {
    fa::rt::DeviceBuffer d(std::max<size_t>(bytes, 16));
    d.upload(host, bytes);
    return d;
  };
  fa::rt::DeviceBuffer dq = upload(q.bits.data(), q.bits.size() * 2),
                       dk = ps ? upload(k_pool.data(), k_pool.size() * 2)
                               : upload(kk.bits.data(), kk.bits.size() * 2),
                       dv = ps ? upload(v_pool.data(), v_pool.size() * 2)
                               : upload(v.bits.data(), v.bits.size() * 2),
                       dcq = upload(cu_q.data(), cu_q.size() * 4), dck = upload(cu_k.data(), cu_k.size() * 4),
                       dlk = upload(lk.data(), lk.size() * 4), dpt = upload(table.data(), table.size() * 4);
  fa::rt::DeviceBuffer dout(size_t(tq) * Hq * DV * 2), dlse(size_t(tq) * Hq * 4), dmax(size_t(tq) * Hq * 4);
  dout.memset8(0xff);  // poison: NaN in both fp16 and bf16
  dlse.memset8(0xff);
  dmax.memset8(0xff);

  const fa::DType t = o.dtype;
  fa::TensorView cqv(dcq.as<void>(), fa::DType::i32, {B + 1}), ckv(dck.as<void>(), fa::DType::i32, {B + 1}),
      lkv(dlk.as<void>(), fa::DType::i32, {B}),
      ptv(dpt.as<void>(), fa::DType::i32, {B, std::max(max_pages, 1)});
  fa::TensorView tq4, tk4, tv4, to4, tl, tm;
  fa::ForwardOptions fo;
  fo.path = o.path == "prefill"  ? fa::ForwardPath::kPrefill
            : o.path == "decode" ? fa::ForwardPath::kDecode
                                 : fa::ForwardPath::kAuto;
  fo.decode_splits = o.splits;
  fa::Sequences& seq = fo.sequences;
  if (o.varlen) {
    tq4 = fa::TensorView(dq.as<void>(), t, {tq, Hq, DQK});
    to4 = fa::TensorView(dout.as<void>(), t, {tq, Hq, DV});
    tl = fa::TensorView(dlse.as<void>(), fa::DType::f32, {Hq, tq});
    tm = fa::TensorView(dmax.as<void>(), fa::DType::f32, {Hq, tq});
    seq.cu_seqlens_q = &cqv, seq.max_seqlen_q = max_q;
  } else {
    tq4 = fa::TensorView(dq.as<void>(), t, {B, Hq, max_q, DQK},
                         {int64_t(max_q) * Hq * DQK, DQK, int64_t(Hq) * DQK, 1});
    to4 = fa::TensorView(dout.as<void>(), t, {B, Hq, max_q, DV},
                         {int64_t(max_q) * Hq * DV, DV, int64_t(Hq) * DV, 1});
    tl = fa::TensorView(dlse.as<void>(), fa::DType::f32, {B, Hq, max_q});
    tm = fa::TensorView(dmax.as<void>(), fa::DType::f32, {B, Hq, max_q});
  }
  if (ps) {
    tk4 = fa::TensorView(dk.as<void>(), t, {num_pages, ps, Hkv, DQK});
    tv4 = fa::TensorView(dv.as<void>(), t, {num_pages, ps, Hkv, DV});
    seq.page_table = &ptv, seq.seqlens_k = &lkv, seq.max_seqlen_k = max_kv;
  } else if (o.varlen) {
    tk4 = fa::TensorView(dk.as<void>(), t, {tk, Hkv, DQK});
    tv4 = fa::TensorView(dv.as<void>(), t, {tk, Hkv, DV});
    seq.cu_seqlens_k = &ckv, seq.max_seqlen_k = max_kv;
  } else {
    tk4 = fa::TensorView(dk.as<void>(), t, {B, Hkv, max_kv, DQK},
                         {int64_t(max_kv) * Hkv * DQK, DQK, int64_t(Hkv) * DQK, 1});
    tv4 = fa::TensorView(dv.as<void>(), t, {B, Hkv, max_kv, DV},
                         {int64_t(max_kv) * Hkv * DV, DV, int64_t(Hkv) * DV, 1});
  }
  // Tables (when there are any: a dense run with len_q != len_kv has none) are checked once
  // here; the timed launches reuse the same tables.
  seq.check_tables = seq.any();
  fo.lse = &tl;
  if (o.max_scores) fo.max_scores = &tm;

  auto t0 = std::chrono::steady_clock::now();
  fa::BlockMask mask = k.block_mask(B, Hq, max_q, max_kv, captures.cap);
  fa::rt::synchronize(nullptr);  // a mask the GPU builds is ready only when its stream has run
  const double mask_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  k.forward(tq4, tk4, tv4, to4, mask, captures.cap, fo);
  fa::rt::synchronize(nullptr);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (const fa::TuneRecord& r : k.tune_records()) std::cout << "autotune: " << fa::to_string(r) << "\n";
  std::vector<uint16_t> out(size_t(tq) * Hq * DV);
  std::vector<float> lse(size_t(tq) * Hq), mx(lse.size());
  dout.download(out.data(), out.size() * 2);
  dlse.download(lse.data(), lse.size() * 4);
  dmax.download(mx.data(), mx.size() * 4);
  MaxCheck max_check;

  // Each sequence against the float64 reference of that sequence (b = 0 for its mods unless
  // the mask reads b: then b + 1 batches over the same rows, the last kept).
  fa::ModProgram sp = fa::ModProgram::score_of(program), mp = fa::ModProgram::mask_of(program);
  double num = 0, den = 0, lse_err = 0;
  size_t bad = 0;
  const bool reads_b = mask.batch() > 1;
  for (int b = 0; b < B && !o.no_check; ++b) {
    if (lq[b] == 0) continue;
    auto o_at = [&](int h, int i) { return (size_t(cu_q[b] + i) * Hq + h) * DV; };
    auto l_at = [&](int h, int i) {
      return o.varlen ? size_t(h) * tq + cu_q[b] + i : (size_t(b) * Hq + h) * max_q + i;
    };
    if (lk[b] == 0) {  // no keys: O = 0, LSE = -inf
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < lq[b]; ++i) {
          for (int d = 0; d < DV; ++d) bad += fa::from_bits(out[o_at(h, i) + d], t) != 0.0;
          bad += !(std::isinf(lse[l_at(h, i)]) && lse[l_at(h, i)] < 0);
          if (o.max_scores) max_check.add(mx[l_at(h, i)], -INFINITY);
        }
      continue;
    }
    fa::ReferenceOptions ro;
    ro.score_mod = &sp, ro.mask_mod = &mp, ro.bindings = &captures.env;
    ro.q_strides = std::array<int64_t, 4>{0, DQK, int64_t(Hq) * DQK, 1};
    ro.k_strides = std::array<int64_t, 4>{0, DQK, int64_t(Hkv) * DQK, 1};
    ro.v_strides = std::array<int64_t, 4>{0, DV, int64_t(Hkv) * DV, 1};
    const int rb = reads_b ? b + 1 : 1;
    const fa::ReferenceResult ref = fa::reference_attention(
        {rb, Hq, Hkv, lq[b], lk[b], DQK, DV}, q.values.data() + size_t(cu_q[b]) * Hq * DQK,
        kk.values.data() + size_t(cu_k[b]) * Hkv * DQK, v.values.data() + size_t(cu_k[b]) * Hkv * DV, ro);
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < lq[b]; ++i) {
        const size_t r = (size_t(rb - 1) * Hq + h) * lq[b] + i;
        for (int d = 0; d < DV; ++d) {
          const double g = fa::from_bits(out[o_at(h, i) + d], t), want = ref.out[r * DV + d];
          if (std::isnan(g)) ++bad;
          num += (g - want) * (g - want), den += want * want;
        }
        const float l = lse[l_at(h, i)];
        if (std::isinf(ref.lse[r]))
          bad += !(std::isinf(l) && l < 0);
        else
          lse_err = std::max(lse_err, std::fabs(l - ref.lse[r]));
        if (o.max_scores) max_check.add(mx[l_at(h, i)], ref.max_score[r]);
      }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  const double tol = t == fa::DType::bf16 ? 1e-2 : 5e-3;
  const bool ok = o.no_check || (bad == 0 && max_check.bad == 0 && rel < tol && lse_err < 2e-2);
  const bool decode = fa::takes_decoding_kernel(fo.path, max_q, Hq, Hkv, mask);
  std::cout << fmt::format(
      "B={} Hq={} Hkv={} Lq={} Lkv={} D={}/{}{}{}  kernel: {}  block mask in {:.2f} ms\n", B, Hq, Hkv, max_q,
      max_kv, DQK, DV, o.varlen ? "  ragged (lengths random)" : "",
      ps ? fmt::format("  paged (page size {}, {} pages)", ps, num_pages) : "",
      decode ? "split-KV decoding"
             : "prefill " +
                   k.prefill_spec(ps ? fa::SequenceLayout::kPaged : fa::SequenceLayout::kRagged).to_string(),
      mask_ms);
  std::cout << fmt::format("first call (kernel compile included): {:.0f} ms\n", first_ms);
  if (o.no_check)
    std::cout << "not checked (--no-check)\n";
  else
    std::cout << fmt::format(
        "vs float64 reference (each sequence): rel err {:.2e} (bound {:.0e}), max |lse err| {:.2e}{}, {} bad "
        "values: {}\n",
        rel, tol, lse_err, o.max_scores ? max_check.line() : "", bad, ok ? "OK" : "MISMATCH");
  seq.check_tables = false;
  const double ms = median_ms(o.iters, [&] { k.forward(tq4, tk4, tv4, to4, mask, captures.cap, fo); });
  double kv_bytes = 0;
  for (int b = 0; b < B; ++b) kv_bytes += double(lk[b]) * Hkv * (DQK + DV) * 2;
  std::cout << fmt::format("forward: {:.3f} ms (median of {}), K+V read once: {:.2f} TB/s (host-timed)\n", ms,
                           o.iters, kv_bytes / ms / 1e9);
  if (!o.backward) return ok ? 0 : 1;

  // ---- backward: random dO in o's layout, gradients (in q's, k's, v's) poisoned first.
  const fa::RoundedTensor g_out = fa::random_rounded(size_t(tq) * Hq * DV, t, rng);
  fa::rt::DeviceBuffer d_do = upload(g_out.bits.data(), g_out.bits.size() * 2), d_dq(q.bits.size() * 2),
                       d_dk(kk.bits.size() * 2), d_dv(v.bits.size() * 2);
  auto like = [](fa::TensorView x, fa::rt::DeviceBuffer& buf) {  // x's shape and strides over buf
    x.data = buf.as<void>();
    return x;
  };
  const fa::TensorView tdo = like(to4, d_do), tdq = like(tq4, d_dq), tdk = like(tk4, d_dk),
                       tdv = like(tv4, d_dv);
  fa::BackwardOptions bo;
  bo.sequences = seq;
  bo.sequences.check_tables = seq.any();
  bo.deterministic = o.deterministic;
  for (fa::rt::DeviceBuffer* g : {&d_dq, &d_dk, &d_dv}) g->memset8(0xff);
  fa::rt::synchronize(nullptr);
  t0 = std::chrono::steady_clock::now();
  k.backward(tq4, tk4, tv4, to4, tl, tdo, tdq, tdk, tdv, mask, captures.cap, bo);
  fa::rt::synchronize(nullptr);
  std::cout << fmt::format(
      "backward: {} (first call, compile included: {:.0f} ms)\n", k.backward_spec().to_string(),
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  bool gok = true;
  if (o.no_check) {
    std::cout << "gradients not checked (--no-check)\n";
  } else {
    std::vector<uint16_t> gq(q.bits.size()), gk(kk.bits.size()), gv(v.bits.size());
    d_dq.download(gq.data(), gq.size() * 2);
    d_dk.download(gk.data(), gk.size() * 2);
    d_dv.download(gv.data(), gv.size() * 2);
    std::optional<fa::ModProgram> grad;
    fa::ReferenceOptions ro;
    ro.mask_mod = &mp, ro.bindings = &captures.env;
    if (!program.score_is_identity()) {
      grad.emplace(fa::ModProgram::grad_of(program));
      ro.score_mod = &sp, ro.score_grad = &*grad;
    }
    // per gradient: squared error and reference, NaN count; rows of packed [rows, H, D] storage
    struct Err {
      double e2 = 0, r2 = 0;
      size_t nan = 0;
    } err[3];
    auto add_row = [&](Err& e, const std::vector<uint16_t>& g, size_t at, int D, const double* ref) {
      for (int d = 0; d < D; ++d) {
        const double x = fa::from_bits(g[at + d], t), want = ref ? ref[d] : 0.0;
        if (std::isnan(x)) ++e.nan;
        e.e2 += (x - want) * (x - want), e.r2 += want * want;
      }
    };
    for (int b = 0; b < B; ++b) {
      const int lqb = lq[b], lkb = lk[b];
      const int rb = reads_b ? b + 1 : 1;
      const bool pairs = lqb > 0 && lkb > 0;
      // contiguous [rb, H, L, D] copies of the sequence's dO and O (the reference's layout)
      auto gather = [&](auto&& at, int D) {
        std::vector<double> x(size_t(rb) * Hq * lqb * D);
        for (int r = 0; r < rb; ++r)
          for (int h = 0; h < Hq; ++h)
            for (int i = 0; i < lqb; ++i)
              for (int d = 0; d < D; ++d)
                x[((size_t(r) * Hq + h) * lqb + i) * D + d] = at((size_t(cu_q[b] + i) * Hq + h) * DV + d);
        return x;
      };
      std::optional<fa::ReferenceGrads> g;
      std::vector<double> dos, os;
      if (pairs) {
        dos = gather([&](size_t i) { return double(g_out.values[i]); }, DV);
        os = gather([&](size_t i) { return fa::from_bits(out[i], t); }, DV);
        ro.delta_out = os.data();
        ro.q_strides = std::array<int64_t, 4>{0, DQK, int64_t(Hq) * DQK, 1};
        ro.k_strides = std::array<int64_t, 4>{0, DQK, int64_t(Hkv) * DQK, 1};
        ro.v_strides = std::array<int64_t, 4>{0, DV, int64_t(Hkv) * DV, 1};
        g = fa::reference_attention_backward(
            {rb, Hq, Hkv, lqb, lkb, DQK, DV}, q.values.data() + size_t(cu_q[b]) * Hq * DQK,
            kk.values.data() + size_t(cu_k[b]) * Hkv * DQK, v.values.data() + size_t(cu_k[b]) * Hkv * DV,
            dos.data(), nullptr, ro);
      }
      // no pair in the sequence: every gradient row is 0
      for (int h = 0; h < Hq; ++h)
        for (int i = 0; i < lqb; ++i)
          add_row(err[0], gq, (size_t(cu_q[b] + i) * Hq + h) * DQK, DQK,
                  g ? &g->dq[((size_t(rb - 1) * Hq + h) * lqb + i) * DQK] : nullptr);
      for (int h = 0; h < Hkv; ++h)
        for (int j = 0; j < lkb; ++j) {
          const size_t r = (size_t(rb - 1) * Hkv + h) * lkb + j;
          add_row(err[1], gk, (size_t(cu_k[b] + j) * Hkv + h) * DQK, DQK, g ? &g->dk[r * DQK] : nullptr);
          add_row(err[2], gv, (size_t(cu_k[b] + j) * Hkv + h) * DV, DV, g ? &g->dv[r * DV] : nullptr);
        }
    }
    const double gtol = t == fa::DType::bf16 ? 3e-2 : 1e-2;
    std::string line;
    for (int i = 0; i < 3; ++i) {
      const double rel = err[i].r2 > 0 ? std::sqrt(err[i].e2 / err[i].r2) : std::sqrt(err[i].e2);
      gok = gok && err[i].nan == 0 && rel < gtol;
      line += fmt::format("{} {:.2e}{} ",
                          i == 0   ? "dq"
                          : i == 1 ? "dk"
                                   : "dv",
                          rel, err[i].nan ? fmt::format(" ({} NaN)", err[i].nan) : "");
    }
    std::cout << fmt::format("gradients vs float64 reference (each sequence): rel err {}(bound {:.0e}): {}\n",
                             line, gtol, gok ? "OK" : "MISMATCH");
  }
  if (o.deterministic) {
    gok = same_bits_again(
              {&d_dq, &d_dk, &d_dv},
              [&] { k.backward(tq4, tk4, tv4, to4, tl, tdo, tdq, tdk, tdv, mask, captures.cap, bo); }) &&
          gok;
  }
  bo.sequences.check_tables = false;
  const double bms = median_ms(
      o.iters, [&] { k.backward(tq4, tk4, tv4, to4, tl, tdo, tdq, tdk, tdv, mask, captures.cap, bo); });
  // the pairs every sequence keeps (mask_mod at h = 0), for the backward's FLOPs
  double kept = 0;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < lq[b]; ++i)
      for (int j = 0; j < lk[b]; ++j) kept += mp.eval_mask(reads_b ? b : 0, 0, i, j, captures.env) ? 1 : 0;
  std::cout << fmt::format(
      "backward: {:.3f} ms (median of {}), {:.1f} TFLOP/s (2.5x the forward's FLOPs on the kept pairs, "
      "host-timed)\n",
      bms, o.iters, 2.5 * 2.0 * Hq * kept * (DQK + DV) / bms / 1e9);
  return ok && gok ? 0 : 1;
}

}  // namespace

fa::TileConfig parse_tile(const std::string& text) {
  fa::TileConfig t;
  if (text.empty()) return t;
  char end = 0;
  if (std::sscanf(text.c_str(), "%dx%dw%ds%d%c", &t.block_m, &t.block_n, &t.warps, &t.stages, &end) != 4)
    throw fa::Error(fmt::format("--tile must read MxNwWsS (e.g. 128x64w12s3), got '{}'", text));
  return t;
}

fa::KernelFamily kernel_family(const std::string& name) {
  return name == "wgmma" ? fa::KernelFamily::kWgmma
         : name == "mma" ? fa::KernelFamily::kMmaSync
                         : fa::KernelFamily::kAuto;
}

int run_variant(const RunOptions& o) {
  fa::Options copts;
  copts.dtype = o.dtype;
  const int DQK = o.head_dim, DV = o.head_dim_v ? o.head_dim_v : o.head_dim;
  copts.head_dim_qk = DQK;
  copts.head_dim_v = DV;
  copts.family = kernel_family(o.kernel);
  if (o.autotune != "env") copts.autotune = o.autotune == "on";
  copts.tile = parse_tile(o.tile);
  if (o.deterministic && !o.backward)
    throw fa::Error("--deterministic is the backward's mode: give --backward too");
  // The mods and their captures' data, checked before any GPU work (so also without a GPU).
  fa::Program program = program_of(o.mods);
  const ModData mods = mod_data(o);
  check_capture_args(program, mods, o.heads,
                     std::max(o.len_q ? o.len_q : o.len, o.len_kv ? o.len_kv : o.len));
  if (!fa::rt::cuda_available()) {
    std::cout << "no GPU here (" << fa::rt::cuda_unavailable_reason() << "): skipping the run\n";
    return 0;
  }

  auto t0 = std::chrono::steady_clock::now();
  fa::Kernel k = fa::compile(program, copts);
  double compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::rt::ContextGuard guard;
  std::cout << fmt::format("device: {}  kernel: {}  ({} in {:.1f} ms)\n", fa::rt::current_device_info().name,
                           k.spec().to_string(), fa::to_string(k.origin()), compile_ms);

  if (o.layouts()) {
    if (o.backward && o.page_size) {
      std::cerr
          << "fajit run: --backward takes dense or packed (--varlen) keys, not a paged cache (--paged)\n";
      return 2;
    }
    return run_sequences(o, k, program, mods);
  }
  const int B = o.batch, H = o.heads, L = o.len;
  std::mt19937 rng(o.seed >= 0 ? static_cast<unsigned>(o.seed) : std::random_device{}());
  const size_t rows = static_cast<size_t>(B) * H * L, n_qk = rows * DQK, n_v = rows * DV;
  fa::RoundedTensor q = fa::random_rounded(n_qk, o.dtype, rng), kk = fa::random_rounded(n_qk, o.dtype, rng),
                    v = fa::random_rounded(n_v, o.dtype, rng);

  CaptureData captures(program, mods, H, L, rng);
  const fa::Captures& cap = captures.cap;
  const fa::Bindings& env = captures.env;
  check_buffer_indices(program, env, mods, B, H, L, L);

  const size_t bytes_qk = n_qk * 2, bytes_v = n_v * 2;
  fa::rt::DeviceBuffer dq(bytes_qk), dk(bytes_qk), dv(bytes_v), dout(bytes_v), dlse(rows * 4), dmax(rows * 4);
  dq.upload(q.bits.data(), bytes_qk);
  dk.upload(kk.bits.data(), bytes_qk);
  dv.upload(v.bits.data(), bytes_v);
  dout.memset8(0xff);  // poison: NaN in both fp16 and bf16
  dlse.memset8(0xff);
  dmax.memset8(0xff);
  const fa::TensorView tm(dmax.as<void>(), fa::DType::f32, {B, H, L});
  fa::TensorView tq(dq.as<void>(), o.dtype, {B, H, L, DQK}), tk(dk.as<void>(), o.dtype, {B, H, L, DQK}),
      tv(dv.as<void>(), o.dtype, {B, H, L, DV}), to(dout.as<void>(), o.dtype, {B, H, L, DV}),
      tl(dlse.as<void>(), fa::DType::f32, {B, H, L});

  t0 = std::chrono::steady_clock::now();
  fa::BlockMask mask = k.block_mask(B, H, L, L, cap);
  fa::rt::synchronize(nullptr);  // a mask the GPU builds is ready only when its stream has run
  double mask_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::ForwardOptions fo;
  fo.lse = &tl;
  if (o.max_scores) fo.max_scores = &tm;
  t0 = std::chrono::steady_clock::now();
  k.forward(tq, tk, tv, to, mask, cap, fo);
  fa::rt::synchronize(nullptr);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("first call ({} included): {:.0f} ms\n",
                           k.autotunes() ? "autotuning" : "lazy compiles", first_ms);
  for (const fa::TuneRecord& r : k.tune_records()) std::cout << "autotune: " << fa::to_string(r) << "\n";
  std::vector<uint16_t> out(n_v);
  std::vector<float> lse(rows), mx(rows);
  dout.download(out.data(), bytes_v);
  dlse.download(lse.data(), lse.size() * 4);
  dmax.download(mx.data(), mx.size() * 4);

  fa::ModProgram sp = fa::ModProgram::score_of(program);
  fa::ModProgram mp = fa::ModProgram::mask_of(program);
  fa::ReferenceOptions ro;
  ro.score_mod = &sp;
  ro.mask_mod = &mp;
  ro.bindings = &env;
  auto d = mask.density();
  std::cout << fmt::format(
      "B={} H={} L={} D={}/{}  block mask: {:.1f}% dense ({} full, {} partial, {} empty) in {:.2f} ms\n", B,
      H, L, DQK, DV, 100.0 * d.fraction, d.full, d.partial, d.empty, mask_ms);
  bool ok = true;
  if (o.no_check) {
    std::cout << "not checked (--no-check)\n";
  } else {
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
    MaxCheck max_check;
    if (o.max_scores)
      for (size_t i = 0; i < mx.size(); ++i) max_check.add(mx[i], ref.max_score[i]);
    double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    double tol = o.dtype == fa::DType::bf16 ? 1e-2 : 5e-3;
    ok = bad == 0 && max_check.bad == 0 && rel < tol && lse_err < 2e-2;
    std::cout << fmt::format(
        "vs float64 reference: rel err {:.2e} (bound {:.0e}), max |lse err| {:.2e}{}, {} bad values: {}\n",
        rel, tol, lse_err, o.max_scores ? max_check.line() : "", bad, ok ? "OK" : "MISMATCH");
  }

  // Timing: warm-up, then the median of repeated launches.
  const double ms = median_ms(o.iters, [&] { k.forward(tq, tk, tv, to, mask, cap, fo); });
  // Pairs kept by the mask: of every (b, h) the mask's tables tell apart, or, past 2^28 pairs to
  // evaluate, those of b = h = 0 times B·H (an estimate, said so).
  const int mb = mask.batch(), mh = mask.heads();
  const bool each = double(mb) * mh * L * L <= double(1 << 28);
  double kept = 0;
  for (int b = 0; b < (each ? mb : 1); ++b)
    for (int h = 0; h < (each ? mh : 1); ++h)
      for (int qi = 0; qi < L; ++qi)
        for (int kv = 0; kv < L; ++kv) kept += mp.eval_mask(b, h, qi, kv, env) ? 1 : 0;
  kept *= double(B) * H / (each ? double(mb) * mh : 1.0);
  double flops = 2.0 * kept * (DQK + DV);
  std::cout << fmt::format(
      "forward: {:.3f} ms (median of {}), {:.1f} TFLOP/s on the unmasked work{} (host-timed)\n", ms, o.iters,
      flops / ms / 1e9, each || (mb == 1 && mh == 1) ? "" : " (estimated from b = h = 0)");
  if (!o.backward) return ok ? 0 : 1;

  // ---- backward: random dO, gradients into poisoned buffers, each checked against float64.
  fa::RoundedTensor g_out = fa::random_rounded(n_v, o.dtype, rng);
  fa::rt::DeviceBuffer d_do(bytes_v), d_dq(bytes_qk), d_dk(bytes_qk), d_dv(bytes_v);
  d_do.upload(g_out.bits.data(), bytes_v);
  for (fa::rt::DeviceBuffer* b : {&d_dq, &d_dk, &d_dv}) b->memset8(0xff);
  fa::TensorView tdo(d_do.as<void>(), o.dtype, {B, H, L, DV}), tdq(d_dq.as<void>(), o.dtype, {B, H, L, DQK}),
      tdk(d_dk.as<void>(), o.dtype, {B, H, L, DQK}), tdv(d_dv.as<void>(), o.dtype, {B, H, L, DV});
  fa::BackwardOptions bo;
  bo.deterministic = o.deterministic;
  fa::rt::synchronize(nullptr);
  t0 = std::chrono::steady_clock::now();
  k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap, bo);
  fa::rt::synchronize(nullptr);
  const double first_bwd_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::cout << fmt::format("backward: {} (first call, compile included: {:.0f} ms)\n",
                           k.backward_spec().to_string(), first_bwd_ms);
  bool gok = true;
  if (o.no_check) {
    std::cout << "gradients not checked (--no-check)\n";
  } else {
    fa::ReferenceOptions rb = ro;
    std::optional<fa::ModProgram> grad;
    if (program.score_is_identity()) {
      rb.score_mod = nullptr;
    } else {
      grad.emplace(fa::ModProgram::grad_of(program));
      rb.score_grad = &*grad;
    }
    std::vector<double> o_vals(n_v);  // delta from the kernel's own O
    for (size_t i = 0; i < n_v; ++i) o_vals[i] = fa::from_bits(out[i], o.dtype);
    rb.delta_out = o_vals.data();
    const std::vector<double> dout_vals(g_out.values.begin(), g_out.values.end());
    const fa::ReferenceGrads g =
        fa::reference_attention_backward({B, H, H, L, L, DQK, DV}, q.values.data(), kk.values.data(),
                                         v.values.data(), dout_vals.data(), nullptr, rb);
    const double gtol = o.dtype == fa::DType::bf16 ? 3e-2 : 1e-2;
    std::string line;
    for (auto [name, buf, ref] :
         {std::tuple{"dq", &d_dq, &g.dq}, {"dk", &d_dk, &g.dk}, {"dv", &d_dv, &g.dv}}) {
      auto [err, nan] = rel_error(*buf, *ref, o.dtype);
      gok = gok && nan == 0 && err < gtol;
      line += fmt::format("{} {:.2e}{} ", name, err, nan ? fmt::format(" ({} NaN)", nan) : "");
    }
    std::cout << fmt::format("gradients vs float64 reference: rel err {}(bound {:.0e}): {}\n", line, gtol,
                             gok ? "OK" : "MISMATCH");
  }
  if (o.deterministic)
    gok = same_bits_again({&d_dq, &d_dk, &d_dv},
                          [&] { k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap, bo); }) &&
          gok;
  const double bms =
      median_ms(o.iters, [&] { k.backward(tq, tk, tv, to, tl, tdo, tdq, tdk, tdv, mask, cap, bo); });
  std::cout << fmt::format(
      "backward: {:.3f} ms (median of {}), {:.1f} TFLOP/s (2.5x the forward's FLOPs, host-timed)\n", bms,
      o.iters, 2.5 * flops / bms / 1e9);
  return ok && gok ? 0 : 1;
}

}  // namespace fajit_cli
