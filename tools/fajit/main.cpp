// fajit: the command line.
//   fajit dump --mlir --mask causal --score alibi     print the traced, simplified fa IR
//   fajit dump --mlir variant.mlir                    verify + simplify a fa module from a file
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "fajit/frontend.h"
#include "fajit/mods.h"

namespace {

struct DumpOptions {
  bool mlir = false;
  std::string mask;
  std::string score;
  std::string file;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fa::Error(fmt::format("cannot open '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fa::Program program_for(const DumpOptions& o) {
  if (!o.file.empty()) {
    if (!o.mask.empty() || !o.score.empty())
      throw fa::Error("give either an .mlir file or --mask/--score presets, not both");
    return fa::Program::parse(read_file(o.file), o.file);
  }
  fa::MaskMod mask = o.mask.empty() ? fa::noop_mask() : fa::mods::mask_preset(o.mask).mod;
  fa::ScoreMod score = o.score.empty() ? fa::identity_score() : fa::mods::score_preset(o.score).mod;
  return fa::trace(score, mask);
}

int run_dump(const DumpOptions& o) {
  fa::Program p = program_for(o);
  std::cout << p.to_mlir();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fajit: a just-in-time kernel compiler for FlexAttention-style attention", "fajit"};
  app.require_subcommand(1);
  DumpOptions dump;
  CLI::App* dump_cmd = app.add_subcommand("dump", "print the generated code of one attention variant");
  auto* what = dump_cmd->add_option_group("what", "what to print");
  what->add_flag("--mlir", dump.mlir, "the verified, simplified fa-dialect IR");
  what->require_option(1);
  dump_cmd->add_option("--mask", dump.mask, "mask preset: " + fa::mods::mask_preset_help());
  dump_cmd->add_option("--score", dump.score, "score preset: " + fa::mods::score_preset_help());
  dump_cmd->add_option("file", dump.file, "an .mlir file with a fa.score_mod and/or fa.mask_mod");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*dump_cmd) return run_dump(dump);
  } catch (const fa::Error& e) {
    std::fprintf(stderr, "fajit: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
