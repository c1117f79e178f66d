// Compiles every backward-kernel variant with NVRTC (no GPU needed): fp16/bf16 x head dims
// {64,128}x{64,128} x sm_80/sm_90a (other head dims below, both families) x {noop, causal+alibi with a slopes
// gradient (compiled as the deterministic variant: dK/dV without dQ reductions plus the dQ kernel over the
// forward tables)} mods x the tiles the host picks; prints compile time, registers and spills of the dK/dV
// kernel, and fails on any compile error or on a misused config that compiles.
//   usage: fajit_kernel_backward_test
#include "fa_nvrtc.h"

#include <cstdio>
#include <string>

int main() {
  try {
    int failures = 0, count = 0;
    std::printf("%-7s %-6s %4s %4s %-10s %-6s %8s %5s %s\n", "arch", "elem", "dqk", "dv", "mods", "tile",
                "seconds", "regs", "spill(st/ld)");
    for (const char* arch : {"sm_80", "sm_90a"})
      for (const char* elem : {"f16_t", "bf16_t"})
        for (int dqk : {64, 128})
          for (int dv : {64, 128})
            for (int mods = 0; mods < 2; ++mods) {
              const fa::TileConfig t =
                  fa::default_tile(dqk, dv, mods, fa::KernelFamily::kMmaSync, fa::KernelKind::kBackward);
              // with mods: the deterministic variant (dK/dV without dQ reductions, dQ kernel)
              const std::string cfg = std::to_string(t.block_m) + ", " + std::to_string(t.warps) + ", 2, " +
                                      (mods ? "true" : "false");
              fa_test::Compiled c = fa_test::compile(
                  fa_test::backward_source(mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), elem,
                                           dqk, dv, cfg),
                  arch, true, "fajit_bwd_dkdv");
              ++count;
              if (c.cubin.empty()) ++failures;
              std::printf("%-7s %-6s %4d %4d %-10s %-6s %8.3f %5d %d/%d\n", arch, elem, dqk, dv,
                          mods ? "alibi+cau" : "noop", cfg.c_str(), c.seconds, c.regs, c.spill_stores,
                          c.spill_loads);
            }
    // Other head-dim classes (mma.sync): odd chunk counts, padded rows, QK != V; above 256
    // columns the split dK/dV grid (sm_90a: sm_80's shared memory does not hold them).
    for (auto [dqk, dv] :
         {std::pair{32, 32}, {40, 40}, {80, 80}, {96, 96}, {136, 112}, {192, 128}, {200, 72}, {256, 256}})
      for (int mods = 0; mods < 2; ++mods) {
        const char* arch = dqk + dv > 256 ? "sm_90a" : "sm_80";
        fa::KernelSpec spec;
        spec.kind = fa::KernelKind::kBackward;
        spec.dtype = fa::DType::bf16;
        spec.head_dim_qk = dqk, spec.head_dim_v = dv;
        spec.family = fa::KernelFamily::kMmaSync;
        spec.arch = arch;
        const fa::TileConfig t = spec.resolved(mods).tile;
        const std::string cfg =
            std::to_string(t.block_m) + ", " + std::to_string(t.warps) + ", 2, " + (mods ? "true" : "false");
        fa_test::Compiled c = fa_test::compile(
            fa_test::backward_source(mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), "bf16_t",
                                     dqk, dv, cfg),
            arch, true, "fajit_bwd_dkdv");
        ++count;
        if (c.cubin.empty()) ++failures;
        std::printf("%-7s %-6s %4d %4d %-10s %-6s %8.3f %5d %d/%d\n", arch, "bf16_t", dqk, dv,
                    mods ? "alibi+cau" : "noop", cfg.c_str(), c.seconds, c.regs, c.spill_stores,
                    c.spill_loads);
      }
    // The Hopper dK/dV kernel (wgmma) at the tile the host picks. mods: 0 noop; 1 alibi+causal;
    // 2 the same deterministic; 3 the same at the tile of a score_mod whose derivative weighs
    // (softcap's: BLOCK_M 64 up to 64 / 64) - ALiBi's is dS = dT, which takes the tile of none.
    auto compile_sm90 = [&](const char* elem, int dqk, int dv, int mods) {
      const fa::TileConfig t =
          fa::default_tile(dqk, dv, mods == 3, fa::KernelFamily::kWgmma, fa::KernelKind::kBackward);
      // 64-key tiles: the wide-head kernel (Sm90WideBwdConfig, no BLOCK_M parameter)
      const bool wide = t.block_n == 64;
      const std::string cfg = std::to_string(dqk) + ", " + std::to_string(dv) + ", " +
                              (wide ? "" : std::to_string(t.block_m) + ", ") + std::to_string(t.stages) +
                              ", " + (mods == 2 ? "true" : "false");
      fa_test::Compiled c = fa_test::compile(
          fa_test::backward_sm90_source(mods ? fa_test::mods_alibi_causal() : fa_test::mods_noop(), elem, cfg,
                                        wide ? "Sm90WideBwdConfig" : "Sm90BwdConfig"),
          "sm_90a", true, "fajit_bwd_dkdv");
      ++count;
      if (c.cubin.empty()) ++failures;
      const char* what[] = {"noop", "alibi+cau", "alibi+det", "alibi+m64"};
      std::printf("%-7s %-6s %4d %4d %-10s %-6s %8.3f %5d %d/%d\n", "sm_90a", elem, dqk, dv, what[mods],
                  ("wgmma " + cfg).c_str(), c.seconds, c.regs, c.spill_stores, c.spill_loads);
    };
    // 64 and 128 at both dtypes, every mods kind (both dQ modes).
    for (const char* elem : {"f16_t", "bf16_t"})
      for (int d : {64, 128})
        for (int mods = 0; mods < 4; ++mods) compile_sm90(elem, d, d, mods);
    // Other head dims up to 128: one 64-column block (32, 40: dQ split by rows or keys, n = D up
    // to 16), two (72 with its zero chunk, 80, 96, 112: dQ split by blocks, the second one's
    // columns past D dropped), QK != V (64/128, 128/64, 80/48); noop and the BLOCK_M 64 tile of
    // a weighing score_mod, 96 deterministic too.
    for (auto [dqk, dv] : {std::pair{32, 32},
                           {40, 40},
                           {72, 72},
                           {80, 80},
                           {96, 96},
                           {112, 112},
                           {64, 128},
                           {128, 64},
                           {80, 48}})
      for (int mods : {0, 3, 2})
        if (mods != 2 || dqk == 96) compile_sm90("bf16_t", dqk, dv, mods);
    // Above 128 the wide-head kernel: 256 (2 stages) at both dtypes and every mods kind; 136 and
    // 160 (dQ blocks past the pitch), 192 (3 stages), QK != V (192/128, 256/128, 64/256 with one
    // QK block, 200/72), noop and alibi+causal, 192 deterministic too.
    for (const char* elem : {"f16_t", "bf16_t"})
      for (int mods = 0; mods < 4; ++mods) compile_sm90(elem, 256, 256, mods);
    for (auto [dqk, dv] :
         {std::pair{136, 136}, {160, 160}, {192, 192}, {192, 128}, {256, 128}, {64, 256}, {200, 72}})
      for (int mods : {0, 1, 2})
        if (mods != 2 || dqk == 192) compile_sm90("bf16_t", dqk, dv, mods);
    try {
      fa_test::compile(fa_test::backward_source(fa_test::mods_noop(), "bf16_t", 128, 128, "128, 4"), "sm_80",
                       false, "fajit_bwd_dkdv");
      std::printf("FAIL: BLOCK_M 128 with 4 warps compiled\n");
      ++failures;
    } catch (const std::exception& e) {
      if (std::string(e.what()).find("every warp owns at least one 16-row m-tile of dQ") ==
          std::string::npos) {
        std::printf("FAIL: unexpected message for BLOCK_M 128, 4 warps:\n%s\n", e.what());
        ++failures;
      }
    }
    std::printf("%d backward variants compiled, %d failures\n", count, failures);
    return failures ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
