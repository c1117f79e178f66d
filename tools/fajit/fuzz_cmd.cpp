// fajit fuzz: random score_mod / mask_mod graphs and shapes through every CPU stage (and, with
// --gpu, the kernels against the float64 reference). The fuzzer lives in tests/fuzz/.
//   fajit fuzz --seed 7 --cases 500 --seconds 60
//   fajit fuzz --seed 7 --case 123          replay one case (prints it, NVRTC-compiles it)
#include <iostream>

#include <CLI/CLI.hpp>

#include "fuzz.h"

namespace {
fa_fuzz::Config g_fuzz;
}  // namespace

CLI::App* add_fuzz_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "fuzz",
      "random score_mod/mask_mod graphs and shapes through tracing, verification, simplification, mask "
      "analysis, differentiation, codegen and NVRTC (--gpu: also the kernels vs the float64 reference)");
  cmd->add_option("--seed", g_fuzz.seed, "the run's seed (default 1)");
  cmd->add_option("--cases", g_fuzz.cases, "cases to run (default 100)")->check(CLI::Range(0, 100000000));
  cmd->add_option("--case", g_fuzz.only_case, "run only this case of the seed (a replay); prints it")
      ->check(CLI::Range(0, 100000000));
  cmd->add_option("--seconds", g_fuzz.seconds,
                  "stop starting new cases after this many seconds (0: no limit)");
  cmd->add_option("--nvrtc-every", g_fuzz.nvrtc_every,
                  "NVRTC-compile the kernels of every n-th case (default 10; 0: never)")
      ->check(CLI::Range(0, 100000000));
  cmd->add_flag("--gpu", g_fuzz.gpu,
                "also run the kernels on the GPU and check them against the float64 reference");
  cmd->add_flag(
      "--kv-linear", g_fuzz.kv_linear,
      "rewrite half the cases' score_mods as score ± rate·(kv − q), a random rate free of kv (the form "
      "the kernels add by FMA); the rest of each case is drawn as without it");
  cmd->add_flag(
      "--kv-range", g_fuzz.kv_range,
      "rewrite half the cases' mask_mods as an interval of keys a row (compares of kv, kv − q or q − kv "
      "with values free of kv, some at int32's ends: the form the kernels apply by two bounds a row); "
      "the rest of each case is drawn as without it");
  cmd->add_flag("--tile-edges", g_fuzz.tile_edges,
                "move half the cases' lengths to the kernels' tile edges (multiples of 192, 128, 112, 64; "
                "Lq % 192 = 64, the persistent forward's led partial block; a row either side); the rest of "
                "each case is drawn as without it");
  cmd->add_flag("-v,--verbose", g_fuzz.verbose, "print every case");
  return cmd;
}

int run_fuzz_command(const char* argv0) {
  g_fuzz.self = argv0;
  if (g_fuzz.only_case >= 0) g_fuzz.verbose = true;
  return fa_fuzz::run(g_fuzz, std::cout) == 0 ? 0 : 1;
}
