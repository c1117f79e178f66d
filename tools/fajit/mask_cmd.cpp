// fajit mask: the block mask of a mask_mod, decided symbolically on the CPU.
//   fajit mask --mask sliding:1024 --q-len 131072 --stats
//   fajit mask --mask causal --q-len 1000 --kv-len 1500 --block 128 --render
//   fajit mask --mask-mod 'q >= kv && q - kv <= w' --scalar w=300 --q-len 4096 --stats
// Blocks the analysis cannot decide are evaluated element by element on the CPU when the
// mask reads no buffers; a mask that reads buffers (document ids) needs their values, which
// the CLI does not have: such blocks are reported and the command fails.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "fajit/block_mask.h"
#include "fajit/detail/expr.h"
#include "fajit/detail/interp.h"
#include "fajit/detail/mask_analysis.h"
#include "fajit/error.h"
#include "fajit/frontend.h"
#include "fajit/mods.h"
#include "mod_args.h"

namespace {

struct MaskOptions {
  std::string mask, mask_expr;
  std::vector<std::string> scalars, capture_types;
  int64_t len_q = 0, len_kv = 0;
  int block = fa::BlockMask::kDefaultBlock, batch = 1, heads = 1;
  bool stats = false, render = false;
  int render_width = 64;
};

MaskOptions g_mask;

// One character per group of blocks: '#' all full, '.' all empty, '+' otherwise.
void render(const std::vector<uint8_t>& kinds, int nq, int nkv, int max_cells, int64_t len_q, int64_t len_kv,
            int block) {
  const int gq = (nq + max_cells - 1) / max_cells, gk = (nkv + max_cells - 1) / max_cells;
  std::cout << fmt::format("block mask Lq={} Lkv={}, {}x{} blocks{}: '#' full, '+' partial, '.' empty\n",
                           len_q, len_kv, nq, nkv,
                           gq * gk > 1 ? fmt::format(", one character per {}x{} blocks", gq, gk) : "");
  for (int r = 0; r < nq; r += gq) {
    std::string line;
    for (int c = 0; c < nkv; c += gk) {
      bool all_full = true, all_empty = true;
      for (int i = r; i < std::min(nq, r + gq); ++i)
        for (int j = c; j < std::min(nkv, c + gk); ++j) {
          const fa::BlockKind k = fa::BlockKind(kinds[size_t(i) * nkv + j]);
          all_full &= k == fa::BlockKind::kFull;
          all_empty &= k == fa::BlockKind::kEmpty;
        }
      line += all_full ? '#' : all_empty ? '.' : '+';
    }
    std::cout << line << '\n';
  }
  (void)block;
}

}  // namespace

CLI::App* add_mask_command(CLI::App& app) {
  MaskOptions& o = g_mask;
  CLI::App* cmd = app.add_subcommand(
      "mask", "the block mask of a mask_mod, decided symbolically (no GPU needed for affine masks)");
  cmd->add_option("--mask", o.mask, "mask preset: " + fa::mods::mask_preset_help());
  cmd->add_option("--mask-mod", o.mask_expr, "mask_mod expression over b h q kv");
  cmd->add_option("--scalar", o.scalars, "runtime scalar value NAME=VALUE (overrides a preset's)");
  cmd->add_option("--capture", o.capture_types, "type of a capture in expressions: NAME:f32 or NAME:i32");
  cmd->add_option("--q-len", o.len_q, "query length")->required();
  cmd->add_option("--kv-len", o.len_kv, "key/value length (default: the query length)");
  cmd->add_option("--block", o.block, "block size (default 128)");
  cmd->add_option("--batch", o.batch, "batch size (tables keep it only when the mask reads b)");
  cmd->add_option("--heads", o.heads, "head count (tables keep it only when the mask reads h)");
  cmd->add_flag("--stats", o.stats, "density, full/partial/empty counts, blocks decided symbolically");
  cmd->add_flag("--render", o.render, "a small text picture of the block mask (batch 0, head 0)");
  cmd->add_option("--render-width", o.render_width, "at most this many characters per line (default 64)");
  return cmd;
}

int run_mask_command() {
  const MaskOptions& o = g_mask;
  if (o.mask.empty() == o.mask_expr.empty()) throw fa::Error("give exactly one of --mask or --mask-mod");
  const int64_t len_kv = o.len_kv > 0 ? o.len_kv : o.len_q;
  if (o.len_q < 1 || len_kv < 1) throw fa::Error("--q-len and --kv-len must be positive");
  if (o.block < 1) throw fa::Error("--block must be positive");
  if (o.render_width < 1) throw fa::Error("--render-width must be positive");

  std::map<std::string, double> values;
  fa::MaskMod mod;
  if (!o.mask.empty()) {
    fa::mods::Preset<fa::MaskMod> preset = fa::mods::mask_preset(o.mask);
    mod = preset.mod;
    values = preset.scalar_values;
  } else {
    mod = fa::parse_mask_mod(o.mask_expr, fajit_cli::capture_types(o.capture_types));
  }
  fajit_cli::add_scalar_args(o.scalars, values);
  fa::Program program = fa::trace(fa::identity_score(), mod);
  fa::ScalarValues sv = fa::scalar_values_of(values, program);
  for (const fa::Program::Capture& c : program.captures())
    if (!c.is_buffer && c.used_by_mask && !sv.count(c.name))
      throw fa::Error(fmt::format("scalar '{}' has no value; give --scalar {}=VALUE", c.name, c.name));

  auto t0 = std::chrono::steady_clock::now();
  fa::MaskRangeProgram rp = fa::MaskRangeProgram::compile(program);
  fa::MaskAnalysis a = fa::analyze_block_mask(rp, o.batch, o.heads, o.len_q, len_kv, o.block, o.block, sv);
  auto t1 = std::chrono::steady_clock::now();
  const int64_t symbolic = a.decided, total = int64_t(a.kinds.size());
  int64_t on_cpu = 0;
  std::string buffers;
  for (const fa::Program::Capture& c : program.captures())
    if (c.is_buffer && c.used_by_mask) buffers += (buffers.empty() ? "'" : ", '") + c.name + "'";
  if (a.undecided > 0 && buffers.empty()) {
    fa::Bindings env;
    for (const auto& [name, v] : sv) {
      if (v.type == fa::ScalarType::kF32)
        env.scalar_f32(name, v.f);
      else
        env.scalar_i32(name, v.i);
    }
    fa::ModProgram mp = fa::ModProgram::mask_of(program);
    on_cpu = fa::evaluate_undecided_blocks(a, mp, env, o.len_q, len_kv, o.block, o.block);
  }
  auto t2 = std::chrono::steady_clock::now();
  const double ms_analysis = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double ms_cpu = std::chrono::duration<double, std::milli>(t2 - t1).count();

  int64_t full = 0, partial = 0, empty = 0;
  for (uint8_t k : a.kinds) {
    full += k == uint8_t(fa::BlockKind::kFull);
    partial += k == uint8_t(fa::BlockKind::kPartial);
    empty += k == uint8_t(fa::BlockKind::kEmpty);
  }
  if (o.stats || !o.render) {
    std::cout << fmt::format("mask @{}  Lq={} Lkv={}  block {}x{}  tables [{}, {}, {}, {}]\n",
                             program.mask_mod_name(), o.len_q, len_kv, o.block, o.block, a.batch, a.heads,
                             a.num_q_blocks, a.num_kv_blocks);
    if (a.undecided == 0)
      std::cout << fmt::format("density: {:.4f} (non-empty blocks / all)\n",
                               double(full + partial) / double(std::max<int64_t>(1, total)));
    std::cout << fmt::format("full: {}  partial: {}  empty: {}{}\n", full, partial, empty,
                             a.undecided ? fmt::format("  undecided: {}", a.undecided) : "");
    std::cout << fmt::format("decided symbolically: {} of {} ({:.1f}%), evaluated on the CPU: {}\n", symbolic,
                             total, 100.0 * double(symbolic) / double(std::max<int64_t>(1, total)), on_cpu);
    std::cout << fmt::format("time: analysis {:.3f} ms, CPU evaluation {:.3f} ms\n", ms_analysis, ms_cpu);
  }
  if (a.undecided > 0) {
    std::cout.flush();
    std::fprintf(stderr,
                 "fajit: error: %lld blocks depend on data (buffer %s); evaluating them needs the buffer "
                 "values, which only a program building the mask has (fa::create_block_mask on a GPU)\n",
                 static_cast<long long>(a.undecided), buffers.c_str());
    return 1;
  }
  if (o.render) render(a.kinds, a.num_q_blocks, a.num_kv_blocks, o.render_width, o.len_q, len_kv, o.block);
  return 0;
}
