#pragma once

#include <string>

#include <vector>

#include "fajit/kernel_spec.h"
#include "fajit/tensor.h"
#include "mod_args.h"

namespace fajit_cli {

struct RunOptions {
  ModArgs mods;                      // presets, expressions or an .mlir file
  std::vector<std::string> scalars;  // --scalar NAME=VALUE
  std::vector<std::string> buffers;  // --buffer NAME=D1[xD2...][:LO:HI]
  fa::DType dtype = fa::DType::bf16;
  int batch = 2, heads = 8, len = 1024, head_dim = 128, iters = 20;
  int head_dim_v = 0;          // 0: head_dim
  bool backward = false;       // also run, check and time the backward
  bool deterministic = false;  // with backward: BackwardOptions::deterministic, two runs bit for bit
  bool max_scores = false;     // also ask for each row's largest score (the row-max kernels), checked
  // Forward-only layouts (run_sequences): per-sequence lengths, GQA, kernel path, ragged, paged.
  int len_q = 0, len_kv = 0, heads_kv = 0;  // 0: len / heads
  std::string path = "auto";
  int splits = 0;
  bool varlen = false;
  int page_size = 0;             // 0: contiguous K/V
  int64_t seed = -1;             // the random inputs' (and --varlen lengths') seed; -1: fresh
  bool no_check = false;         // time only (shapes too large for the float64 reference)
  std::string kernel = "auto";   // forward family: auto, mma or wgmma
  std::string tile;              // forward tile "MxNwWsS" (e.g. 128x64w12s3); "": the default
  std::string autotune = "env";  // the dense forward's autotuning: env ($FAJIT_AUTOTUNE), on or off
  bool layouts() const {
    return len_q || len_kv || heads_kv || path != "auto" || splits || varlen || page_size;
  }
};

// The kernel family a --kernel value names: "mma", "wgmma", else auto.
fa::KernelFamily kernel_family(const std::string& name);
// A forward tile as the CLI spells it, MxNwWsS (e.g. 128x64w12s3); empty: the default.
fa::TileConfig parse_tile(const std::string& text);

// Compile, run on random data, check against the float64 reference, time (the backward too
// with `backward`: every gradient checked). 0 = OK or no GPU.
int run_variant(const RunOptions& options);

}  // namespace fajit_cli
