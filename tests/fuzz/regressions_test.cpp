// Regression tests for the bugs `fajit fuzz` found, written without the generator (whose cases
// change when it does). Each names the replay that found it.
#include <gtest/gtest.h>

#include "fajit/frontend.h"
#include "fuzz.h"

namespace {

// fajit fuzz --seed 1 --case 3 (before commit "Program: canonicalize + CSE to a fixed point"):
// two reads of the scalar w0 were merged by CSE only after canonicalization, leaving
// `cmpi sge %w0, %w0` unfolded; parsing the printed module folded it, so the same mods traced
// and parsed had different IR (and cache keys).
TEST(FuzzRegression, PrintedModuleParsesBackUnchanged) {
  fa::MaskMod mask{"m", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                     fa::Index w0 = fa::scalar<int32_t>("w0");
                     fa::Index w0_again = fa::scalar<int32_t>("w0");
                     return (w0 >= w0_again) == (kv <= q);
                   }};
  fa::Program p = fa::trace(fa::identity_score(), mask);
  std::string text = p.to_mlir();
  EXPECT_EQ(fa::Program::parse(text).to_mlir(), text);
  EXPECT_EQ(text.find("fa.scalar"), std::string::npos) << text;  // w0 >= w0 folds to true
}

// fajit fuzz --seed 1 --case 262 (MLIR-text cases): maxnumf / minnumf whose second operand is
// NaN return the first, but fa-differentiate gave the adjoint to the NaN operand: the buffer
// element got d/dw = 1 and the score 1 instead of 2. (The case had sqrt(score) of a negative
// score in the NaN operand; its 0 * NaN adjoint makes dS NaN, as torch.where's does.)
TEST(FuzzRegression, MinnumfGradientSkipsTheNaNOperand) {
  fa::Program p = fa::Program::parse(R"(
    fa.score_mod @f(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%w: !fa.buffer<f32, 1>) -> f32 {
      %x = fa.load %w[%h] : !fa.buffer<f32, 1>
      %nan = arith.constant 0x7FC00000 : f32
      %y = arith.addf %x, %nan : f32
      %m = arith.minnumf %score, %y : f32
      %r = arith.addf %score, %m : f32
      fa.yield %r : f32
    })");
  float w[1] = {0.5f};
  fa::Bindings env;
  env.buffer("w", fa::HostBuffer::f32(w, {1}));
  float dw = 0;
  float ds = fa::ModProgram::grad_of(p).eval_score_grad(-2.9f, 0, 0, 0, 0, 1.0f, env,
                                                        [&](const fa::GradAdd& g) { dw += g.value; });
  EXPECT_EQ(ds, 2.0f);
  EXPECT_EQ(dw, 0.0f);
}

// The generator is a pure function of (seed, case): a replay sees the same case.
TEST(FuzzRegression, CasesAreReproducible) {
  for (int k = 0; k < 20; ++k) {
    fa_fuzz::Case a = fa_fuzz::generate_case(42, k), b = fa_fuzz::generate_case(42, k);
    EXPECT_EQ(fa_fuzz::describe(a), fa_fuzz::describe(b));
  }
}

// Hand-built graphs through every CPU check: the derivative check sees checked points.
TEST(FuzzRegression, HandBuiltGraphsPassEveryCheck) {
  using fa_fuzz::Node;
  using fa_fuzz::Op;
  using fa_fuzz::Ty;
  auto score = std::make_shared<Node>(Node{Op::kScoreArg, Ty::kScore, {}, 0, 0, ""});
  for (Op op : {Op::kExp, Op::kSigmoid, Op::kTanh, Op::kErf}) {
    fa_fuzz::Case c = fa_fuzz::generate_case(1, 5);
    c.score = std::make_shared<Node>(Node{op, Ty::kScore, {score}, 0, 0, ""});
    fa_fuzz::Stats st;
    EXPECT_EQ(fa_fuzz::check_cpu(c, /*nvrtc=*/false, &st), "");
    EXPECT_GT(st.fd_checked, 0);
    EXPECT_EQ(st.no_derivative, 0);
  }
}

}  // namespace
