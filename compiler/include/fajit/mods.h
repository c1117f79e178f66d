// The standard mods, each a one-liner over the tracing frontend (fajit/frontend.h).
//
//   auto k = fa::compile(fa::mods::alibi(), fa::and_masks({fa::mods::causal(),
//                                                          fa::mods::sliding_window()}));
//
// Runtime scalars and buffers carry default names (shown below) that are bound at launch.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "fajit/frontend.h"

namespace fa::mods {

// ---- masks -----------------------------------------------------------------------------
// q >= kv
FA_API MaskMod causal();
// q >= kv && q - kv <= window   (window + 1 keys per query, itself included)
FA_API MaskMod sliding_window(Scalar<int32_t> window = scalar<int32_t>("window"));
// kv < prefix || q >= kv        (bidirectional prefix, causal after it)
FA_API MaskMod prefix_lm(Scalar<int32_t> prefix = scalar<int32_t>("prefix"));
// doc_ids[q] == doc_ids[kv]     (packed documents; and it with causal for causal packing)
FA_API MaskMod document(Buffer<int32_t> doc_ids = buffer<int32_t>("doc_ids", 1));
// q >= kv && q - kv <= window && (q - kv) % dilation == 0
FA_API MaskMod dilated_sliding_window(Scalar<int32_t> window = scalar<int32_t>("window"),
                                      Scalar<int32_t> dilation = scalar<int32_t>("dilation"));
// q >= n_pad && kv >= n_pad     (left padding as in seed 002: padded rows are fully masked)
FA_API MaskMod padding(Scalar<int32_t> n_pad = scalar<int32_t>("n_pad"));

// ---- score mods ------------------------------------------------------------------------
// score + slope(h) * (kv - q), slope(h) = 2^(-8 (h + 1) / num_heads)
FA_API ScoreMod alibi(Scalar<int32_t> num_heads = scalar<int32_t>("num_heads"));
// score + slopes[h] * (kv - q)
FA_API ScoreMod alibi(Buffer<float> slopes);
// cap * tanh(score / cap)
FA_API ScoreMod softcap(Scalar<float> cap = scalar<float>("softcap"));
// score + bias[q - kv + offset]  (offset is typically Lkv - 1, so the index is >= 0)
FA_API ScoreMod relative_bias(Buffer<float> bias = buffer<float>("rel_bias", 1),
                              Scalar<int32_t> offset = scalar<int32_t>("rel_offset"));

// ---- CLI presets -----------------------------------------------------------------------
// A preset is a library mod plus the values its scalars take when the CLI runs it.
template <typename Mod>
struct Preset {
  Mod mod;
  std::map<std::string, double> scalar_values;  // from NAME:ARG; the rest defaults at run time
};
// Mask presets: causal, sliding:W, prefix_lm:P, document, noop, padding:N, dilated:W:D.
FA_API Preset<MaskMod> mask_preset(std::string_view spec);
// Score presets: alibi, softcap:C, relative_bias, identity.
FA_API Preset<ScoreMod> score_preset(std::string_view spec);
// One line each, for --help.
FA_API std::string mask_preset_help();
FA_API std::string score_preset_help();

}  // namespace fa::mods
