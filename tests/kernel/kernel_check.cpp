// GPU check of the forward kernel template: NVRTC-compiles variants, launches them through
// the CUDA Driver API with block-sparse tables built on the host by brute force from the
// same mask (a C++ twin of each FaMods), and compares O and LSE with a float64 reference.
// Outputs are poisoned (NaN) before every run; padding between rows must stay poisoned.
// A config string "sm90" or "sm90:<BLOCK_N,STAGES,OVERLAP[,PINGPONG,EARLY_K,CONSUMERS]>" selects
// the Hopper kernel (forward_sm90.cuh, K/V by cp.async: sm90_config_args); anything else is a
// fa::FwdConfig argument list of forward.cuh.
//   usage: kernel_check [--quick] [--no-bench] [--bench-only] [--compile-only]
//                       [--sm80-only | --sm90-only]
// The device headers are the embedded templates (fa::jit::Nvrtc), so a change to templates/
// needs a rebuild. Built by CMake (target fajit_kernel_check, not run by ctest) and, for the GPU
// machine, by scripts/gpu-kernel-check.sh.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "fa_nvrtc.h"
#include "fajit/params.h"
#include "fajit/runtime/half.h"

namespace {

void cu_check(CUresult r, const char* what, int line) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  std::fprintf(stderr, "CUDA error %d (%s) at line %d: %s\n", (int)r, s ? s : "?", line, what);
  std::exit(2);
}
#define CU(x) cu_check((x), #x, __LINE__)

// ---- host 16-bit conversions: fajit/runtime/half.h (round to nearest even) ----------------
fa::DType elem_type(bool bf16) { return bf16 ? fa::DType::bf16 : fa::DType::f16; }

// ---- mods: device source and host twin -----------------------------------------------------
enum class Mod { Noop, Causal, Sliding, RowsMasked, AlibiCausal, SoftcapCausal };

struct HostCaps {
  std::vector<float> slopes;  // per q head (alibi)
  int window = 100;           // sliding window (runtime scalar 0)
  float softcap = 20.f;       // softcap (runtime scalar 0)
};

const char* mod_name(Mod m) {
  switch (m) {
    case Mod::Noop: return "noop";
    case Mod::Causal: return "causal";
    case Mod::Sliding: return "sliding";
    case Mod::RowsMasked: return "rowsmasked";
    case Mod::AlibiCausal: return "alibi+causal";
    case Mod::SoftcapCausal: return "softcap+causal";
  }
  return "?";
}

std::string mod_source(Mod m) {
  auto mods = [](bool score, bool mask, const char* score_body, const char* mask_body) {
    std::string s = "struct FaMods {\n  static constexpr bool kHasScoreMod = ";
    s += score ? "true" : "false";
    s += ";\n  static constexpr bool kHasMaskMod = ";
    s += mask ? "true" : "false";
    s += ";\n  static __device__ __forceinline__ float score_mod(float score, int b, int h, int q, int kv,"
         " const FaCaptures& cap) {\n    ";
    s += score_body;
    s += "\n  }\n  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv,"
         " const FaCaptures& cap) {\n    ";
    s += mask_body;
    s += "\n  }\n};\n";
    return s;
  };
  switch (m) {
    case Mod::Noop: return mods(false, false, "return score;", "return true;");
    case Mod::Causal: return mods(false, true, "return score;", "return q >= kv;");
    case Mod::Sliding:
      return mods(false, true, "return score;", "return q >= kv && q - kv <= cap.scalars[0].i;");
    case Mod::RowsMasked:
      return mods(false, true, "return score;",
                  "return (q % 5 != 0) && !(q >= 256 && q < 384) &&\n"
                  "           ((h & 1) ? (kv <= q + 64) : ((q + kv) % 3 != 0));");
    case Mod::AlibiCausal:
      return mods(
          true, true,
          "const float slope = static_cast<const float*>(cap.buffers[0].ptr)[h * cap.buffers[0].stride[0]];\n"
          "    return score + slope * static_cast<float>(kv - q);",
          "return q >= kv;");
    case Mod::SoftcapCausal:
      return mods(true, true, "const float c = cap.scalars[0].f;\n    return c * tanhf(score / c);",
                  "return q >= kv;");
  }
  return "";
}

bool host_mask(Mod m, const HostCaps& c, int h, int q, int kv) {
  switch (m) {
    case Mod::Noop: return true;
    case Mod::Causal:
    case Mod::AlibiCausal:
    case Mod::SoftcapCausal: return q >= kv;
    case Mod::Sliding: return q >= kv && q - kv <= c.window;
    case Mod::RowsMasked:
      return (q % 5 != 0) && !(q >= 256 && q < 384) && ((h & 1) ? (kv <= q + 64) : ((q + kv) % 3 != 0));
  }
  return true;
}
bool mask_depends_on_h(Mod m) { return m == Mod::RowsMasked; }
double host_score(Mod m, const HostCaps& c, double s, int h, int q, int kv) {
  if (m == Mod::AlibiCausal) return s + double(c.slopes[h]) * double(kv - q);
  if (m == Mod::SoftcapCausal) return double(c.softcap) * std::tanh(s / double(c.softcap));
  return s;
}

// ---- compiled variants --------------------------------------------------------------------
struct Kernel {
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  int smem = 0, threads = 0, block_m = 0, block_n = 0, regs = 0, spills = 0;
  double compile_s = 0;
};

// The Template arguments of a Hopper variant after the head dims: the config's (or the host's
// default tile), completed up to CP_ASYNC_KV = true. kernel_check builds no tensor maps, so its
// Hopper variants take K/V by cp.async (the kernel's path for operands the driver cannot map) and
// are launched with zeroed FaTmaPairs; the TMA path is covered by fajit_gpu_tests.
std::string sm90_config_args(const std::string& cfg, int dqk, int dv) {
  std::string a =
      cfg.size() > 5 ? cfg.substr(5) : fa_test::default_tile_args(dqk, dv, fa::KernelFamily::kWgmma);
  // BLOCK_N, STAGES, OVERLAP, PINGPONG, EARLY_K, CONSUMERS: the template's defaults past the given
  const char* defaults[] = {"128", "2", "true", "false", "false", "2"};
  const int given = 1 + static_cast<int>(std::count(a.begin(), a.end(), ','));
  for (int i = given; i < 6; ++i) a += std::string(", ") + defaults[i];
  return a + ", true";
}

// A forward launch's kernel arguments: forward.cuh's kernel takes (p, cap), the Hopper variants
// also (maps, qmaps), zeroed: they read none (cp.async K/V, not persistent).
struct LaunchArgs {
  FaTmaPair maps{}, qmaps{};
  void* ptrs[4];
  LaunchArgs(FaFwdParams& p, FaCaptures& cap) : ptrs{&p, &cap, &maps, &qmaps} {}
  LaunchArgs(const LaunchArgs&) = delete;  // ptrs point into this object
  LaunchArgs& operator=(const LaunchArgs&) = delete;
};

struct Env {
  std::string arch;
  int num_sms = 0;
  std::string device_name;
  std::map<std::string, std::unique_ptr<Kernel>> cache;

  Kernel& get(Mod m, bool bf16, int dqk, int dv, const std::string& cfg) {
    const char* elem = bf16 ? "bf16_t" : "f16_t";
    const std::string src =
        cfg.rfind("sm90", 0) == 0
            ? fa_test::variant_source_sm90(mod_source(m), elem, dqk, dv, sm90_config_args(cfg, dqk, dv))
            : fa_test::variant_source(mod_source(m), elem, dqk, dv, cfg);
    auto it = cache.find(src);
    if (it != cache.end()) return *it->second;
    auto k = std::make_unique<Kernel>();
    fa_test::Compiled c = fa_test::compile(src, arch);
    k->compile_s = c.seconds;
    k->regs = c.regs;
    k->spills = c.spill_stores + c.spill_loads;
    CU(cuModuleLoadData(&k->mod, c.cubin.data()));
    CU(cuModuleGetFunction(&k->fn, k->mod, "fajit_fwd"));
    CUfunction info;
    CU(cuModuleGetFunction(&info, k->mod, "fajit_fwd_smem_bytes"));
    CUdeviceptr d;
    CU(cuMemAlloc(&d, 16));
    void* args[] = {&d};
    CU(cuLaunchKernel(info, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    int v[4];
    CU(cuMemcpyDtoH(v, d, 16));
    CU(cuMemFree(d));
    k->smem = v[0], k->threads = v[1], k->block_m = v[2], k->block_n = v[3];
    CU(cuFuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k->smem));
    std::printf("  [compile] %-15s %-4s dqk=%-3d dv=%-3d cfg=%-14s %.3f s  regs=%d spill=%d smem=%d\n",
                mod_name(m), bf16 ? "bf16" : "f16", dqk, dv, cfg.empty() ? "default" : cfg.c_str(), c.seconds,
                c.regs, k->spills, k->smem);
    return *cache.emplace(src, std::move(k)).first->second;
  }
};

// ---- one test case ------------------------------------------------------------------------
struct Case {
  Mod mod;
  bool bf16;
  int B, Hq, Hkv, Lq, Lkv, Dqk, Dv;
  bool full_blocks = true;  // false: full_kv_* null, every non-empty block is partial
  bool noncontig = false;   // [B, L, H, D+8] layouts and padded LSE rows
  bool lse = true;
  std::string cfg = "";  // "" = default config
  int q_block = 128, kv_block = 128;
  float in_scale = 1.f;
};

struct Tables {
  std::vector<int> num, idx, full_num, full_idx;
  int nqb, nkb, hm;
  long long partial_blocks = 0, full_blocks = 0, empty_blocks = 0;
};

// The Hopper kernel walks one tile a kv block (BlockCursor): its tables are built with kv blocks
// of its BLOCK_N, as the host splits wider ones (BlockMask::regrouped), and with query blocks
// of its BLOCK_M where the case's do not hold whole tiles (192 rows at d64: the host regroups).
// The tables are built by brute force from the mask, so any block sizes are exact.
Case blocks_for(const Case& c, int block_m, int block_n) {
  Case r = c;
  if (c.cfg.rfind("sm90", 0) != 0) return r;
  r.kv_block = block_n;
  if (c.q_block % block_m != 0) r.q_block = block_m;
  return r;
}

Tables build_tables(const Case& c, const HostCaps& caps) {
  Tables t;
  t.nqb = (c.Lq + c.q_block - 1) / c.q_block;
  t.nkb = (c.Lkv + c.kv_block - 1) / c.kv_block;
  t.hm = mask_depends_on_h(c.mod) ? c.Hq : 1;
  const size_t rows = size_t(t.hm) * t.nqb;
  t.num.assign(rows, 0), t.full_num.assign(rows, 0);
  t.idx.assign(rows * t.nkb, 0), t.full_idx.assign(rows * t.nkb, 0);
  for (int h = 0; h < t.hm; ++h)
    for (int qb = 0; qb < t.nqb; ++qb) {
      const size_t row = size_t(h) * t.nqb + qb;
      for (int kb = 0; kb < t.nkb; ++kb) {
        long long total = 0, on = 0;
        for (int q = qb * c.q_block; q < std::min(c.Lq, (qb + 1) * c.q_block); ++q)
          for (int kv = kb * c.kv_block; kv < std::min(c.Lkv, (kb + 1) * c.kv_block); ++kv) {
            ++total;
            on += host_mask(c.mod, caps, h, q, kv);
          }
        if (on == 0) {
          ++t.empty_blocks;
        } else if (on == total && c.full_blocks) {
          t.full_idx[row * t.nkb + t.full_num[row]++] = kb;
          ++t.full_blocks;
        } else {
          t.idx[row * t.nkb + t.num[row]++] = kb;
          ++t.partial_blocks;
        }
      }
    }
  return t;
}

struct DevBuf {
  CUdeviceptr p = 0;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { CU(cuMemAlloc(&p, n ? n : 4)); }
  ~DevBuf() { cuMemFree(p); }
  template <class T>
  void upload(const std::vector<T>& v) {
    CU(cuMemcpyHtoD(p, v.data(), v.size() * sizeof(T)));
  }
};

struct Layout {  // element strides of a [B, H, L, D] tensor
  long long sb, sh, sm, elems;
};
Layout make_layout(int B, int H, int L, int D, bool noncontig) {
  if (!noncontig) return {(long long)H * L * D, (long long)L * D, D, (long long)B * H * L * D};
  const long long row = D + 8;  // [B, L, H, D+8]
  return {L * H * row, row, H * row, B * L * H * row};
}

struct Result {
  double rel = 0, max_abs = 0, lse_err = 0;
  long long nan = 0, masked_rows = 0, masked_bad = 0, pad_bad = 0, checked_rows = 0;
  bool ok = false;
};

Result run_case(Env& env, const Case& given, std::mt19937& rng) {
  Kernel& k = env.get(given.mod, given.bf16, given.Dqk, given.Dv, given.cfg);
  const Case c = blocks_for(given, k.block_m, k.block_n);
  HostCaps caps;
  for (int h = 0; h < c.Hq; ++h) caps.slopes.push_back(std::ldexp(1.f, -(8 * (h + 1)) / c.Hq));
  const Layout lq = make_layout(c.B, c.Hq, c.Lq, c.Dqk, c.noncontig);
  const Layout lk = make_layout(c.B, c.Hkv, c.Lkv, c.Dqk, c.noncontig);
  const Layout lv = make_layout(c.B, c.Hkv, c.Lkv, c.Dv, c.noncontig);
  const Layout lo = make_layout(c.B, c.Hq, c.Lq, c.Dv, c.noncontig);
  const long long lse_sh = c.noncontig ? c.Lq + 5 : c.Lq, lse_sb = c.Hq * lse_sh;
  const long long lse_elems = c.B * lse_sb;

  // Fresh random inputs, rounded to the element type; the reference uses the rounded values.
  std::normal_distribution<float> nd(0.f, c.in_scale);
  auto fill = [&](long long n, std::vector<uint16_t>& bits, std::vector<float>& vals) {
    bits.resize(n), vals.resize(n);
    for (long long i = 0; i < n; ++i) {
      const float x = nd(rng);
      bits[i] = fa::to_bits(x, elem_type(c.bf16));
      vals[i] = fa::from_bits(bits[i], elem_type(c.bf16));
    }
  };
  std::vector<uint16_t> qb, kb, vb;
  std::vector<float> qf, kf, vf;
  fill(lq.elems, qb, qf), fill(lk.elems, kb, kf), fill(lv.elems, vb, vf);
  DevBuf dq(qb.size() * 2), dk(kb.size() * 2), dvv(vb.size() * 2), dout(lo.elems * 2), dlse(lse_elems * 4);
  dq.upload(qb), dk.upload(kb), dvv.upload(vb);
  CU(cuMemsetD8(dout.p, 0xFF, dout.bytes));  // NaN poison (0xFFFF / 0xFFFFFFFF)
  CU(cuMemsetD8(dlse.p, 0xFF, dlse.bytes));

  Tables t = build_tables(c, caps);
  DevBuf dnum(t.num.size() * 4), didx(t.idx.size() * 4), dfnum(t.full_num.size() * 4),
      dfidx(t.full_idx.size() * 4);
  dnum.upload(t.num), didx.upload(t.idx), dfnum.upload(t.full_num), dfidx.upload(t.full_idx);
  DevBuf dslopes(c.Hq * 4);
  dslopes.upload(caps.slopes);

  FaFwdParams p;
  std::memset(&p, 0, sizeof p);
  p.q = (const void*)dq.p, p.k = (const void*)dk.p, p.v = (const void*)dvv.p, p.o = (void*)dout.p;
  p.lse = c.lse ? (float*)dlse.p : nullptr;
  p.q_stride_b = lq.sb, p.q_stride_h = lq.sh, p.q_stride_m = lq.sm;
  p.k_stride_b = lk.sb, p.k_stride_h = lk.sh, p.k_stride_n = lk.sm;
  p.v_stride_b = lv.sb, p.v_stride_h = lv.sh, p.v_stride_n = lv.sm;
  p.o_stride_b = lo.sb, p.o_stride_h = lo.sh, p.o_stride_m = lo.sm;
  p.lse_stride_b = lse_sb, p.lse_stride_h = lse_sh;
  p.batch = c.B, p.heads_q = c.Hq, p.heads_kv = c.Hkv, p.len_q = c.Lq, p.len_kv = c.Lkv;
  p.scale = 1.f / std::sqrt(float(c.Dqk));
  p.mask.kv_num_blocks = (const int*)dnum.p;
  p.mask.kv_indices = (const int*)didx.p;
  p.mask.full_kv_num_blocks = c.full_blocks ? (const int*)dfnum.p : nullptr;
  p.mask.full_kv_indices = c.full_blocks ? (const int*)dfidx.p : nullptr;
  p.mask.row_stride_b = 0;
  p.mask.row_stride_h = t.hm > 1 ? t.nqb : 0;
  p.mask.num_q_blocks = t.nqb, p.mask.num_kv_blocks = t.nkb;
  p.mask.q_block = c.q_block, p.mask.kv_block = c.kv_block;
  FaCaptures cap;
  std::memset(&cap, 0, sizeof cap);
  cap.buffers[0].ptr = (const void*)dslopes.p;
  cap.buffers[0].stride[0] = 1;
  if (c.mod == Mod::Sliding) cap.scalars[0].i = caps.window;
  if (c.mod == Mod::SoftcapCausal) cap.scalars[0].f = caps.softcap;

  LaunchArgs args(p, cap);
  const unsigned gx = (c.Lq + k.block_m - 1) / k.block_m, gy = c.B * c.Hq;
  CU(cuLaunchKernel(k.fn, gx, gy, 1, k.threads, 1, 1, k.smem, nullptr, args.ptrs, nullptr));
  CU(cuCtxSynchronize());
  std::vector<uint16_t> ob(lo.elems);
  std::vector<float> lse(lse_elems);
  CU(cuMemcpyDtoH(ob.data(), dout.p, ob.size() * 2));
  CU(cuMemcpyDtoH(lse.data(), dlse.p, lse.size() * 4));

  // Padding / unstored positions must still hold the poison.
  Result r;
  {
    std::vector<char> used(lo.elems, 0), lused(lse_elems, 0);
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < c.Hq; ++h)
        for (int q = 0; q < c.Lq; ++q) {
          const long long base = b * lo.sb + h * lo.sh + q * lo.sm;
          for (int d = 0; d < c.Dv; ++d) {
            used[base + d] = 1;
            if (std::isnan(fa::from_bits(ob[base + d], elem_type(c.bf16)))) ++r.nan;
          }
          if (c.lse) {
            lused[b * lse_sb + h * lse_sh + q] = 1;
            if (std::isnan(lse[b * lse_sb + h * lse_sh + q])) ++r.nan;
          }
        }
    for (long long i = 0; i < lo.elems; ++i)
      if (!used[i] && ob[i] != 0xFFFF) ++r.pad_bad;
    uint32_t poison = 0xFFFFFFFFu;
    for (long long i = 0; i < lse_elems; ++i)
      if (!lused[i] && std::memcmp(&lse[i], &poison, 4) != 0) ++r.pad_bad;
  }

  // float64 reference on a set of rows (all rows unless the case is large).
  const double work = double(c.B) * c.Hq * c.Lq * c.Lkv * (c.Dqk + c.Dv);
  const int stride = std::max(1, int(std::ceil(work / 2.5e9)));
  std::vector<int> rows;
  for (int q = 0; q < c.Lq; ++q)
    if (q % stride == 0 || q < 130 || q >= c.Lq - 130) rows.push_back(q);
  struct Acc {
    double se = 0, sr = 0, max_abs = 0, lse_err = 0;
    long long masked = 0, masked_bad = 0, n = 0;
  };
  const int nthreads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Acc> accs(nthreads);
  std::atomic<long long> next{0};
  const long long jobs = (long long)c.B * c.Hq * rows.size();
  auto worker = [&](int w) {
    Acc& a = accs[w];
    std::vector<double> s(c.Lkv), o(c.Dv);
    for (long long job; (job = next++) < jobs;) {
      const int q = rows[job % rows.size()];
      const int bh = int(job / rows.size()), b = bh / c.Hq, h = bh % c.Hq, hk = h / (c.Hq / c.Hkv);
      const float* qrow = &qf[b * lq.sb + h * lq.sh + q * lq.sm];
      double mx = -INFINITY;
      for (int kv = 0; kv < c.Lkv; ++kv) {
        const float* krow = &kf[b * lk.sb + hk * lk.sh + kv * lk.sm];
        double dot = 0;
        for (int d = 0; d < c.Dqk; ++d) dot += double(qrow[d]) * double(krow[d]);
        double x = host_score(c.mod, caps, dot * double(p.scale), h, q, kv);
        if (!host_mask(c.mod, caps, h, q, kv)) x = -INFINITY;
        s[kv] = x;
        mx = std::max(mx, x);
      }
      const long long obase = b * lo.sb + h * lo.sh + q * lo.sm;
      const float glse = lse[b * lse_sb + h * lse_sh + q];
      if (mx == -INFINITY) {  // fully masked row: O exactly 0, LSE exactly -inf
        ++a.masked;
        bool bad = c.lse && !(std::isinf(glse) && glse < 0);
        for (int d = 0; d < c.Dv; ++d) bad |= ob[obase + d] != 0 && ob[obase + d] != 0x8000;
        a.masked_bad += bad;
        continue;
      }
      double sum = 0;
      std::fill(o.begin(), o.end(), 0.0);
      for (int kv = 0; kv < c.Lkv; ++kv) {
        if (s[kv] == -INFINITY) continue;
        const double pr = std::exp(s[kv] - mx);
        sum += pr;
        const float* vrow = &vf[b * lv.sb + hk * lv.sh + kv * lv.sm];
        for (int d = 0; d < c.Dv; ++d) o[d] += pr * double(vrow[d]);
      }
      for (int d = 0; d < c.Dv; ++d) {
        const double ref = o[d] / sum;
        const double got = fa::from_bits(ob[obase + d], elem_type(c.bf16));
        a.se += (got - ref) * (got - ref), a.sr += ref * ref;
        a.max_abs = std::max(a.max_abs, std::fabs(got - ref));
      }
      if (c.lse) a.lse_err = std::max(a.lse_err, std::fabs(double(glse) - (mx + std::log(sum))));
      ++a.n;
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < nthreads; ++w) pool.emplace_back(worker, w);
  for (auto& th : pool) th.join();
  double se = 0, sr = 0;
  for (const Acc& a : accs) {
    se += a.se, sr += a.sr;
    r.max_abs = std::max(r.max_abs, a.max_abs), r.lse_err = std::max(r.lse_err, a.lse_err);
    r.masked_rows += a.masked, r.masked_bad += a.masked_bad, r.checked_rows += a.n + a.masked;
  }
  if (std::isnan(r.lse_err)) r.lse_err = INFINITY;
  r.rel = sr > 0 ? std::sqrt(se / sr) : 0;
  const double tol = c.bf16 ? 2e-2 : 1e-2;
  r.ok = r.rel < tol && !std::isnan(r.rel) && r.lse_err < 2e-3 && r.nan == 0 && r.masked_bad == 0 &&
         r.pad_bad == 0;
  std::printf(
      "%s %-15s %-4s B=%d Hq=%-2d Hkv=%-2d Lq=%-5d Lkv=%-5d d=%3d/%-3d %s%s%s blk=%d/%d cfg=%-12s "
      "| tiles p/f/e=%lld/%lld/%lld rows=%lld masked=%lld | rel=%.2e maxabs=%.2e lse=%.2e nan=%lld "
      "maskbad=%lld padbad=%lld\n",
      r.ok ? "PASS" : "FAIL", mod_name(c.mod), c.bf16 ? "bf16" : "f16", c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.Dqk,
      c.Dv, c.full_blocks ? "full " : "nofull ", c.noncontig ? "strided " : "", c.lse ? "" : "nolse ",
      c.q_block, c.kv_block, c.cfg.empty() ? "default" : c.cfg.c_str(), t.partial_blocks, t.full_blocks,
      t.empty_blocks, r.checked_rows, r.masked_rows, r.rel, r.max_abs, r.lse_err, r.nan, r.masked_bad,
      r.pad_bad);
  std::fflush(stdout);
  return r;
}

// ---- benchmark ----------------------------------------------------------------------------
void bench(Env& env, int D, Mod mod, const std::string& cfg, std::mt19937& rng) {
  const int B = 4, H = 16, L = 4096;
  const bool causal = mod != Mod::Noop;  // every benchmarked mask is causal or none
  Kernel& k = env.get(mod, true, D, D, cfg);
  const long long n = (long long)B * H * L * D;
  std::vector<uint16_t> host(n);
  uint32_t state = rng();
  for (auto& x : host) {  // xorshift: fast enough for 33M values per tensor
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    x = fa::to_bits(float(int(state & 0xffff) - 32768) / 32768.f, fa::DType::bf16);
  }
  DevBuf dq(n * 2), dk(n * 2), dvv(n * 2), dout(n * 2), dlse((long long)B * H * L * 4);
  dq.upload(host), dk.upload(host), dvv.upload(host);
  Case c = blocks_for(Case{mod, true, B, H, H, L, L, D, D, true, false, true, cfg}, k.block_m, k.block_n);
  HostCaps caps;
  for (int h = 0; h < H; ++h) caps.slopes.push_back(std::ldexp(1.f, -(8 * (h + 1)) / H));
  DevBuf dslopes(H * 4);
  dslopes.upload(caps.slopes);
  Tables t = build_tables(c, caps);
  DevBuf dnum(t.num.size() * 4), didx(t.idx.size() * 4), dfnum(t.full_num.size() * 4),
      dfidx(t.full_idx.size() * 4);
  dnum.upload(t.num), didx.upload(t.idx), dfnum.upload(t.full_num), dfidx.upload(t.full_idx);
  FaFwdParams p;
  std::memset(&p, 0, sizeof p);
  p.q = (const void*)dq.p, p.k = (const void*)dk.p, p.v = (const void*)dvv.p, p.o = (void*)dout.p;
  p.lse = (float*)dlse.p;
  p.q_stride_b = p.k_stride_b = p.v_stride_b = p.o_stride_b = (long long)H * L * D;
  p.q_stride_h = p.k_stride_h = p.v_stride_h = p.o_stride_h = (long long)L * D;
  p.q_stride_m = p.k_stride_n = p.v_stride_n = p.o_stride_m = D;
  p.lse_stride_b = (long long)H * L, p.lse_stride_h = L;
  p.batch = B, p.heads_q = H, p.heads_kv = H, p.len_q = L, p.len_kv = L;
  p.scale = 1.f / std::sqrt(float(D));
  p.mask = {(const int*)dnum.p,
            (const int*)didx.p,
            (const int*)dfnum.p,
            (const int*)dfidx.p,
            0,
            0,
            t.nqb,
            t.nkb,
            c.q_block,
            c.kv_block,
            nullptr,
            0};
  FaCaptures cap;
  std::memset(&cap, 0, sizeof cap);
  cap.buffers[0].ptr = (const void*)dslopes.p;
  cap.buffers[0].stride[0] = 1;
  cap.scalars[0].f = caps.softcap;
  LaunchArgs args(p, cap);
  const unsigned gx = (L + k.block_m - 1) / k.block_m, gy = B * H;
  CUevent e0, e1;
  CU(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  CU(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  std::vector<float> ms;
  for (int i = 0; i < 28; ++i) {
    CU(cuEventRecord(e0, nullptr));
    CU(cuLaunchKernel(k.fn, gx, gy, 1, k.threads, 1, 1, k.smem, nullptr, args.ptrs, nullptr));
    CU(cuEventRecord(e1, nullptr));
    CU(cuEventSynchronize(e1));
    float t_ms;
    CU(cuEventElapsedTime(&t_ms, e0, e1));
    if (i >= 3) ms.push_back(t_ms);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double flops = 4.0 * B * H * double(L) * L * D * (causal ? 0.5 : 1.0);
  std::printf("BENCH bf16 d%-3d %-14s cfg=%-14s regs=%-3d smem=%-6d median %.3f ms  %.1f TFLOP/s\n", D,
              causal ? mod_name(mod) : "full", cfg.empty() ? "default" : cfg.c_str(), k.regs, k.smem, med,
              flops / (med * 1e-3) / 1e12);
  std::fflush(stdout);
  cuEventDestroy(e0);
  cuEventDestroy(e1);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, do_bench = true, only_bench = false, compile_only = false;
  bool sm80 = true, sm90 = true, sm90_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true, do_bench = false;
    else if (a == "--no-bench")
      do_bench = false;
    else if (a == "--bench-only")
      only_bench = true;
    else if (a == "--compile-only")
      compile_only = true;
    else if (a == "--sm80-only")
      sm90 = false;
    else if (a == "--sm90-only")
      sm80 = false, sm90_only = true;
    else {
      std::fprintf(stderr, "kernel_check: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (compile_only) {  // no GPU: compile the benchmark variants for sm_90a, show regs/spills
    for (int D : {64, 128})
      for (Mod m : {Mod::Noop, Mod::AlibiCausal, Mod::SoftcapCausal})
        for (const char* cfg : {"", "128,2,false", "128,3,true", "64,2,true"}) {
          fa_test::Compiled c =
              fa_test::compile(fa_test::variant_source_sm90(mod_source(m), "bf16_t", D, D, cfg), "sm_90a");
          std::printf("sm90 d%-3d %-15s cfg=%-18s %.3f s regs=%d spills=%d/%d\n", D, mod_name(m), cfg,
                      c.seconds, c.regs, c.spill_stores, c.spill_loads);
        }
    if (sm90_only) return 0;
    for (int D : {64, 128})
      for (Mod m : {Mod::Noop, Mod::AlibiCausal})
        for (const char* cfg :
             {"", "128,64,4,2", "128,32,4,2", "256,64,8,2", "256,32,8,2", "128,64,4,2,1,true"}) {
          fa_test::Compiled c =
              fa_test::compile(fa_test::variant_source(mod_source(m), "bf16_t", D, D, cfg), "sm_90a");
          std::printf("d%-3d %-15s cfg=%-18s %.3f s regs=%d spills=%d/%d\n", D, mod_name(m), cfg, c.seconds,
                      c.regs, c.spill_stores, c.spill_loads);
        }
    return 0;
  }
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  Env env;
  int major, minor;
  CU(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CU(cuDeviceGetAttribute(&env.num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  char name[256];
  CU(cuDeviceGetName(name, sizeof name, dev));
  env.device_name = name;
  env.arch = "sm_" + std::to_string(major * 10 + minor) + (major == 9 ? "a" : "");
  std::printf("device: %s (%s, %d SMs)\n", name, env.arch.c_str(), env.num_sms);
  if (major != 9) sm90 = false;  // sm_90a code runs on compute capability 9.0 only
  std::mt19937 rng(1234);
  const bool BF = true, F16 = false;
  using M = Mod;
  std::vector<Case> cases;
  if (quick) {
    cases = {
        {M::Causal, BF, 1, 2, 1, 17, 200, 64, 64, true, true},
        {M::RowsMasked, F16, 1, 2, 2, 400, 150, 128, 64, true, false},
        {M::AlibiCausal, BF, 1, 2, 2, 130, 130, 128, 128, false, false},
        {M::Noop, F16, 1, 2, 1, 70, 33, 64, 128, true, true, true, "128,64,8,2"},
    };
    if (!sm80) cases.clear();
    if (sm90) {
      const std::vector<Case> c90 = {
          {M::Causal, BF, 1, 2, 1, 17, 200, 64, 64, true, true, true, "sm90"},
          {M::RowsMasked, F16, 1, 2, 2, 300, 150, 128, 64, true, false, true, "sm90:64,2,true"},
          {M::AlibiCausal, BF, 1, 2, 2, 130, 330, 128, 128, false, false, true, "sm90:128,2,true,true"},
          {M::Causal, F16, 1, 2, 2, 300, 200, 64, 128, true, false, true, "sm90:128,2,false,true"},
          {M::Noop, F16, 1, 2, 1, 70, 33, 64, 128, true, true, true, "sm90:128,2,false"},
      };
      cases.insert(cases.end(), c90.begin(), c90.end());
    }
  } else if (!only_bench) {
    // mod, bf16, B, Hq, Hkv, Lq, Lkv, Dqk, Dv, full_blocks, noncontig, lse, cfg, q_block, kv_block, in_scale
    cases = {
        {M::Noop, BF, 2, 4, 4, 1000, 1000, 128, 128, true},
        {M::Noop, F16, 1, 8, 2, 17, 4097, 64, 64, false},
        {M::Noop, BF, 1, 8, 1, 1, 4097, 128, 128, true},
        {M::Noop, F16, 2, 2, 2, 17, 1, 128, 128, true, false, false},
        {M::Causal, BF, 2, 8, 1, 1000, 1000, 128, 64, true},
        {M::Causal, F16, 1, 2, 2, 4097, 4097, 64, 128, true, true},
        {M::Causal, BF, 1, 4, 4, 4097, 1000, 64, 128, false},
        {M::Causal, BF, 1, 4, 2, 1000, 1000, 128, 128, true, false, true, "", 256, 256},
        {M::Causal, BF, 2, 4, 4, 1000, 1000, 64, 64, true, false, true, "128,64,4,2"},
        {M::Causal, F16, 1, 4, 1, 333, 4097, 128, 128, true, true, true, "64,64,4,3"},
        {M::Sliding, BF, 1, 8, 2, 1000, 1700, 128, 128, true},
        {M::Causal, BF, 1, 4, 2, 1000, 1000, 128, 128, true, true, true, "128,64,4,2"},
        {M::AlibiCausal, F16, 1, 4, 4, 1000, 1000, 128, 64, false, false, true, "256,64,8,2", 256, 128},
        {M::RowsMasked, BF, 1, 2, 2, 1000, 1000, 64, 128, true, false, true, "128,64,8,2,1,false"},
        {M::Sliding, F16, 1, 4, 4, 2000, 2000, 128, 64, true, false, true, "128,128,8,2"},
        {M::RowsMasked, F16, 2, 4, 1, 1000, 777, 128, 128, true, true},
        {M::RowsMasked, BF, 1, 4, 4, 600, 600, 64, 64, false},
        {M::RowsMasked, BF, 1, 4, 4, 1000, 1000, 128, 128, true, false, true, "128,32,8,4"},
        {M::AlibiCausal, BF, 2, 8, 8, 1000, 1000, 128, 128, true},
        {M::AlibiCausal, F16, 1, 4, 2, 17, 17, 64, 64, false},
        {M::SoftcapCausal, BF, 1, 2, 2, 4097, 4097, 128, 128, true, false, true, "", 128, 128, 3.f},
        {M::SoftcapCausal, F16, 1, 4, 4, 1000, 1200, 64, 128, true, true, true, "", 128, 128, 3.f},
    };
    if (!sm80) cases.clear();
    if (sm90) {
      // The same coverage for the Hopper kernel: lengths 1/17/1000/4097 with Lq != Lkv, GQA
      // 1/4/8, strided, partial/full/empty blocks, fully masked rows, alibi (buffer), softcap
      // (scalar), all head-dim pairs, both element types, every config knob, sparse blocks of
      // 256 (q) and cases given 256 (kv: built at BLOCK_N, blocks_for), a tail block (4097).
      const std::vector<Case> c90 = {
          {M::Noop, BF, 2, 4, 4, 1000, 1000, 128, 128, true, false, true, "sm90"},
          {M::Noop, F16, 1, 8, 2, 17, 4097, 64, 64, false, false, true, "sm90"},
          {M::Noop, BF, 1, 8, 1, 1, 4097, 128, 128, true, false, true, "sm90:64,2,true"},
          {M::Noop, F16, 2, 2, 2, 17, 1, 128, 128, true, false, false, "sm90"},
          {M::Noop, BF, 1, 4, 4, 4097, 4097, 64, 64, true, true, true, "sm90:128,3,true"},
          {M::Causal, BF, 2, 8, 1, 1000, 1000, 128, 64, true, false, true, "sm90"},
          {M::Causal, F16, 1, 2, 2, 4097, 4097, 64, 128, true, true, true, "sm90"},
          {M::Causal, BF, 1, 4, 4, 4097, 1000, 64, 128, false, false, true, "sm90:128,2,false"},
          {M::Causal, BF, 1, 4, 2, 1000, 1000, 128, 128, true, false, true, "sm90", 256, 256},
          {M::Causal, F16, 1, 4, 1, 333, 4097, 128, 128, true, true, true, "sm90:64,3,true"},
          {M::Causal, BF, 1, 4, 2, 1000, 1000, 128, 128, true, true, true, "sm90:128,2,false"},
          {M::Sliding, BF, 1, 8, 2, 1000, 1700, 128, 128, true, false, true, "sm90"},
          {M::Sliding, F16, 1, 4, 4, 2000, 2000, 128, 64, true, false, true, "sm90:64,2,false", 128, 256},
          {M::RowsMasked, BF, 1, 2, 2, 1000, 1000, 64, 128, true, false, true, "sm90"},
          {M::RowsMasked, F16, 2, 4, 1, 1000, 777, 128, 128, true, true, true, "sm90"},
          {M::RowsMasked, BF, 1, 4, 4, 600, 600, 64, 64, false, false, true, "sm90:64,4,true"},
          {M::AlibiCausal, BF, 2, 8, 8, 1000, 1000, 128, 128, true, false, true, "sm90"},
          {M::AlibiCausal, F16, 1, 4, 4, 1000, 1000, 128, 64, false, false, true, "sm90", 256, 128},
          {M::AlibiCausal, F16, 1, 4, 2, 17, 17, 64, 64, false, false, true, "sm90"},
          {M::SoftcapCausal, BF, 1, 2, 2, 4097, 4097, 128, 128, true, false, true, "sm90", 128, 128, 3.f},
          {M::SoftcapCausal, F16, 1, 4, 4, 1000, 1200, 64, 128, true, true, true, "sm90", 128, 128, 3.f},
          // ping-pong scheduling (PINGPONG = true), with and without the intra-warpgroup overlap
          {M::Noop, BF, 1, 4, 1, 1000, 4097, 128, 128, true, true, true, "sm90:128,3,true,true"},
          {M::Causal, F16, 1, 4, 4, 4097, 4097, 64, 64, true, false, true, "sm90:128,3,false,true"},
          {M::RowsMasked, BF, 2, 4, 2, 1000, 777, 64, 128, true, false, true, "sm90:64,2,true,true"},
          {M::AlibiCausal, BF, 1, 8, 8, 1000, 1000, 128, 128, false, false, true, "sm90:128,2,false,true"},
          {M::SoftcapCausal, BF, 1, 2, 1, 17, 4097, 128, 64, true, false, true, "sm90:128,3,true,true", 128,
           128, 3.f},
          {M::Noop, F16, 1, 2, 2, 1, 1, 64, 64, true, false, true, "sm90:128,2,true,true"},
      };
      cases.insert(cases.end(), c90.begin(), c90.end());
    }
  }
  int fails = 0;
  for (const Case& c : cases) fails += !run_case(env, c, rng).ok;
  if (!cases.empty()) std::printf("correctness: %zu cases, %d failed\n", cases.size(), fails);
  if (do_bench && sm90) {
    // Hopper kernel first (the numbers that matter), then the sm_80 defaults for comparison.
    const char* cfgs90[] = {"sm90",
                            "sm90:128,2,false",
                            "sm90:128,3,true",
                            "sm90:128,3,false",
                            "sm90:128,2,true,true",
                            "sm90:128,3,true,true",
                            "sm90:128,2,false,true",
                            "sm90:128,3,false,true"};
    for (Mod m : {Mod::Noop, Mod::Causal})
      for (int D : {64, 128})
        for (const char* cfg : cfgs90) bench(env, D, m, cfg, rng);
    for (Mod m : {Mod::AlibiCausal, Mod::SoftcapCausal})
      for (int D : {64, 128})
        for (const char* cfg : {"sm90", "sm90:128,3,true", "sm90:128,3,true,true", "sm90:128,3,false,true"})
          bench(env, D, m, cfg, rng);
    for (Mod m : {Mod::Noop, Mod::Causal, Mod::AlibiCausal, Mod::SoftcapCausal})
      for (int D : {64, 128}) bench(env, D, m, "", rng);
  }
  if (do_bench && sm80 && !sm90) {
    const char* cfgs64[] = {"", "128,64,4,2,1,true", "128,64,8,2", "128,128,4,2"};
    const char* cfgs128[] = {"", "128,32,4,2", "128,64,8,2", "256,64,8,2", "256,32,8,2", "128,128,8,2"};
    for (Mod m : {Mod::Noop, Mod::Causal}) {
      for (const char* cfg : cfgs64) bench(env, 64, m, cfg, rng);
      for (const char* cfg : cfgs128) bench(env, 128, m, cfg, rng);
    }
    for (Mod m : {Mod::AlibiCausal, Mod::SoftcapCausal}) {
      for (const char* cfg : {"", "128,64,8,2"}) bench(env, 64, m, cfg, rng);
      for (const char* cfg : {"", "128,64,8,2", "128,32,4,2"}) bench(env, 128, m, cfg, rng);
    }
  }
  double total = 0, worst = 0;
  for (auto& kv : env.cache) total += kv.second->compile_s, worst = std::max(worst, kv.second->compile_s);
  std::printf("compile: %zu variants, mean %.3f s, max %.3f s (%s)\n", env.cache.size(),
              total / std::max<size_t>(1, env.cache.size()), worst, name);
  return fails ? 1 : 0;
}
