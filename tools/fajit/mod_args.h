// The mods of a command line, shared by `fajit dump`, `fajit run`, `fajit mask` and the lines of
// `fajit cache warm`: library presets (--mask, --score), expressions (--mask-mod, --score-mod,
// typed by --capture NAME:f32|i32) or an .mlir file; runtime scalars' values (--scalar
// NAME=VALUE); captured buffers' shapes and value ranges for `fajit run` (--buffer).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fajit/detail/expr.h"
#include "fajit/frontend.h"

namespace CLI {
class App;
}

namespace fajit_cli {

struct ModArgs {
  std::string mask, score, mask_expr, score_expr, file;
  std::vector<std::string> capture_types;  // NAME:f32 | NAME:i32
};

// The whole of a file, else fa::Error "cannot open 'PATH'".
std::string read_file(const std::string& path);

// --mask, --score, --mask-mod, --score-mod, --capture on `app`.
void add_mod_options(CLI::App* app, ModArgs& a);

// The types of --capture NAME:f32 / NAME:i32 declarations.
fa::ExprCaptureTypes capture_types(const std::vector<std::string>& decls);

// The traced mods: the .mlir file, else presets or expressions (noop mask, identity score where
// neither is given). Throws fa::Error naming a conflicting or malformed argument.
fa::Program program_of(const ModArgs& a);

// The presets' scalar values (sliding:1024's window = 1024, ...), none for expressions or a file.
std::map<std::string, double> preset_scalar_values(const ModArgs& a);

// --scalar NAME=VALUE arguments into `values` (a later one wins).
void add_scalar_args(const std::vector<std::string>& args, std::map<std::string, double>& values);

// A captured buffer of `fajit run`: --buffer NAME=D1[xD2...][:LO:HI], values uniform in [LO, HI]
// (integers inclusive; default -1..1 for f32, 0..7 for i32).
struct BufferArg {
  std::vector<int64_t> shape;
  bool has_range = false;
  double lo = 0, hi = 0;
};
std::map<std::string, BufferArg> parse_buffer_args(const std::vector<std::string>& args);

}  // namespace fajit_cli
