// The fuzzer's forward verdict (compare.h) without a GPU: "kernel" outputs are made from the
// float64 reference itself — exact, wrong in one row, from a reference whose dots moved by half
// the f32 accumulation bound (what a correct kernel may do with an ill-conditioned mod), or an
// LSE rounded to f32 at 3e9 — and each must get the verdict the README describes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compare.h"
#include "fajit/detail/interp.h"
#include "fajit/detail/reference.h"
#include "fajit/frontend.h"

namespace {

using fa_fuzz::RowContext;
using fa_fuzz::RowId;

// A small case (B 1, Hq 2, Hkv 1, Lq 8, Lkv 40, D 16) with the given score_mod and a causal
// mask offset so every row sees keys; the inputs are bf16-rounded random values.
struct Problem {
  fa_fuzz::Case c;
  fa::Program program;
  fa::Bindings env;
  fa::ModProgram sp, mp;
  fa::BoundMod score, mask;
  fa::RoundedTensor q, k, v;
  std::vector<RowId> rows;
  fa::ReferenceOptions ro;
  fa::ReferenceShape rs;

  explicit Problem(const fa::ScoreMod& score_mod)
      : Problem(fa_fuzz::Case{},
                fa::trace(score_mod, fa::MaskMod{"m", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                                                   return kv <= q + 30;
                                                 }})) {}
  // A generated case's mods (with their graph, which mod_rounding evaluates) on the same shape.
  explicit Problem(const fa_fuzz::Case& generated) : Problem(generated, std::nullopt) {}
  // (Not copied or moved: score and mask are bound to env.)
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;
  // The case on this problem's shape, its program traced (score_mod) or its own (generated).
  Problem(fa_fuzz::Case gen, std::optional<fa::Program> traced)
      : c(on_shape(std::move(gen))),
        program(traced ? std::move(*traced) : fa_fuzz::program_of(c)),
        env(traced ? fa::Bindings{} : fa_fuzz::bindings_of(c)),
        sp(fa::ModProgram::score_of(program)),
        mp(fa::ModProgram::mask_of(program)),
        score(sp.bind(env)),
        mask(mp.bind(env)),
        rs{1, 2, 1, 8, 40, 16, 16} {
    std::mt19937_64 rng(7);
    q = fa::random_rounded(size_t(2) * 8 * 16, fa::DType::bf16, rng);
    k = fa::random_rounded(size_t(40) * 16, fa::DType::bf16, rng);
    v = fa::random_rounded(size_t(40) * 16, fa::DType::bf16, rng);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) rows.push_back({0, h, i, 40});
    ro.score_mod = &sp, ro.mask_mod = &mp, ro.bindings = &env;
  }
  static fa_fuzz::Case on_shape(fa_fuzz::Case g) {
    g.shape = {1, 2, 1, 8, 40, 16, 16, fa::DType::bf16};
    return g;
  }
  fa::ReferenceResult reference(double dot_shift = 0) {
    fa::ReferenceOptions o = ro;
    o.dot_shift = dot_shift;
    return fa::reference_attention(rs, q.values.data(), k.values.data(), v.values.data(), o);
  }
  std::string verdict(const std::vector<double>& got, const std::vector<double>& got_lse,
                      const fa::ReferenceResult& ref, fa_fuzz::Stats* st) {
    const RowContext x{c, score, mask, q, k, v};
    std::mt19937_64 rng(1);
    return fa_fuzz::compare_forward(x, rows, got, ref.out, got_lse, ref.lse, 1e-2, rng, st);
  }
  std::string max_verdict(const std::vector<double>& got_max, const fa::ReferenceResult& ref,
                          fa_fuzz::Stats* st) {
    const RowContext x{c, score, mask, q, k, v};
    return fa_fuzz::compare_max_scores(x, rows, got_max, ref.max_score, std::mt19937_64(1), st);
  }
};

TEST(FuzzCompare, TheReferenceItselfPasses) {
  Problem s(fa::identity_score());
  const fa::ReferenceResult ref = s.reference();
  fa_fuzz::Stats st;
  EXPECT_EQ(s.verdict(ref.out, ref.lse, ref, &st), "");
  EXPECT_EQ(st.ill_rows, 0);
}

TEST(FuzzCompare, AWrongRowFailsAndIsDescribed) {
  Problem s(fa::identity_score());
  const fa::ReferenceResult ref = s.reference();
  std::vector<double> got = ref.out;
  for (int d = 0; d < 16; ++d) got[size_t(11) * 16 + d] *= 1.5;  // row 11: h 1, q 3
  fa_fuzz::Stats st;
  const std::string e = s.verdict(got, ref.lse, ref, &st);
  EXPECT_NE(e.find("0 of 1 rows over the bound inside the reference's f32 envelope"), std::string::npos) << e;
  EXPECT_NE(e.find("row b 0 h 1 q 3: 40 keys, 6 masked, 0 NaN, 0 +inf, 0 -inf scores"), std::string::npos)
      << e;
  EXPECT_EQ(st.ill_rows, 0);

  // A ragged sequence's row is described over its own keys.
  const RowContext x{s.c, s.score, s.mask, s.q, s.k, s.v};
  EXPECT_EQ(fa_fuzz::describe_row(x, {0, 1, 3, 20}).rfind("row b 0 h 1 q 3: 20 keys, 0 masked, 0 NaN", 0),
            0u);

  std::vector<double> nan_row = ref.out;
  nan_row[size_t(5) * 16] = NAN;  // a NaN where the reference is finite
  EXPECT_NE(s.verdict(nan_row, ref.lse, ref, &st).find("1 rows with a non-finite mismatch"),
            std::string::npos);
}

// score·1e5 turns the f32 rounding of q·k into LSE differences past the LSE bound: a "kernel"
// whose dots moved by half the accumulation bound fails the plain bound, yet lies inside the
// envelope of the reference moved by the whole bound — accepted and counted.
TEST(FuzzCompare, AnIllConditionedModStaysInsideTheEnvelope) {
  Problem s(fa::ScoreMod{"amplify",
                         [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return x * 1e5f; }});
  const fa::ReferenceResult ref = s.reference(), kernel = s.reference(0.5 * 16 * 0x1p-24);
  double over = 0;  // how far the plain LSE bound is missed
  for (size_t i = 0; i < ref.lse.size(); ++i)
    over = std::max(over, std::fabs(kernel.lse[i] - ref.lse[i]) - fa_fuzz::lse_bound(ref.lse[i]));
  ASSERT_GT(over, 0);
  fa_fuzz::Stats st;
  EXPECT_EQ(s.verdict(kernel.out, kernel.lse, ref, &st), "");
  EXPECT_GT(st.ill_rows, 0);
  EXPECT_EQ(st.ill_cases, 1);
  // Well-conditioned, the same move stays far inside the plain bounds.
  Problem w(fa::identity_score());
  const fa::ReferenceResult wref = w.reference(), wk = w.reference(0.5 * 16 * 0x1p-24);
  EXPECT_LT(fa_fuzz::compare(wk.out, wref.out).rel, 1e-5);
  fa_fuzz::Stats wst;
  EXPECT_EQ(w.verdict(wk.out, wk.lse, wref, &wst), "");
  EXPECT_EQ(wst.ill_rows, 0);
}

// An LSE of 3e9 + log(n) rounded to f32 (ulp 256) is within the bound; one ulp more is not
// (at 3e9, 2^-21 of it is ~1430: a few ulps).
TEST(FuzzCompare, TheLseBoundCountsF32Ulps) {
  Problem s(fa::ScoreMod{"offset",
                         [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return x + 3e9f; }});
  const fa::ReferenceResult ref = s.reference();
  std::vector<double> f32_lse(ref.lse.size()), far = ref.lse;
  for (size_t i = 0; i < ref.lse.size(); ++i) f32_lse[i] = static_cast<float>(ref.lse[i]);
  fa_fuzz::Stats st;
  EXPECT_EQ(s.verdict(ref.out, f32_lse, ref, &st), "");
  far[2] += 4096;
  EXPECT_NE(s.verdict(ref.out, far, ref, &st), "");
  EXPECT_DOUBLE_EQ(fa_fuzz::lse_bound(0), 2e-2);
}

TEST(FuzzCompare, UnstableRowsAreTheChaoticOnes) {
  Problem calm(fa::identity_score());
  Problem chaos(fa::ScoreMod{"chaos", [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) {
                               return fa::sin(x * 1e5f);  // the dots' f32 rounding moves it by ~0.1
                             }});
  const RowContext c{calm.c, calm.score, calm.mask, calm.q, calm.k, calm.v};
  const RowContext u{chaos.c, chaos.score, chaos.mask, chaos.q, chaos.k, chaos.v};
  EXPECT_FALSE(fa_fuzz::unstable_row(c, {0, 0, 5, 40}));
  EXPECT_TRUE(fa_fuzz::unstable_row(u, {0, 0, 5, 40}));
  // Steep: 1e6·score moves by far more than 0.5 under the f32 moves though only by 1e-6 of
  // itself. Two keys near the top (key 1 a copy of key 0 with one element nudged, both along
  // query 5): their P ratio moves by e^±k, unstable; 10·score is not. A lone top key far
  // ahead of the rest is not either: the output is its V row whatever its score.
  for (float slope : {1e6f, 10.f}) {
    Problem p(fa::ScoreMod{
        "steep", [slope](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return x * slope; }});
    const RowContext x{p.c, p.score, p.mask, p.q, p.k, p.v};
    EXPECT_FALSE(fa_fuzz::unstable_row(x, {0, 0, 5, 40})) << slope;  // random keys: 1e5 and more apart
    const float* q5 = &p.q.values[size_t(5) * 16];
    for (int d = 0; d < 16; ++d) p.k.values[d] = p.k.values[16 + d] = q5[d];
    p.k.values[16] = q5[0] == 0.f ? 0x1p-8f : q5[0] * (1 + 0x1p-7f);
    EXPECT_EQ(fa_fuzz::unstable_row(x, {0, 0, 5, 40}), slope > 100) << slope;
  }
}

// An LSE whose only fault is what a device's transcendentals may do to the top scores passes:
// pow(q, exp2(c)) (seed 5317 case 5's mods on this shape), an LSE past its bound by one
// mod_rounding; not by 10 of them, nor with an output row also off. An exact mod (the
// identity) gets no slack (mod_rounding 0).
TEST(FuzzCompare, AnLseTheDevicesTranscendentalsMoveIsWithinItsSlack) {
  Problem p(fa_fuzz::generate_case(5317, 5, true, true, true));
  const fa::ReferenceResult ref = p.reference();
  const RowContext x{p.c, p.score, p.mask, p.q, p.k, p.v};
  const double slack = fa_fuzz::mod_rounding(x, p.rows[5]);
  ASSERT_GT(slack, 1e-3);  // the pow's exponent through exp2: a few ulps of the row's ~1e3 scores
  fa_fuzz::Stats st;
  std::vector<double> lse = ref.lse;
  lse[5] += fa_fuzz::lse_bound(ref.lse[5]) + slack;
  EXPECT_EQ(p.verdict(ref.out, lse, ref, &st), "");
  EXPECT_EQ(st.lse_mod_rows, 1);
  lse[5] = ref.lse[5] + fa_fuzz::lse_bound(ref.lse[5]) + 10 * slack;
  EXPECT_NE(p.verdict(ref.out, lse, ref, &st), "");
  lse[5] = ref.lse[5] + fa_fuzz::lse_bound(ref.lse[5]) + slack;
  std::vector<double> out = ref.out;
  for (size_t d = 0; d < 16; ++d) out[5 * 16 + d] *= 1.5;
  EXPECT_NE(p.verdict(out, lse, ref, &st), "");

  int identity = 0;
  while (fa_fuzz::generate_case(5317, identity).score->op != fa_fuzz::Op::kScoreArg) ++identity;
  Problem id(fa_fuzz::generate_case(5317, identity));
  const RowContext xi{id.c, id.score, id.mask, id.q, id.k, id.v};
  EXPECT_EQ(fa_fuzz::mod_rounding(xi, id.rows[5]), 0.0);
}

// The backward's unverifiable pairs: |s| has a kink at 0 (its derivative jumps from -1 to 1),
// so a key whose q·k is exactly 0 — k_0 = (q_1, -q_0, 0, ...) against query 0 of head 0 — has
// no derivative f32 can pin: dQ row (0, 0, 0) and K/V row 0 are left out, nothing else; a
// smooth mod and the identity have none.
TEST(FuzzCompare, UnstableGradientsAreThePolesAndKinksThatMatter) {
  auto cross_zero = [](Problem& p) {
    for (int d = 0; d < 16; ++d) p.k.values[d] = 0.f;
    p.k.values[0] = p.q.values[1], p.k.values[1] = -p.q.values[0];
  };
  Problem kink(fa::ScoreMod{
      "kink", [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return fa::abs(x); }});
  Problem smooth(fa::ScoreMod{
      "smooth", [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return x * x * 0.5f + x; }});
  for (Problem* p : {&kink, &smooth}) {
    cross_zero(*p);
    const fa::ModProgram grad = fa::ModProgram::grad_of(p->program);
    const RowContext x{p->c, p->score, p->mask, p->q, p->k, p->v};
    const fa_fuzz::UnstableGradients u =
        fa_fuzz::unstable_gradients(x, grad.bind(p->env), p->reference().lse);
    ASSERT_EQ(u.dq_rows.size(), 16u);
    ASSERT_EQ(u.kv_rows.size(), 40u);
    if (p == &smooth) {
      EXPECT_EQ(u.pairs, 0u);
      continue;
    }
    EXPECT_EQ(u.pairs, 1u);
    for (size_t r = 0; r < 16; ++r) EXPECT_EQ(u.dq_rows[r], r == 0) << r;
    for (size_t j = 0; j < 40; ++j) EXPECT_EQ(u.kv_rows[j], j == 0) << j;
  }
}

// h / s · s is 1 everywhere but at s = 0, where f32 gives NaN: a q·k of 1e-9 whose f32 sum may
// cancel to exactly 0 (its bound spans 0) has no answer at f32, though the bound's ends are
// both finite: row 0 is unstable, forward and backward, and the others are not.
TEST(FuzzCompare, AScoreTheBoundLetsBeExactlyZeroIsProbedThere) {
  Problem p(fa::ScoreMod{
      "removable", [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return (1.0f / x) * x; }});
  for (int d = 0; d < 16; ++d) p.k.values[d] = 0.f;
  p.k.values[0] = p.q.values[1], p.k.values[1] = -p.q.values[0], p.k.values[2] = 0x1p-30f;
  ASSERT_NE(p.q.values[2], 0.f);
  const RowContext x{p.c, p.score, p.mask, p.q, p.k, p.v};
  for (size_t r = 0; r < p.rows.size(); ++r) EXPECT_EQ(fa_fuzz::unstable_row(x, p.rows[r]), r == 0) << r;
  const fa::ModProgram grad = fa::ModProgram::grad_of(p.program);
  const fa_fuzz::UnstableGradients u = fa_fuzz::unstable_gradients(x, grad.bind(p.env), p.reference().lse);
  EXPECT_EQ(u.pairs, 1u);
  for (size_t r = 0; r < 16; ++r) EXPECT_EQ(u.dq_rows[r], r == 0) << r;
}

// A steep mod: 1e6·score moves by far more than 0.5 under the f32 moves though only by 1e-6
// of itself, so every row's P has no answer at f32 (a forward and a backward of opposite
// rounding give P = e^±k where the reference has 1): every row, and the keys that matter in
// it, are left out. 10·score moves by ~1e-5: nothing is.
TEST(FuzzCompare, UnstableGradientsIncludeScoresASteepModMovesInAbsoluteTerms) {
  for (float slope : {1e6f, 10.f}) {
    Problem p(fa::ScoreMod{
        "steep", [slope](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return x * slope; }});
    const fa::ModProgram grad = fa::ModProgram::grad_of(p.program);
    const RowContext x{p.c, p.score, p.mask, p.q, p.k, p.v};
    const fa_fuzz::UnstableGradients u = fa_fuzz::unstable_gradients(x, grad.bind(p.env), p.reference().lse);
    if (slope < 100) {
      EXPECT_EQ(u.pairs, 0u);
      continue;
    }
    EXPECT_GE(u.pairs, 16u);
    for (size_t r = 0; r < 16; ++r) EXPECT_EQ(u.dq_rows[r], 1) << r;
  }
}

// max_scores against the reference: f32-rounded maxima pass, a lagging or NaN one fails naming
// the row, and a chaotic mod's moved maxima are left out as ill-conditioned.
TEST(FuzzCompare, MaxScoresAreCompared) {
  Problem s(fa::identity_score());
  const fa::ReferenceResult ref = s.reference();
  std::vector<double> got_max(ref.max_score.size());
  for (size_t i = 0; i < got_max.size(); ++i) got_max[i] = static_cast<float>(ref.max_score[i]);
  fa_fuzz::Stats st;
  EXPECT_EQ(s.max_verdict(got_max, ref, &st), "");
  std::vector<double> off = got_max;
  off[6] -= 0.01;  // m lagging the row max, as a kernel that wrote SoftmaxRows::m would
  const std::string e = s.max_verdict(off, ref, &st);
  EXPECT_EQ(e.rfind("1 rows' max_scores over the bound", 0), 0u) << e;
  EXPECT_NE(e.find("row b 0 h 0 q 6: 40 keys"), std::string::npos) << e;
  std::vector<double> nan_max = got_max;
  nan_max[3] = NAN;
  EXPECT_NE(s.max_verdict(nan_max, ref, &st), "");
  EXPECT_EQ(st.ill_rows, 0);

  // sin(score·1e5): the f32 rounding of q·k moves each max by ~0.1, past the bound; such rows
  // are the reference's own uncertainty, left out and counted.
  Problem a(fa::ScoreMod{
      "chaotic", [](fa::Score x, fa::Index, fa::Index, fa::Index, fa::Index) { return fa::sin(x * 1e5f); }});
  const fa::ReferenceResult aref = a.reference(), kernel = a.reference(0.5 * 16 * 0x1p-24);
  double over = 0;  // how far the plain max bound is missed
  for (size_t i = 0; i < aref.max_score.size(); ++i)
    over = std::max(
        over, std::fabs(kernel.max_score[i] - aref.max_score[i]) - fa_fuzz::max_bound(aref.max_score[i]));
  ASSERT_GT(over, 0);
  fa_fuzz::Stats ast;
  EXPECT_EQ(a.max_verdict(kernel.max_score, aref, &ast), "");
  EXPECT_GT(ast.ill_rows, 0);
}

}  // namespace
