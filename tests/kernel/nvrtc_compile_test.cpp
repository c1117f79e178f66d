// Compiles every forward-kernel variant with NVRTC (no GPU needed): fp16/bf16 x head dims
// {64,128}x{64,128} x sm_80/sm_90a x {noop, causal+alibi} mods, from in-memory headers only.
// Prints compile time, registers and spills; fails on any compile error.
//   usage: fajit_kernel_compile_test [template_dir]
#include "fa_nvrtc.h"

#include <cstdio>

int main(int argc, char** argv) {
  try {
    fa_test::Headers headers(argc > 1 ? argv[1] : FAJIT_TEMPLATE_DIR);
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
              fa_test::Compiled c = fa_test::compile(headers, src, arch);
              ++count;
              total += c.seconds;
              worst = c.seconds > worst ? c.seconds : worst;
              const bool spills = c.spill_stores > 0 || c.spill_loads > 0;
              if (c.cubin.empty()) ++failures;
              if (spills) ++spilling;   // reported, not fatal: speed is judged by the GPU check
              std::printf("%-7s %-6s %4d %4d %-10s %8.3f %5d %d/%d%s\n", arch, elem, dqk, dv,
                          mods ? "alibi+cau" : "noop", c.seconds, c.regs, c.spill_stores,
                          c.spill_loads, spills ? "  <-- SPILLS" : "");
            }
    // Misuse is rejected at compile time with a readable message.
    try {
      fa_test::compile(headers, fa_test::variant_source(fa_test::mods_noop(), "bf16_t", 96, 64), "sm_80",
                       false);
      std::printf("FAIL: head dim 96 compiled\n");
      ++failures;
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("DQK must be 64 or 128") == std::string::npos) {
        std::printf("FAIL: unexpected message for head dim 96:\n%s\n", e.what());
        ++failures;
      }
    }
    std::printf("%d variants, mean %.3f s, max %.3f s per compile, %d with spills, %d failures\n",
                count, total / count, worst, spilling, failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
