#include "mod_args.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "fajit/error.h"
#include "fajit/mods.h"

namespace fajit_cli {
std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw fa::Error(fmt::format("'{}' is a directory, not a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fa::Error(fmt::format("cannot open '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// The whole of `text` as a number, else fa::Error naming `arg`.
double number(const std::string& text, const std::string& arg, const char* what) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw fa::Error(fmt::format("{} '{}': '{}' is not a number", what, arg, text));
  }
}

}  // namespace

void add_mod_options(CLI::App* app, ModArgs& a) {
  app->add_option("--mask", a.mask, "mask preset: " + fa::mods::mask_preset_help());
  app->add_option("--score", a.score, "score preset: " + fa::mods::score_preset_help());
  app->add_option("--mask-mod", a.mask_expr,
                  "mask_mod expression over b h q kv, e.g. 'q >= kv && q - kv < window'");
  app->add_option("--score-mod", a.score_expr,
                  "score_mod expression over score b h q kv, e.g. 'score + slopes[h] * (kv - q)'");
  app->add_option("--capture", a.capture_types, "type of a capture in expressions: NAME:f32 or NAME:i32");
}

fa::ExprCaptureTypes capture_types(const std::vector<std::string>& decls) {
  fa::ExprCaptureTypes t;
  for (const std::string& d : decls) {
    size_t colon = d.find(':');
    std::string name = d.substr(0, colon), type = colon == std::string::npos ? "" : d.substr(colon + 1);
    if (name.empty() || (type != "f32" && type != "i32"))
      throw fa::Error(fmt::format("--capture '{}': expected NAME:f32 or NAME:i32", d));
    t.types[name] = type == "f32";
  }
  return t;
}

fa::Program program_of(const ModArgs& a) {
  bool any_mod = !a.mask.empty() || !a.score.empty() || !a.mask_expr.empty() || !a.score_expr.empty();
  if (!a.file.empty()) {
    if (any_mod)
      throw fa::Error("give either an .mlir file or --mask/--score/--mask-mod/--score-mod, not both");
    return fa::Program::parse(read_file(a.file), a.file);
  }
  if (!a.mask.empty() && !a.mask_expr.empty()) throw fa::Error("give --mask or --mask-mod, not both");
  if (!a.score.empty() && !a.score_expr.empty()) throw fa::Error("give --score or --score-mod, not both");
  fa::ExprCaptureTypes types = capture_types(a.capture_types);
  fa::MaskMod mask = !a.mask_expr.empty() ? fa::parse_mask_mod(a.mask_expr, types)
                     : !a.mask.empty()    ? fa::mods::mask_preset(a.mask).mod
                                          : fa::noop_mask();
  fa::ScoreMod score = !a.score_expr.empty() ? fa::parse_score_mod(a.score_expr, types)
                       : !a.score.empty()    ? fa::mods::score_preset(a.score).mod
                                             : fa::identity_score();
  return fa::trace(score, mask);
}

std::map<std::string, double> preset_scalar_values(const ModArgs& a) {
  std::map<std::string, double> v;
  if (!a.file.empty()) return v;
  if (!a.mask.empty() && a.mask_expr.empty())
    for (auto& [name, value] : fa::mods::mask_preset(a.mask).scalar_values) v[name] = value;
  if (!a.score.empty() && a.score_expr.empty())
    for (auto& [name, value] : fa::mods::score_preset(a.score).scalar_values) v[name] = value;
  return v;
}

void add_scalar_args(const std::vector<std::string>& args, std::map<std::string, double>& values) {
  for (const std::string& s : args) {
    size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw fa::Error(fmt::format("--scalar '{}': expected NAME=VALUE", s));
    values[s.substr(0, eq)] = number(s.substr(eq + 1), s, "--scalar");
  }
}

std::map<std::string, BufferArg> parse_buffer_args(const std::vector<std::string>& args) {
  std::map<std::string, BufferArg> out;
  for (const std::string& s : args) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw fa::Error(fmt::format("--buffer '{}': expected NAME=D1[xD2...][:LO:HI]", s));
    BufferArg b;
    std::string rest = s.substr(eq + 1);
    const size_t colon = rest.find(':');
    if (colon != std::string::npos) {
      const std::string range = rest.substr(colon + 1);
      const size_t c2 = range.find(':');
      if (c2 == std::string::npos)
        throw fa::Error(fmt::format("--buffer '{}': a range is LO:HI (expected NAME=D1[xD2...][:LO:HI])", s));
      b.has_range = true;
      b.lo = number(range.substr(0, c2), s, "--buffer");
      b.hi = number(range.substr(c2 + 1), s, "--buffer");
      if (!(b.lo <= b.hi)) throw fa::Error(fmt::format("--buffer '{}': LO must not exceed HI", s));
      rest = rest.substr(0, colon);
    }
    for (size_t at = 0;;) {
      const size_t x = rest.find('x', at);
      const double d =
          number(rest.substr(at, x == std::string::npos ? std::string::npos : x - at), s, "--buffer");
      if (d < 1 || d != static_cast<double>(static_cast<int64_t>(d)) || d > 2147483647.0)
        throw fa::Error(fmt::format("--buffer '{}': dimensions are positive integers", s));
      b.shape.push_back(static_cast<int64_t>(d));
      if (x == std::string::npos) break;
      at = x + 1;
    }
    if (b.shape.size() > 4) throw fa::Error(fmt::format("--buffer '{}': a buffer has 1 to 4 dimensions", s));
    out[s.substr(0, eq)] = b;
  }
  return out;
}

}  // namespace fajit_cli
