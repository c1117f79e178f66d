// The library mods (fajit/mods.h) against their documented formulas: each mod is traced with
// fa::trace, its fa.score_mod / fa.mask_mod compiled with fa::ModProgram, and evaluated on
// thousands of random (b, h, q, kv, score) points with random scalars and buffers; a mask must
// agree exactly with the formula, a score_mod to 1e-6 relative (computed in float the same
// way, so in practice bit for bit).
#include "fajit/mods.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fajit/detail/interp.h"
#include "fajit/detail/program_impl.h"
#include "fajit/frontend.h"

namespace {

constexpr int kRounds = 10;           // fresh scalars and buffers per round
constexpr int kPointsPerRound = 600;  // 6000 points per mod
constexpr int kSeqLen = 512;          // q, kv in [0, kSeqLen): buffer reads stay in range
constexpr int kBatch = 4;
constexpr int kHeads = 16;

fa::ModProgram score_program(const fa::ScoreMod& m) {
  fa::Program p = fa::trace(m, fa::noop_mask());
  return fa::ModProgram::compile(p.impl().score.getOperation());
}

fa::ModProgram mask_program(const fa::MaskMod& m) {
  fa::Program p = fa::trace(fa::identity_score(), m);
  return fa::ModProgram::compile(p.impl().mask.getOperation());
}

struct Point {
  int b, h, q, kv;
  float score;
};

// What a round binds: every scalar and buffer any mod below reads, by its default name.
struct World {
  int32_t window, prefix, n_pad, dilation, num_heads, rel_offset;
  float softcap;
  std::vector<int32_t> doc_ids;  // kSeqLen
  std::vector<float> slopes;     // kHeads
  std::vector<float> rel_bias;   // 2 * kSeqLen - 1
  fa::Bindings env;
};

class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  int i(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }  // inclusive
  float f(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g_); }
  bool coin() { return i(0, 1) == 1; }

  void fill(World& w) {
    w.window = i(0, 96);
    w.prefix = i(0, kSeqLen);
    w.n_pad = i(0, 64);
    w.dilation = i(1, 8);
    w.num_heads = i(1, kHeads);
    w.rel_offset = kSeqLen - 1;
    w.softcap = f(0.5f, 60.0f);
    w.doc_ids.assign(kSeqLen, 0);
    // Packed documents: sorted ids with a few boundaries, and sometimes an arbitrary layout.
    int doc = 0;
    bool sorted = i(0, 3) != 0;
    for (int k = 0; k < kSeqLen; ++k) {
      if (sorted) {
        if (i(0, 40) == 0) ++doc;
        w.doc_ids[k] = doc;
      } else {
        w.doc_ids[k] = i(0, 5);
      }
    }
    w.slopes.resize(kHeads);
    for (float& s : w.slopes) s = f(-1.0f, 1.0f);
    w.rel_bias.resize(2 * kSeqLen - 1);
    for (float& s : w.rel_bias) s = f(-8.0f, 8.0f);
    w.env = fa::Bindings();
    w.env.scalar_i32("window", w.window)
        .scalar_i32("prefix", w.prefix)
        .scalar_i32("n_pad", w.n_pad)
        .scalar_i32("dilation", w.dilation)
        .scalar_i32("num_heads", w.num_heads)
        .scalar_i32("rel_offset", w.rel_offset)
        .scalar_f32("softcap", w.softcap)
        .buffer("doc_ids", fa::HostBuffer::i32(w.doc_ids.data(), {kSeqLen}))
        .buffer("slopes", fa::HostBuffer::f32(w.slopes.data(), {kHeads}))
        .buffer("rel_bias", fa::HostBuffer::f32(w.rel_bias.data(), {2 * kSeqLen - 1}));
  }

  Point point(const World& w) {
    Point p;
    p.b = i(0, kBatch - 1);
    p.h = i(0, w.num_heads - 1);  // alibi's slope needs h < num_heads; others do not care
    p.q = i(0, kSeqLen - 1);
    // Half of the keys near the query, where windows and diagonals decide.
    p.kv = coin() ? std::clamp(p.q + i(-2 * w.window - 8, 8), 0, kSeqLen - 1) : i(0, kSeqLen - 1);
    p.score = coin() ? f(-30.0f, 30.0f) : f(-1.0f, 1.0f);
    return p;
  }

 private:
  std::mt19937 g_;
};

using MaskRef = std::function<bool(const World&, const Point&)>;
using ScoreRef = std::function<float(const World&, const Point&)>;

// Runs `ref` against the compiled mask on kRounds x kPointsPerRound points; both outcomes must
// occur (else the points did not exercise the mask).
void check_mask(const fa::MaskMod& mod, const MaskRef& ref, uint32_t seed, bool expect_both = true) {
  fa::ModProgram prog = mask_program(mod);
  ASSERT_EQ(prog.kind(), fa::ModKind::kMask);
  Rng rng(seed);
  World w;
  int trues = 0, total = 0, mismatches = 0;
  for (int r = 0; r < kRounds; ++r) {
    rng.fill(w);
    fa::BoundMod bound = prog.bind(w.env);
    for (int k = 0; k < kPointsPerRound; ++k) {
      Point p = rng.point(w);
      bool got = bound.mask(p.b, p.h, p.q, p.kv);
      bool want = ref(w, p);
      ++total;
      trues += want;
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << mod.name << " at b=" << p.b << " h=" << p.h << " q=" << p.q << " kv=" << p.kv
                      << " window=" << w.window << " prefix=" << w.prefix << " n_pad=" << w.n_pad
                      << " dilation=" << w.dilation << ": interpreter " << got << ", formula " << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << mod.name;
  EXPECT_GE(total, 5000);
  if (expect_both) {
    EXPECT_GT(trues, total / 50) << mod.name << ": the points hardly ever keep a key";
    EXPECT_LT(trues, total - total / 50) << mod.name << ": the points hardly ever mask a key";
  }
}

bool close(float got, float want, float scale) {
  if (got == want) return true;
  if (std::isnan(got) || std::isnan(want)) return false;
  return std::fabs(got - want) <= 1e-6f * std::max({std::fabs(want), scale, 1e-30f});
}

// `scale` is the magnitude of the terms `ref` adds (so cancellation is not mistaken for error).
void check_score(const fa::ScoreMod& mod, const ScoreRef& ref,
                 const std::function<float(const World&, const Point&)>& scale, uint32_t seed) {
  fa::ModProgram prog = score_program(mod);
  ASSERT_EQ(prog.kind(), fa::ModKind::kScore);
  Rng rng(seed);
  World w;
  int total = 0, mismatches = 0, bit_exact = 0;
  for (int r = 0; r < kRounds; ++r) {
    rng.fill(w);
    fa::BoundMod bound = prog.bind(w.env);
    for (int k = 0; k < kPointsPerRound; ++k) {
      Point p = rng.point(w);
      float got = bound.score(p.score, p.b, p.h, p.q, p.kv);
      float want = ref(w, p);
      ++total;
      bit_exact += std::memcmp(&got, &want, sizeof got) == 0;
      if (!close(got, want, scale(w, p)) && ++mismatches <= 5)
        ADD_FAILURE() << mod.name << " at score=" << p.score << " b=" << p.b << " h=" << p.h << " q=" << p.q
                      << " kv=" << p.kv << ": interpreter " << got << ", formula " << want;
    }
  }
  EXPECT_EQ(mismatches, 0) << mod.name;
  EXPECT_GE(total, 5000);
  // The reference does the same float operations in the same order: nearly all are exact.
  EXPECT_GE(bit_exact, total * 99 / 100) << mod.name;
}

float no_scale(const World&, const Point& p) { return std::fabs(p.score); }

// ---- masks ----------------------------------------------------------------------------------

bool causal_ref(const World&, const Point& p) { return p.q >= p.kv; }
bool sliding_ref(const World& w, const Point& p) { return p.q >= p.kv && p.q - p.kv <= w.window; }
bool prefix_ref(const World& w, const Point& p) { return p.kv < w.prefix || p.q >= p.kv; }
bool document_ref(const World& w, const Point& p) { return w.doc_ids[p.q] == w.doc_ids[p.kv]; }
bool dilated_ref(const World& w, const Point& p) {
  return p.q >= p.kv && p.q - p.kv <= w.window && (p.q - p.kv) % w.dilation == 0;
}
bool padding_ref(const World& w, const Point& p) { return p.q >= w.n_pad && p.kv >= w.n_pad; }

TEST(Mods, Causal) { check_mask(fa::mods::causal(), causal_ref, 1); }
TEST(Mods, SlidingWindow) { check_mask(fa::mods::sliding_window(), sliding_ref, 2); }
TEST(Mods, PrefixLm) { check_mask(fa::mods::prefix_lm(), prefix_ref, 3); }
TEST(Mods, Document) { check_mask(fa::mods::document(), document_ref, 4); }
TEST(Mods, DilatedSlidingWindow) { check_mask(fa::mods::dilated_sliding_window(), dilated_ref, 5); }
TEST(Mods, Padding) { check_mask(fa::mods::padding(), padding_ref, 6); }
TEST(Mods, Noop) {
  check_mask(
      fa::noop_mask(), [](const World&, const Point&) { return true; }, 7, /*expect_both=*/false);
}

// The default names can be replaced: the formula reads whatever the caller named.
TEST(Mods, RenamedScalarsAndBuffers) {
  check_mask(
      fa::mods::sliding_window(fa::scalar<int32_t>("prefix")),
      [](const World& w, const Point& p) { return p.q >= p.kv && p.q - p.kv <= w.prefix; }, 8);
  check_mask(
      fa::mods::padding(fa::scalar<int32_t>("window")),
      [](const World& w, const Point& p) { return p.q >= w.window && p.kv >= w.window; }, 9);
}

TEST(Mods, AndMasks) {
  check_mask(fa::and_masks({fa::mods::causal(), fa::mods::sliding_window()}), sliding_ref, 10);
  check_mask(
      fa::and_masks({fa::mods::document(), fa::mods::causal()}),
      [](const World& w, const Point& p) { return document_ref(w, p) && causal_ref(w, p); }, 11);
  check_mask(
      fa::and_masks({fa::mods::padding(), fa::mods::document(), fa::mods::prefix_lm()}),
      [](const World& w, const Point& p) {
        return padding_ref(w, p) && document_ref(w, p) && prefix_ref(w, p);
      },
      12);
  // Two mods reading the same scalar share it.
  check_mask(fa::and_masks({fa::mods::sliding_window(), fa::mods::dilated_sliding_window()}), dilated_ref,
             13);
  check_mask(
      fa::and_masks({}), [](const World&, const Point&) { return true; }, 14, false);
  check_mask(fa::and_masks({fa::mods::causal()}), causal_ref, 15);
}

TEST(Mods, OrMasks) {
  check_mask(
      fa::or_masks({fa::mods::document(), fa::mods::sliding_window()}),
      [](const World& w, const Point& p) { return document_ref(w, p) || sliding_ref(w, p); }, 16);
  check_mask(
      fa::or_masks({fa::mods::causal(), fa::mods::padding()}),
      [](const World& w, const Point& p) { return causal_ref(w, p) || padding_ref(w, p); }, 17);
  check_mask(
      fa::or_masks({}), [](const World&, const Point&) { return false; }, 18, false);
  // Nested: (document && causal) || prefix.
  check_mask(
      fa::or_masks({fa::and_masks({fa::mods::document(), fa::mods::causal()}), fa::mods::prefix_lm()}),
      [](const World& w, const Point& p) {
        return (document_ref(w, p) && causal_ref(w, p)) || prefix_ref(w, p);
      },
      19);
}

// ---- score mods -----------------------------------------------------------------------------

// score + slope(h) * (kv - q), slope(h) = 2^(-8 (h + 1) / num_heads), all in float.
float alibi_ref(const World& w, const Point& p) {
  float e = (-8.0f * static_cast<float>(p.h + 1)) / static_cast<float>(w.num_heads);
  float slope = std::exp2f(e);
  return p.score + slope * static_cast<float>(p.kv - p.q);
}
float alibi_scale(const World& w, const Point& p) {
  return std::max(std::fabs(p.score), std::fabs(alibi_ref(w, p) - p.score));
}

float alibi_slopes_ref(const World& w, const Point& p) {
  return p.score + w.slopes[p.h] * static_cast<float>(p.kv - p.q);
}
float alibi_slopes_scale(const World& w, const Point& p) {
  return std::max(std::fabs(p.score), std::fabs(w.slopes[p.h] * static_cast<float>(p.kv - p.q)));
}

float softcap_ref(const World& w, const Point& p) { return w.softcap * std::tanh(p.score / w.softcap); }

float relative_bias_ref(const World& w, const Point& p) {
  return p.score + w.rel_bias[p.q - p.kv + w.rel_offset];
}
float relative_bias_scale(const World& w, const Point& p) {
  return std::max(std::fabs(p.score), std::fabs(w.rel_bias[p.q - p.kv + w.rel_offset]));
}

TEST(Mods, Identity) {
  check_score(
      fa::identity_score(), [](const World&, const Point& p) { return p.score; }, no_scale, 20);
}
TEST(Mods, AlibiScalar) { check_score(fa::mods::alibi(), alibi_ref, alibi_scale, 21); }
TEST(Mods, AlibiSlopesBuffer) {
  check_score(fa::mods::alibi(fa::buffer<float>("slopes", 1)), alibi_slopes_ref, alibi_slopes_scale, 22);
}
TEST(Mods, Softcap) {
  // tanhf(float) as the interpreter calls it: the reference is the same float computation.
  check_score(fa::mods::softcap(), softcap_ref, no_scale, 23);
}
TEST(Mods, RelativeBias) {
  check_score(fa::mods::relative_bias(), relative_bias_ref, relative_bias_scale, 24);
}

// The mods' captures are what the comments in mods.h promise.
TEST(Mods, CapturesAreTheDocumentedNames) {
  auto names = [](const fa::Program& p) {
    std::string s;
    for (const auto& c : p.captures()) s += (s.empty() ? "" : ",") + c.name;
    return s;
  };
  EXPECT_EQ(names(fa::trace(fa::mods::alibi(), fa::mods::sliding_window())), "num_heads,window");
  EXPECT_EQ(names(fa::trace(fa::mods::relative_bias(), fa::mods::document())), "rel_bias,doc_ids,rel_offset");
  EXPECT_EQ(names(fa::trace(fa::mods::softcap(), fa::mods::dilated_sliding_window())),
            "dilation,softcap,window");
  EXPECT_EQ(names(fa::trace(fa::identity_score(), fa::mods::prefix_lm())), "prefix");
  EXPECT_EQ(names(fa::trace(fa::identity_score(), fa::mods::padding())), "n_pad");
}

// The presets build the same mods, with their arguments as the scalars' values.
TEST(Mods, PresetsEvaluateLikeTheirMods) {
  auto sliding = fa::mods::mask_preset("sliding:7");
  EXPECT_EQ(sliding.scalar_values.at("window"), 7);
  fa::Bindings env;
  env.scalar_i32("window", 7);
  fa::ModProgram prog = mask_program(sliding.mod);
  for (int q = 0; q < 40; ++q)
    for (int kv = 0; kv < 40; ++kv)
      ASSERT_EQ(prog.eval_mask(0, 0, q, kv, env), q >= kv && q - kv <= 7) << q << " " << kv;

  auto dilated = fa::mods::mask_preset("dilated:16:4");
  EXPECT_EQ(dilated.scalar_values.at("window"), 16);
  EXPECT_EQ(dilated.scalar_values.at("dilation"), 4);

  auto cap = fa::mods::score_preset("softcap:20");
  EXPECT_EQ(cap.scalar_values.at("softcap"), 20.0);
  fa::Bindings senv;
  senv.scalar_f32("softcap", 20.0f);
  fa::ModProgram sprog = score_program(cap.mod);
  for (float s : {-100.0f, -3.5f, 0.0f, 0.25f, 19.0f, 1e4f})
    EXPECT_EQ(sprog.eval_score(s, 0, 0, 0, 0, senv), 20.0f * std::tanh(s / 20.0f)) << s;
}

}  // namespace
