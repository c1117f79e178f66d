// Block-mask construction on the CPU: fa::analyze_block_mask (symbolic) and
// BlockMask::from_kinds (tables) for library masks at Lq = Lkv = 8k, 32k, 128k, block 128.
//   build/bench/fajit_bench_mask [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fajit/frontend.h"
#include "fajit/mask_analysis.h"
#include "fajit/mods.h"
#include "fajit/runtime/block_mask.h"

namespace {

template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;  // --only SPEC: one mask, analysis only (for profiling)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
  }
  struct M {
    const char* name;
    fa::MaskMod mod;
  };
  const char* specs[] = {"causal", "sliding:1024", "prefix_lm:2048", "padding:1000", "dilated:1024:4",
                         "document"};
  std::printf("%-16s %8s %10s %10s %10s %12s %12s\n", "mask", "L", "blocks", "decided", "evals",
              "analysis_ms", "tables_ms");
  for (const char* spec : specs) {
    if (!only.empty() && only != spec) continue;
    fa::mods::Preset<fa::MaskMod> p = fa::mods::mask_preset(spec);
    fa::Program prog = fa::trace(fa::identity_score(), p.mod);
    fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(prog);
    fa::ScalarValues sv = fa::scalar_values_of(p.scalar_values, prog);
    for (int64_t len : {8192, 32768, 131072}) {
      const int reps = quick ? 3 : (len > 40000 ? 21 : 51);
      fa::MaskAnalysis a;
      double ms = median_ms(reps, [&] { a = fa::analyze_block_mask(rp, 1, 1, len, len, 128, 128, sv); });
      double tables = -1;
      if (a.undecided == 0)
        tables = median_ms(reps, [&] { fa::BlockMask::from_kinds(1, 1, len, len, a.kinds); });
      std::printf("%-16s %8lld %10zu %10lld %10lld %12.3f %12.3f\n", spec, static_cast<long long>(len),
                  a.kinds.size(), static_cast<long long>(a.decided), static_cast<long long>(a.evaluations),
                  ms, tables);
    }
  }
  return 0;
}
