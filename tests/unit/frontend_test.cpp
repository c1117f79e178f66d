// The tracing frontend: what IR symbolic C++ records, and the errors misuse gets.
#include "fajit/frontend.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include "fajit/mods.h"

namespace {

using fa::Bool;
using fa::Index;
using fa::Score;

using fa::test::error_of;

fa::ScoreMod score_of(fa::ScoreModFn fn) { return {"s", std::move(fn)}; }
fa::MaskMod mask_of(fa::MaskModFn fn) { return {"m", std::move(fn)}; }

TEST(Frontend, CausalTracesToOneCompare) {
  std::string ir = fa::trace(fa::identity_score(), fa::mods::causal()).to_mlir();
  EXPECT_NE(ir.find("fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1"), std::string::npos)
      << ir;
  EXPECT_NE(ir.find("arith.cmpi sge, %q, %kv : i32"), std::string::npos) << ir;
  EXPECT_NE(ir.find("fa.yield %score : f32"), std::string::npos) << ir;
}

TEST(Frontend, BufferBecomesCaptureAndLoad) {
  auto slopes = fa::buffer<float>("slopes", 1);
  fa::Program p = fa::trace(fa::mods::alibi(slopes), fa::noop_mask());
  std::string ir = p.to_mlir();
  EXPECT_NE(ir.find("captures(%slopes: !fa.buffer<f32, 1>) -> f32"), std::string::npos) << ir;
  EXPECT_NE(ir.find("fa.load %slopes[%h] : !fa.buffer<f32, 1>"), std::string::npos) << ir;
  ASSERT_EQ(p.captures().size(), 1u);
  EXPECT_EQ(p.captures()[0].name, "slopes");
  EXPECT_TRUE(p.captures()[0].is_buffer);
  EXPECT_TRUE(p.captures()[0].is_float);
  EXPECT_TRUE(p.captures()[0].used_by_score);
  EXPECT_FALSE(p.captures()[0].used_by_mask);
}

TEST(Frontend, ScalarsAreRuntimeValuesNotConstants) {
  fa::Program p = fa::trace(fa::identity_score(), fa::mods::sliding_window());
  std::string ir = p.to_mlir();
  EXPECT_NE(ir.find("fa.scalar \"window\" : i32"), std::string::npos) << ir;
  ASSERT_EQ(p.captures().size(), 1u);
  EXPECT_FALSE(p.captures()[0].is_buffer);
  EXPECT_FALSE(p.captures()[0].is_float);
  EXPECT_TRUE(p.captures()[0].used_by_mask);
}

TEST(Frontend, RankTwoBufferAndPromotion) {
  auto bias = fa::buffer<float>("bias", 2);
  auto s = score_of([bias](Score s, Index /*b*/, Index h, Index q, Index kv) {
    return s * 0.5 + bias(h, q - kv) + kv;  // Index promotes to Score
  });
  std::string ir = fa::trace(s, fa::noop_mask()).to_mlir();
  EXPECT_NE(ir.find("fa.load %bias[%h, %1] : !fa.buffer<f32, 2>"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.sitofp %kv : i32 to f32"), std::string::npos) << ir;
}

TEST(Frontend, WhereMinMaxCastsAndMath) {
  auto s = score_of([](Score s, Index, Index h, Index q, Index kv) {
    Score t = fa::where(q >= kv, fa::tanh(s), fa::exp(s) - fa::sqrt(fa::abs(s)));
    Index i = fa::max(fa::min(q, kv), fa::abs(h - 3)) % 7;
    return t + fa::to_float(i) + fa::sigmoid(s) + fa::to_float(!(q == kv)) + fa::log(fa::exp2(s));
  });
  std::string ir = fa::trace(s, fa::noop_mask()).to_mlir();
  for (const char* op :
       {"arith.select", "math.tanh", "math.exp", "math.sqrt", "math.absf", "arith.maxsi", "arith.minsi",
        "math.absi", "arith.remsi", "arith.uitofp", "math.log", "math.exp2", "arith.divf"})
    EXPECT_NE(ir.find(op), std::string::npos) << op << "\n" << ir;
}

TEST(Frontend, CombinatorsComposeAndName) {
  fa::MaskMod m = fa::and_masks({fa::mods::causal(), fa::mods::sliding_window()});
  EXPECT_EQ(m.name, "and_causal_sliding_window");
  std::string ir = fa::trace(fa::identity_score(), m).to_mlir();
  EXPECT_NE(ir.find("arith.andi"), std::string::npos) << ir;
  fa::MaskMod o = fa::or_masks({fa::mods::prefix_lm(), fa::mods::causal()});
  EXPECT_EQ(o.name, "or_prefix_lm_causal");
  EXPECT_NE(fa::trace(fa::identity_score(), o).to_mlir().find("arith.ori"), std::string::npos);
  EXPECT_EQ(fa::and_masks({}).name, "noop");
  EXPECT_EQ(fa::and_masks({fa::mods::causal()}).name, "causal");
}

TEST(Frontend, IdentityAndNoopAreRecognised) {
  fa::Program p = fa::trace(fa::identity_score(), fa::noop_mask());
  EXPECT_TRUE(p.score_is_identity());
  EXPECT_TRUE(p.mask_is_noop());
  fa::Program q = fa::trace(fa::mods::softcap(), fa::mods::causal());
  EXPECT_FALSE(q.score_is_identity());
  EXPECT_FALSE(q.mask_is_noop());
  // or_masks with an always-true side simplifies to noop.
  fa::Program r = fa::trace(fa::identity_score(), fa::or_masks({fa::mods::causal(), fa::noop_mask()}));
  EXPECT_TRUE(r.mask_is_noop()) << r.to_mlir();
}

TEST(Frontend, EveryLibraryModTraces) {
  for (const fa::MaskMod& m : {fa::mods::causal(), fa::mods::sliding_window(), fa::mods::prefix_lm(),
                               fa::mods::document(), fa::mods::dilated_sliding_window(), fa::mods::padding()})
    EXPECT_NO_THROW(fa::trace(fa::identity_score(), m)) << m.name;
  for (const fa::ScoreMod& s : {fa::mods::alibi(), fa::mods::alibi(fa::buffer<float>("slopes", 1)),
                                fa::mods::softcap(), fa::mods::relative_bias()})
    EXPECT_NO_THROW(fa::trace(s, fa::noop_mask())) << s.name;
}

// ---- errors ----------------------------------------------------------------------------

TEST(FrontendErrors, SymbolicValueOutsideTrace) {
  EXPECT_EQ(error_of([] { Index i(3); }),
            "fa::Index constant used outside of a trace: build symbolic values inside a "
            "score_mod/mask_mod traced by fa::trace or fa::compile");
}

TEST(FrontendErrors, ValueKeptFromAnotherTrace) {
  std::optional<Index> leaked;
  fa::trace(fa::identity_score(), mask_of([&](Index, Index, Index q, Index kv) {
              leaked.emplace(q);
              return q >= kv;
            }));
  EXPECT_EQ(error_of([&] {
              fa::trace(fa::identity_score(),
                        mask_of([&](Index, Index, Index q, Index) { return q >= *leaked; }));
            }),
            "binary operator: a symbolic value from another trace was used in mask_mod 'm' "
            "(symbolic values must not be kept between traces)");
}

TEST(FrontendErrors, BufferRankMismatch) {
  auto doc = fa::buffer<int32_t>("doc", 2);
  EXPECT_EQ(error_of([&] {
              fa::trace(fa::identity_score(),
                        mask_of([&](Index, Index, Index q, Index kv) { return doc[q] == doc[kv]; }));
            }),
            "buffer 'doc' has rank 2 but is indexed with 1 index in mask_mod 'm'");
}

TEST(FrontendErrors, BufferUsedWithTwoTypes) {
  auto a = fa::buffer<int32_t>("t", 1);
  auto b = fa::buffer<float>("t", 1);
  EXPECT_EQ(error_of([&] {
              fa::trace(score_of([&](Score s, Index, Index h, Index, Index) {
                          Index first = a[h];  // sequenced: a is seen before b
                          Score second = b[h];
                          return s + first + second;
                        }),
                        fa::noop_mask());
            }),
            "buffer 't' is used as float rank 1 and as int32 rank 1 in score_mod 's'");
}

TEST(FrontendErrors, BufferCapturedWithTwoTypesAcrossMods) {
  auto a = fa::buffer<int32_t>("t", 1);
  auto b = fa::buffer<float>("t", 1);
  std::string e = error_of([&] {
    fa::trace(score_of([&](Score s, Index, Index h, Index, Index) { return s + b[h]; }),
              mask_of([&](Index, Index, Index q, Index kv) { return a[q] == a[kv]; }));
  });
  EXPECT_NE(e.find("failed verification"), std::string::npos) << e;
  EXPECT_NE(e.find("captures 't' as '!fa.buffer<i32, 1>' but another mod captures it as "
                   "'!fa.buffer<f32, 1>'"),
            std::string::npos)
      << e;
}

TEST(FrontendErrors, ScalarWithTwoTypes) {
  std::string e = error_of([&] {
    fa::trace(score_of([](Score s, Index, Index, Index, Index) { return s * fa::scalar<float>("w"); }),
              mask_of([](Index, Index, Index q, Index kv) { return q - kv < fa::scalar<int32_t>("w"); }));
  });
  EXPECT_NE(e.find("scalar 'w' is used as 'i32' here but as 'f32' elsewhere"), std::string::npos) << e;
}

TEST(FrontendErrors, BadNames) {
  EXPECT_EQ(error_of([] {
              fa::trace({"bad name", [](Score s, Index, Index, Index, Index) { return s; }}, fa::noop_mask());
            }),
            "score_mod name 'bad name' must be an identifier");
  EXPECT_EQ(error_of([] {
              fa::trace(fa::identity_score(), mask_of([](Index, Index, Index q, Index kv) {
                          return q - kv < fa::scalar<int32_t>("my window");
                        }));
            }),
            "scalar name 'my window' must be an identifier");
  EXPECT_EQ(error_of([] {
              auto d = fa::buffer<int32_t>("doc-ids", 1);
              fa::trace(fa::identity_score(),
                        mask_of([d](Index, Index, Index q, Index kv) { return d[q] == d[kv]; }));
            }),
            "buffer name 'doc-ids' must be an identifier");
  EXPECT_EQ(error_of([] { fa::trace({"x", nullptr}, fa::noop_mask()); }), "score_mod 'x' has no function");
  EXPECT_EQ(error_of([] {
              fa::trace({"same", [](Score s, Index, Index, Index, Index) { return s; }},
                        {"same", [](Index, Index, Index, Index) { return Bool(true); }});
            }),
            "score_mod and mask_mod are both named 'same'; give them different names");
}

TEST(FrontendErrors, UserExceptionLeavesNoTraceBehind) {
  EXPECT_THROW(fa::trace(fa::identity_score(), mask_of([](Index, Index, Index, Index) -> Bool {
                           throw std::runtime_error("user failure");
                         })),
               std::runtime_error);
  EXPECT_EQ(error_of([] { Index i(3); }).substr(0, 42), "fa::Index constant used outside of a trace");
}

// ---- presets ---------------------------------------------------------------------------

TEST(Presets, ParseArgumentsIntoScalarValues) {
  auto s = fa::mods::mask_preset("sliding:256");
  EXPECT_EQ(s.mod.name, "sliding_window");
  EXPECT_EQ(s.scalar_values.at("window"), 256);
  EXPECT_EQ(fa::mods::mask_preset("dilated:64:2").scalar_values.at("dilation"), 2);
  EXPECT_FLOAT_EQ(fa::mods::score_preset("softcap:30.5").scalar_values.at("softcap"), 30.5);
  EXPECT_EQ(fa::mods::mask_preset("padding:3").mod.name, "padding");
}

TEST(Presets, ErrorsNameTheProblem) {
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("casual"); }),
            "unknown mask preset 'casual'; expected one of: causal, sliding:W, prefix_lm:P, "
            "document, noop, padding:N, dilated:W:D");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("sliding"); }),
            "mask preset 'sliding' takes 1 argument (usage: sliding:W)");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("sliding:abc"); }),
            "mask preset 'sliding:abc': 'abc' is not an integer (usage: sliding:W)");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("causal:3"); }),
            "mask preset 'causal:3' takes 0 arguments (usage: causal)");
  EXPECT_EQ(error_of([] { fa::mods::score_preset("softcap:-1"); }),
            "score preset 'softcap:-1': the cap must be positive");
  // negative counts: an empty window, or a prefix / padding that means nothing
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("sliding:-5"); }),
            "mask preset 'sliding:-5': the window must be >= 0, got -5");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("prefix_lm:-1"); }),
            "mask preset 'prefix_lm:-1': the prefix must be >= 0, got -1");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("padding:-3"); }),
            "mask preset 'padding:-3': the padding must be >= 0, got -3");
  EXPECT_EQ(error_of([] { fa::mods::mask_preset("dilated:-4:2"); }),
            "mask preset 'dilated:-4:2': the window must be >= 0, got -4");
  EXPECT_EQ(fa::mods::mask_preset("sliding:0").scalar_values.at("window"), 0);  // the diagonal
  EXPECT_EQ(error_of([] { fa::mods::score_preset("alibi2"); }),
            "unknown score preset 'alibi2'; expected one of: alibi, softcap:C, relative_bias, identity");
}

// ---- parsing text ----------------------------------------------------------------------

TEST(ProgramParse, FillsMissingModsAndSimplifies) {
  fa::Program p = fa::Program::parse(R"(
    fa.mask_mod @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %c0 = arith.constant 0 : i32
      %x = arith.addi %q, %c0 : i32
      %r = arith.cmpi sge, %x, %kv : i32
      fa.yield %r : i1
    })");
  EXPECT_EQ(p.mask_mod_name(), "m");
  EXPECT_EQ(p.score_mod_name(), "identity");
  EXPECT_TRUE(p.score_is_identity());
  EXPECT_EQ(p.to_mlir().find("arith.addi"), std::string::npos) << p.to_mlir();
}

TEST(ProgramParse, SyntaxAndVerifierErrorsCarryLocations) {
  std::string e = error_of([] { fa::Program::parse("fa.mask_mod @m(", "bad.mlir"); });
  EXPECT_EQ(e.rfind("invalid fa IR in bad.mlir:\nbad.mlir:1:", 0), 0u) << e;
  e = error_of([] {
    fa::Program::parse(R"(fa.mask_mod @m(%b: i32, %h: i32, %q: i32, %kv: i32) -> i32 {
  fa.yield %q : i32
})",
                       "v.mlir");
  });
  EXPECT_NE(e.find("v.mlir:1:1: error: 'fa.mask_mod' op must return 'i1', not 'i32'"), std::string::npos)
      << e;
}

TEST(ProgramParse, RejectsForeignTopLevelOpsAndDuplicates) {
  const char* two = R"(
    fa.mask_mod @a(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %t = arith.constant true
      fa.yield %t : i1
    }
    fa.mask_mod @c(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %t = arith.constant true
      fa.yield %t : i1
    })";
  EXPECT_EQ(error_of([&] { fa::Program::parse(two, "two.mlir"); }),
            "two.mlir defines 0 fa.score_mod and 2 fa.mask_mod ops; expected at most one of each");
}

}  // namespace
