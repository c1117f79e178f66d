// Compiles every forward-kernel variant with NVRTC (no GPU needed): fp16/bf16 x head dims
// {64,128}x{64,128} x sm_80/sm_90a x {noop, causal+alibi} mods, from the embedded headers only
// (fa::jit::Nvrtc, as libfajit compiles); one of each other head-dim class on sm_80;
// then the Hopper kernel (forward_sm90.cuh, sm_90a) over the same grid plus its config knobs
// and the other head dims it takes (multiples of 8 up to 256).
// Prints compile time, registers and spills; fails on any compile error.
//   usage: fajit_kernel_compile_test
#include "fa_nvrtc.h"

#include <cstdio>
#include <tuple>
#include <vector>

int main() {
  try {
    int failures = 0, count = 0, spilling = 0;
    double total = 0, worst = 0;
    std::printf("%-7s %-6s %4s %4s %-10s %8s %5s %s\n", "arch", "elem", "dqk", "dv", "mods", "seconds",
                "regs", "spill(st/ld)");
    for (const char* arch : {"sm_80", "sm_90a"})
      for (const char* elem : {"f16_t", "bf16_t"})
        for (int dqk : {64, 128})
          for (int dv : {64, 128})
            for (int mods = 0; mods < 2; ++mods) {
              const std::string src = fa_test::variant_source(
                  mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), elem, dqk, dv);
              fa_test::Compiled c = fa_test::compile(src, arch);
              ++count;
              total += c.seconds;
              worst = c.seconds > worst ? c.seconds : worst;
              const bool spills = c.spill_stores > 0 || c.spill_loads > 0;
              if (c.cubin.empty()) ++failures;
              if (spills) ++spilling;  // reported, not fatal: speed is judged by the GPU check
              std::printf("%-7s %-6s %4d %4d %-10s %8.3f %5d %d/%d%s\n", arch, elem, dqk, dv,
                          mods ? "alibi+cau" : "noop", c.seconds, c.regs, c.spill_stores, c.spill_loads,
                          spills ? "  <-- SPILLS" : "");
            }
    // Every other head-dim class on sm_80 with the host's default tile (odd chunk counts, padded
    // shared rows, 16 rows per warp above 128, QK != V).
    for (auto [dqk, dv] :
         {std::pair{32, 32}, {40, 40}, {80, 80}, {96, 96}, {192, 128}, {256, 256}, {104, 56}})
      for (int mods = 0; mods < 2; ++mods) {
        const std::string src = fa_test::variant_source(
            mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), "bf16_t", dqk, dv);
        fa_test::Compiled c = fa_test::compile(src, "sm_80");
        ++count;
        total += c.seconds;
        worst = c.seconds > worst ? c.seconds : worst;
        const bool spills = c.spill_stores > 0 || c.spill_loads > 0;
        if (c.cubin.empty()) ++failures;
        if (spills) ++spilling;
        std::printf("%-7s %-6s %4d %4d %-10s %8.3f %5d %d/%d%s\n", "sm_80", "bf16_t", dqk, dv,
                    mods ? "alibi+cau" : "noop", c.seconds, c.regs, c.spill_stores, c.spill_loads,
                    spills ? "  <-- SPILLS" : "");
      }
    // Hopper kernel: default config over the grid, then the non-default knobs once each.
    struct V90 {
      const char* elem;
      int dqk, dv, mods;
      const char* cfg;
    };
    std::vector<V90> v90;
    for (const char* elem : {"f16_t", "bf16_t"})
      for (int dqk : {64, 128})
        for (int dv : {64, 128})
          for (int mods = 0; mods < 2; ++mods) v90.push_back({elem, dqk, dv, mods, ""});
    // BLOCK_N, STAGES, OVERLAP, PINGPONG, EARLY_K (the host gives 2-stage rings EARLY_K)
    for (const char* cfg : {"128,2,false", "128,3,true", "64,2,true", "64,4,false", "128,2,false,false,true",
                            "128,2,true,true,true", "64,2,true,false,true"})
      v90.push_back({"bf16_t", 128, 128, 1, cfg});
    for (auto [elem, dqk, dv, cfg] :
         {// Three consumer warpgroups (192 query rows, the default up to 64 without a
          // score_mod): with a score_mod, without overlap, 4 stages, and the narrow head dims.
          std::tuple{"bf16_t", 64, 64, "128,3,true,true,false,3"},
          {"bf16_t", 64, 64, "128,3,false,true,false,3"},
          {"bf16_t", 64, 64, "128,4,true,true,false,3"},
          {"bf16_t", 32, 32, "128,3,true,true,false,3"},
          {"bf16_t", 40, 48, "128,3,true,true,false,3"},
          // Three consumers between 64 and 96 with 112 or 96 keys a tile (192x112 the default
          // without mods): 3 and 2 stages, V narrower than QK, a padded head dim, f16.
          {"bf16_t", 96, 96, "112,3,true,true,false,3"},
          {"bf16_t", 80, 80, "112,2,true,true,true,3"},
          {"f16_t", 96, 64, "112,3,true,true,false,3"},
          {"bf16_t", 72, 72, "96,3,true,true,false,3"}})
      v90.push_back({elem, dqk, dv, 1, cfg});
    v90.push_back({"bf16_t", 96, 96, 0, "112,3,true,true,false,3"});
    // Every other head-dim class (padded rows, P·V's N rounded up to 16, odd chunks).
    for (auto [dqk, dv] : {std::pair{32, 32}, {40, 40}, {72, 72}, {80, 80}, {96, 96}, {112, 48}, {104, 56}})
      v90.push_back({"bf16_t", dqk, dv, 1, "128,3,true"});
    // Above 128: BLOCK_N 128 while V fits (192/128, 256/64), else 64 with P·V as two wgmmas
    // (128 + the rest, or 64 + 80 at 144).
    for (auto [dqk, dv, cfg] : {std::tuple{192, 128, "128,2,true,true,true"},
                                {256, 64, "128,2,true,true,true"},
                                {144, 144, "64,3,true"},
                                {200, 168, "64,2,true,true,true"},
                                {256, 256, "64,2,true,true,true"}})
      v90.push_back({"bf16_t", dqk, dv, 1, cfg});
    v90.push_back({"f16_t", 256, 256, 0, "64,2,true,true,true"});
    // The cp.async K/V twins (CP_ASYNC_KV, for tensors the driver cannot map): two and three
    // consumers, whole and padded rows, above 128.
    for (auto [dqk, dv, cfg] : {std::tuple{128, 128, "128,3,true,true,false,2,true"},
                                {64, 64, "128,3,true,true,false,3,true"},
                                {80, 80, "112,3,true,true,false,3,true"},
                                {72, 136, "64,2,true,true,true,2,true"}})
      v90.push_back({"bf16_t", dqk, dv, 1, cfg});
    // The persistent form (PERSISTENT, what the host launches on the dense TMA tiles where a
    // second Q region fits): with and without mods, without overlap, EARLY_K at 192x112, d32,
    // two consumer warpgroups at d128 (2 stages, EARLY_K) and d64.
    for (auto [dqk, dv, mods, cfg] : {std::tuple{64, 64, 1, "128,3,true,true,false,3,false,true"},
                                      {128, 128, 1, "128,2,true,true,true,2,false,true"},
                                      {64, 64, 0, "128,3,true,true,false,2,false,true"},
                                      {64, 64, 0, "128,3,true,true,false,3,false,true"},
                                      {64, 64, 1, "128,3,false,true,false,3,false,true"},
                                      {32, 32, 1, "128,3,true,true,false,3,false,true"},
                                      {80, 80, 0, "112,2,true,true,true,3,false,true"}})
      v90.push_back({"bf16_t", dqk, dv, mods, cfg});
    // Three consumers at 128 keys above DV 64, P through shared memory (192x128 s2, one block a
    // CTA: the second Q region does not fit): d128 with and without mods, f16, d96, d80, d112/72,
    // without the intra-warpgroup overlap (S, softmax, P·V in turn).
    for (auto [elem, dqk, dv, mods, cfg] : {std::tuple{"bf16_t", 128, 128, 0, "128,2,true,true,true,3"},
                                            {"bf16_t", 128, 128, 1, "128,2,true,true,true,3"},
                                            {"f16_t", 128, 128, 1, "128,2,true,true,true,3"},
                                            {"bf16_t", 96, 96, 1, "128,2,true,true,true,3"},
                                            {"bf16_t", 80, 80, 0, "128,2,true,true,true,3"},
                                            {"bf16_t", 112, 72, 1, "128,2,true,true,true,3"},
                                            {"bf16_t", 128, 128, 1, "128,2,false,true,true,3"}})
      v90.push_back({elem, dqk, dv, mods, cfg});
    for (const V90& v : v90) {
      const std::string src = fa_test::variant_source_sm90(
          v.mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), v.elem, v.dqk, v.dv, v.cfg);
      fa_test::Compiled c = fa_test::compile(src, "sm_90a");
      ++count;
      total += c.seconds;
      worst = c.seconds > worst ? c.seconds : worst;
      const bool spills = c.spill_stores > 0 || c.spill_loads > 0;
      if (c.cubin.empty()) ++failures;
      if (spills) ++spilling;
      std::printf("%-7s %-6s %4d %4d %-10s %8.3f %5d %d/%d%s  cfg=%s\n", "sm90", v.elem, v.dqk, v.dv,
                  v.mods ? "alibi+cau" : "noop", c.seconds, c.regs, c.spill_stores, c.spill_loads,
                  spills ? "  <-- SPILLS" : "", *v.cfg ? v.cfg : "default");
    }
    try {
      fa_test::compile(fa_test::variant_source_sm90(fa_test::mods_noop(), "bf16_t", 128, 128, "144,2,true"),
                       "sm_90a", false);
      std::printf("FAIL: sm90 BLOCK_N 144 compiled\n");
      ++failures;
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("BLOCK_N must be a multiple of 16 from 64 to 128") ==
          std::string::npos) {
        std::printf("FAIL: unexpected message for sm90 BLOCK_N 144:\n%s\n", e.what());
        ++failures;
      }
    }
    try {
      fa_test::compile(fa_test::variant_source_sm90(fa_test::mods_noop(), "bf16_t", 128, 128,
                                                    "128,2,true,true,true,2,true,true"),
                       "sm_90a", false);
      std::printf("FAIL: sm90 PERSISTENT with cp.async K/V compiled\n");
      ++failures;
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("PERSISTENT needs K/V by TMA (CP_ASYNC_KV false)") ==
          std::string::npos) {
        std::printf("FAIL: unexpected message for sm90 PERSISTENT with cp.async:\n%s\n", e.what());
        ++failures;
      }
    }
    // Misuse is rejected at compile time with a readable message.
    try {
      fa_test::compile(fa_test::variant_source(fa_test::mods_noop(), "bf16_t", 100, 64, "128, 64, 4, 2"),
                       "sm_80", false);
      std::printf("FAIL: head dim 100 compiled\n");
      ++failures;
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("a head dim is a multiple of 8") == std::string::npos) {
        std::printf("FAIL: unexpected message for head dim 100:\n%s\n", e.what());
        ++failures;
      }
    }
    std::printf("%d variants, mean %.3f s, max %.3f s per compile, %d with spills, %d failures\n", count,
                total / count, worst, spilling, failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
