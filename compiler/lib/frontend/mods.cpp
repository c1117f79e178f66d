#include "fajit/mods.h"

#include <charconv>
#include <vector>

#include <fmt/format.h>

namespace fa::mods {

MaskMod causal() {
  return {"causal", [](Index, Index, Index q, Index kv) { return q >= kv; }};
}

MaskMod sliding_window(Scalar<int32_t> w) {
  return {"sliding_window", [w](Index, Index, Index q, Index kv) { return q >= kv && q - kv <= w; }};
}

MaskMod prefix_lm(Scalar<int32_t> p) {
  return {"prefix_lm", [p](Index, Index, Index q, Index kv) { return kv < p || q >= kv; }};
}

MaskMod document(Buffer<int32_t> doc) {
  return {"document", [doc](Index, Index, Index q, Index kv) { return doc[q] == doc[kv]; }};
}

MaskMod dilated_sliding_window(Scalar<int32_t> w, Scalar<int32_t> d) {
  return {"dilated_sliding_window",
          [w, d](Index, Index, Index q, Index kv) { return q >= kv && q - kv <= w && (q - kv) % d == 0; }};
}

MaskMod padding(Scalar<int32_t> n) {
  return {"padding", [n](Index, Index, Index q, Index kv) { return q >= n && kv >= n; }};
}

ScoreMod alibi(Scalar<int32_t> heads) {
  return {"alibi", [heads](Score s, Index, Index h, Index q, Index kv) {
            return s + exp2(Score(-8.0f) * (h + 1) / Score(Index(heads))) * (kv - q);
          }};
}

ScoreMod alibi(Buffer<float> slopes) {
  return {"alibi_slopes",
          [slopes](Score s, Index, Index h, Index q, Index kv) { return s + slopes[h] * (kv - q); }};
}

ScoreMod softcap(Scalar<float> cap) {
  return {"softcap", [cap](Score s, Index, Index, Index, Index) { return cap * tanh(s / cap); }};
}

ScoreMod relative_bias(Buffer<float> bias, Scalar<int32_t> offset) {
  return {"relative_bias",
          [bias, offset](Score s, Index, Index, Index q, Index kv) { return s + bias[q - kv + offset]; }};
}

// ---- presets ---------------------------------------------------------------------------
namespace {

struct Spec {
  std::string name;
  std::vector<std::string> args;
};

Spec split(std::string_view spec) {
  Spec s;
  size_t colon = spec.find(':');
  s.name = std::string(spec.substr(0, colon));
  while (colon != std::string_view::npos) {
    spec = spec.substr(colon + 1);
    colon = spec.find(':');
    s.args.emplace_back(spec.substr(0, colon));
  }
  return s;
}

template <typename T>
T parse_number(const std::string& text, std::string_view kind, std::string_view spec,
               std::string_view usage) {
  T v{};
  if constexpr (std::is_integral_v<T>) {
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc() && p == text.data() + text.size()) return v;
  } else {
    try {
      size_t used = 0;
      v = static_cast<T>(std::stod(text, &used));
      if (used == text.size()) return v;
    } catch (const std::exception&) {
    }
  }
  throw Error(fmt::format("{} preset '{}': '{}' is not {} (usage: {})", kind, spec, text,
                          std::is_integral_v<T> ? "an integer" : "a number", usage));
}

// A preset's count (window, prefix, padding): a negative one would make a mask that is silently
// empty (a window) or the same as none (a prefix, padding).
int32_t parse_count(const std::string& text, std::string_view kind, std::string_view spec, std::string_view usage,
                    std::string_view what) {
  const int32_t v = parse_number<int32_t>(text, kind, spec, usage);
  if (v < 0) throw Error(fmt::format("{} preset '{}': {} must be >= 0, got {}", kind, spec, what, v));
  return v;
}

void expect_args(const Spec& s, size_t n, std::string_view kind, std::string_view spec,
                 std::string_view usage) {
  if (s.args.size() != n)
    throw Error(fmt::format("{} preset '{}' takes {} argument{} (usage: {})", kind, spec, n,
                            n == 1 ? "" : "s", usage));
}

}  // namespace

std::string mask_preset_help() {
  return "causal, sliding:W, prefix_lm:P, document, noop, padding:N, dilated:W:D";
}
std::string score_preset_help() { return "alibi, softcap:C, relative_bias, identity"; }

Preset<MaskMod> mask_preset(std::string_view spec) {
  Spec s = split(spec);
  const char* kind = "mask";
  if (s.name == "causal") {
    expect_args(s, 0, kind, spec, "causal");
    return {causal(), {}};
  }
  if (s.name == "noop") {
    expect_args(s, 0, kind, spec, "noop");
    return {noop_mask(), {}};
  }
  if (s.name == "document") {
    expect_args(s, 0, kind, spec, "document");
    return {document(), {}};
  }
  if (s.name == "sliding") {
    expect_args(s, 1, kind, spec, "sliding:W");
    return {sliding_window(), {{"window", parse_count(s.args[0], kind, spec, "sliding:W", "the window")}}};
  }
  if (s.name == "prefix_lm") {
    expect_args(s, 1, kind, spec, "prefix_lm:P");
    return {prefix_lm(), {{"prefix", parse_count(s.args[0], kind, spec, "prefix_lm:P", "the prefix")}}};
  }
  if (s.name == "padding") {
    expect_args(s, 1, kind, spec, "padding:N");
    return {padding(), {{"n_pad", parse_count(s.args[0], kind, spec, "padding:N", "the padding")}}};
  }
  if (s.name == "dilated") {
    expect_args(s, 2, kind, spec, "dilated:W:D");
    int32_t d = parse_number<int32_t>(s.args[1], kind, spec, "dilated:W:D");
    if (d <= 0) throw Error(fmt::format("mask preset '{}': dilation must be positive", spec));
    return {dilated_sliding_window(),
            {{"window", parse_count(s.args[0], kind, spec, "dilated:W:D", "the window")}, {"dilation", d}}};
  }
  throw Error(fmt::format("unknown mask preset '{}'; expected one of: {}", spec, mask_preset_help()));
}

Preset<ScoreMod> score_preset(std::string_view spec) {
  Spec s = split(spec);
  const char* kind = "score";
  if (s.name == "alibi") {
    expect_args(s, 0, kind, spec, "alibi");
    return {alibi(), {}};
  }
  if (s.name == "identity" || s.name == "noop") {
    expect_args(s, 0, kind, spec, "identity");
    return {identity_score(), {}};
  }
  if (s.name == "relative_bias") {
    expect_args(s, 0, kind, spec, "relative_bias");
    return {relative_bias(), {}};
  }
  if (s.name == "softcap") {
    expect_args(s, 1, kind, spec, "softcap:C");
    float c = parse_number<float>(s.args[0], kind, spec, "softcap:C");
    if (!(c > 0)) throw Error(fmt::format("score preset '{}': the cap must be positive", spec));
    return {softcap(), {{"softcap", c}}};
  }
  throw Error(fmt::format("unknown score preset '{}'; expected one of: {}", spec, score_preset_help()));
}

}  // namespace fa::mods
