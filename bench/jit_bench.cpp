// JIT and cache latency: cold NVRTC compiles (a small kernel and, when templates/ has it, the
// real forward kernel), cache disk hits and memory hits. Prints one table.
//
//   fajit_bench_jit [--reps N]      (cache files go to a fresh directory under /tmp)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fajit/detail/embedded_templates.h"
#include "fajit/error.h"
#include "fajit/jit/cache.h"
#include "fajit/jit/key.h"
#include "fajit/jit/nvrtc.h"
#include "fajit/kernel_spec.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Row {
  std::string what, arch;
  size_t n;
  double median_us, min_us, max_us;
  std::string note;
};

Row summarize(std::string what, std::string arch, std::vector<double> us, std::string note = {}) {
  std::sort(us.begin(), us.end());
  return {std::move(what), std::move(arch), us.size(),      us[us.size() / 2],
          us.front(),      us.back(),       std::move(note)};
}

std::string fmt_time(double us) {
  char buf[32];
  if (us >= 1000.0)
    std::snprintf(buf, sizeof buf, "%.1f ms", us / 1000.0);
  else if (us >= 10.0)
    std::snprintf(buf, sizeof buf, "%.1f us", us);
  else
    std::snprintf(buf, sizeof buf, "%.3f us", us);
  return buf;
}

bool has_header(const char* name) {
  int n = 0;
  const fa::detail::EmbeddedHeader* h = fa::detail::embedded_headers(&n);
  for (int i = 0; i < n; ++i)
    if (std::strcmp(h[i].name, name) == 0) return std::strstr(h[i].text, "FAJIT_DEFINE_FORWARD");
  return false;
}

// `tag` makes each source distinct, so nothing can be reused between compiles.
std::string small_kernel(int tag) {
  return "#include \"fajit/params.h\"\n// variant " + std::to_string(tag) +
         "\nextern \"C\" __global__ void fa_small(FaFwdParams p) {\n"
         "  if (threadIdx.x == 0) p.lse[blockIdx.x] = p.scale * (float)p.len_q;\n}\n";
}

// A forward variant as codegen would emit it: causal mask + ALiBi-like score_mod (or none).
std::string forward_kernel(int tag, int head_dim, bool mods) {
  std::string s = "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n// variant " +
                  std::to_string(tag) + "\nstruct FaMods {\n";
  s += std::string("  static constexpr bool kHasScoreMod = ") + (mods ? "true" : "false") + ";\n";
  s += std::string("  static constexpr bool kHasMaskMod = ") + (mods ? "true" : "false") + ";\n";
  s += "  static __device__ __forceinline__ float score_mod(float score, int b, int h, int q,\n"
       "      int kv, const FaCaptures& cap) {\n"
       "    const float* slopes = (const float*)cap.buffers[0].ptr;  // fa: fa.load\n"
       "    return score + (float)(kv - q) * slopes[h];  // fa: arith.addf\n  }\n"
       "  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv,\n"
       "      const FaCaptures& cap) {\n    return kv <= q;  // fa: arith.cmpi sle\n  }\n};\n";
  const fa::TileConfig t = fa::default_tile(head_dim, head_dim, false);
  s += "#include \"fajit/forward.cuh\"\n" +
       fmt::format("using FaConfig = fa::FwdConfig<fa::bf16_t, {0}, {0}, {1}, {2}, {3}, {4}>;\n", head_dim,
                   t.block_m, t.block_n, t.warps, t.stages) +
       "FAJIT_DEFINE_FORWARD(fajit_fwd, FaConfig, FaMods)\n";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));

  std::vector<Row> rows;
  try {
    auto t0 = Clock::now();
    const fa::jit::Nvrtc& nv = fa::jit::Nvrtc::get();
    double load_ms = ms_since(t0);
    std::printf("NVRTC %s from %s (dlopen + symbol table: %.2f ms)\n", nv.version().c_str(),
                nv.library().c_str(), load_ms);

    // ---- cold compiles ----------------------------------------------------------------------
    int tag = 0;
    for (const char* arch : {"sm_80", "sm_90a"}) {
      fa::jit::CompileOptions opt;
      opt.arch = arch;
      std::vector<double> us;
      double first = 0;
      for (int r = 0; r < reps + 1; ++r) {
        double ms = nv.compile(small_kernel(++tag), "fa_small.cu", opt).wall_ms;
        if (r == 0 && arch == std::string("sm_80"))
          first = ms;
        else
          us.push_back(ms * 1000.0);
      }
      if (first > 0)
        rows.push_back(summarize("small kernel, first compile in process", arch, {first * 1000.0}));
      rows.push_back(summarize("small kernel (params.h)", arch, us));
    }
    fa::jit::CompileResult cubin_for_cache;
    if (has_header("fajit/forward.cuh")) {
      for (const char* arch : {"sm_80", "sm_90a"})
        for (int hd : {64, 128})
          for (bool mods : {false, true}) {
            fa::jit::CompileOptions opt;
            opt.arch = arch;
            std::vector<double> us;
            std::string what = "forward bf16 hd" + std::to_string(hd) + (mods ? " causal+alibi" : " no mods");
            try {
              for (int r = 0; r < std::max(1, reps / 2); ++r) {
                fa::jit::CompileResult res = nv.compile(forward_kernel(++tag, hd, mods), "fa_fwd.cu", opt);
                us.push_back(res.wall_ms * 1000.0);
                if (cubin_for_cache.cubin.size() < res.cubin.size()) cubin_for_cache = res;
              }
              rows.push_back(summarize(what, arch, us));
            } catch (const fa::Error& e) {
              std::string msg = e.what();
              std::printf("%s %s: compile failed: %s\n", what.c_str(), arch,
                          msg.substr(0, msg.find('\n', 200)).c_str());
            }
          }
    } else {
      std::printf("templates/fajit/forward.cuh with FAJIT_DEFINE_FORWARD not embedded; skipped\n");
    }
    if (cubin_for_cache.cubin.empty()) {
      fa::jit::CompileOptions opt;
      opt.arch = "sm_90a";
      cubin_for_cache = nv.compile(small_kernel(++tag), "fa_small.cu", opt);
    }
    const std::string& cubin = cubin_for_cache.cubin;
    std::printf("cache payload: %zu-byte cubin\n", cubin.size());

    // ---- key -----------------------------------------------------------------------------
    {
      const std::string src =
          has_header("fajit/forward.cuh") ? forward_kernel(0, 128, true) : small_kernel(0);
      std::vector<double> us;
      for (int r = 0; r < 2001; ++r) {
        auto k0 = Clock::now();
        std::string key =
            fa::jit::kernel_key(src, fa::jit::templates_version(), "spec", "sm_90a", nv.version());
        us.push_back(ms_since(k0) * 1000.0);
      }
      rows.push_back(summarize(
          "key: XXH3-128 of generated source (" + std::to_string(src.size()) + " B) + parts", "-", us));
    }

    // ---- disk and memory hits ---------------------------------------------------------------
    char tmpl[] = "/tmp/fajit-bench-XXXXXX";
    if (!::mkdtemp(tmpl)) throw fa::Error("cannot create a temporary directory");
    const std::string dir = tmpl;
    const std::string key = fa::jit::KeyBuilder().add("bench", "forward").hex();
    auto compile = [&] { return cubin; };
    { fa::jit::Cache(dir).get_or_compile(key, compile, "bench entry"); }
    {
      std::vector<double> us;
      for (int r = 0; r < 501; ++r) {
        fa::jit::Cache cache(dir);  // empty memory map: the lookup goes to disk
        auto h0 = Clock::now();
        fa::jit::Lookup l = cache.get_or_compile(key, compile);
        us.push_back(ms_since(h0) * 1000.0);
        if (l.origin != fa::CacheOrigin::kDisk) throw fa::Error("expected a disk hit");
      }
      rows.push_back(summarize("cache disk hit (page cache warm, verify checksums)", "-", us));
    }
    {
      fa::jit::Cache cache(dir);
      cache.get_or_compile(key, compile);
      std::vector<double> us;
      constexpr int kBatch = 1000;
      for (int r = 0; r < 1001; ++r) {
        auto m0 = Clock::now();
        for (int i = 0; i < kBatch; ++i)
          if (cache.get_or_compile(key, compile).origin != fa::CacheOrigin::kMemory)
            throw fa::Error("expected a memory hit");
        us.push_back(ms_since(m0) * 1000.0 / kBatch);
      }
      rows.push_back(summarize("cache memory hit (per call, batches of 1000)", "-", us));
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  } catch (const fa::Error& e) {
    std::fprintf(stderr, "fajit_bench_jit: %s\n", e.what());
    return 1;
  }

  std::printf("\n%-58s %-7s %5s %11s %11s %11s\n", "case", "arch", "n", "median", "min", "max");
  for (const Row& r : rows)
    std::printf("%-58s %-7s %5zu %11s %11s %11s\n", r.what.c_str(), r.arch.c_str(), r.n,
                fmt_time(r.median_us).c_str(), fmt_time(r.min_us).c_str(), fmt_time(r.max_us).c_str());
  return 0;
}
