// fa-differentiate (dialect/lib/Differentiate.cpp) through the interpreter: every derivative
// rule and every library score_mod against central differences of the forward mod, in score
// and in each f32 buffer element; points where the one-sided differences disagree (select
// flips, ties, kinks) are skipped. Then the tie conventions, the errors, and the helpers the
// API validates requested buffer gradients with.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "fa_test_util.h"
#include "fajit/detail/interp.h"
#include "fajit/detail/program_impl.h"
#include "fajit/frontend.h"
#include "fajit/mods.h"

namespace {

constexpr const char* kHeader = "(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)";

// A score_mod applying `op` to the score: `%r = <op> %score : f32`, or with `%x` (w[h], an
// element of the f32 buffer w) as a second operand when `binary`.
std::string op_mod(const std::string& op, bool binary) {
  std::string t = std::string("fa.score_mod @m") + kHeader;
  if (binary)
    t += " captures(%w: !fa.buffer<f32, 1>) -> f32 {\n  %x = fa.load %w[%h] : !fa.buffer<f32, 1>\n  %r = " +
         op + " %score, %x : f32\n";
  else
    t += " -> f32 {\n  %r = " + op + " %score : f32\n";
  return t + "  fa.yield %r : f32\n}\n";
}

struct Sample {
  float score;
  int b, h, q, kv;
};

// Checks the score_grad of `program` against central differences of its score_mod at each
// sample: d/d score, and d/d element for every element of every f32 buffer in `buffers`
// (which `env` binds, by pointer into these vectors, so perturbing them is seen).
void check_against_differences(const fa::Program& program, const std::vector<Sample>& samples,
                               std::map<std::string, std::vector<float>>& buffers, const fa::Bindings& env,
                               const std::string& what) {
  const fa::ModProgram mod = fa::ModProgram::score_of(program);
  const fa::ModProgram grad = fa::ModProgram::grad_of(program);
  const fa::BoundMod f = mod.bind(env);
  const fa::BoundMod g = grad.bind(env);
  int checked = 0, skipped = 0;
  // Central difference of `eval` around x (a float that `eval` reads); nullopt where the
  // one-sided differences disagree.
  auto difference = [](float& x, const std::function<double()>& eval) -> std::optional<double> {
    const float x0 = x;
    const float h = std::max(std::abs(x0), 1.0f) / 512;
    const double mid = eval();
    x = x0 + h;
    const double up = eval();
    const double hu = double(x) - x0;
    x = x0 - h;
    const double down = eval();
    const double hd = x0 - double(x);
    x = x0;
    const double fwd = (up - mid) / hu, bwd = (mid - down) / hd;
    if (!std::isfinite(fwd) || !std::isfinite(bwd)) return std::nullopt;
    if (std::abs(fwd - bwd) > 0.05 * (1 + std::abs(fwd) + std::abs(bwd))) return std::nullopt;
    return (up - down) / (hu + hd);
  };
  for (Sample s : samples) {
    std::map<std::string, std::map<int, double>> partial;  // buffer -> element -> d/d element
    const double ds = g.score_grad(s.score, s.b, s.h, s.q, s.kv, 1.0f, [&](const fa::GradAdd& a) {
      ASSERT_EQ(a.rank, 1);
      partial[a.capture][a.index[0]] += a.value;
    });
    auto eval = [&] { return double(f.score(s.score, s.b, s.h, s.q, s.kv)); };
    if (auto n = difference(s.score, eval)) {
      EXPECT_NEAR(ds, *n, 2e-3 * (1 + std::abs(*n))) << what << " d/dscore at score " << s.score;
      ++checked;
    } else {
      ++skipped;
    }
    for (auto& [name, data] : buffers)
      for (size_t i = 0; i < data.size(); ++i) {
        const double analytic = partial[name].count(int(i)) ? partial[name][int(i)] : 0.0;
        if (auto n = difference(data[i], eval)) {
          EXPECT_NEAR(analytic, *n, 2e-3 * (1 + std::abs(*n)))
              << what << " d/d" << name << "[" << i << "] at score " << s.score;
          ++checked;
        } else {
          ++skipped;
        }
      }
  }
  EXPECT_LE(4 * skipped, checked) << what << ": " << skipped << " of " << checked + skipped
                                  << " points skipped";
}

std::vector<Sample> scores(std::initializer_list<float> values) {
  std::vector<Sample> out;
  int i = 0;
  for (float v : values) out.push_back({v, 0, i % 3, (i * 5) % 7, (i * 3) % 7}), ++i;
  return out;
}

TEST(Differentiate, EveryRuleMatchesCentralDifferences) {
  struct Rule {
    const char* op;
    bool binary;
    bool positive;  // the score must be > 0 (log, sqrt, powf, ...)
  };
  const Rule rules[] = {
      {"arith.negf", false, false},   {"math.exp", false, false},      {"math.exp2", false, false},
      {"math.log", false, true},      {"math.log2", false, true},      {"math.tanh", false, false},
      {"math.sqrt", false, true},     {"math.rsqrt", false, true},     {"math.absf", false, false},
      {"math.sin", false, false},     {"math.cos", false, false},      {"math.erf", false, false},
      {"arith.addf", true, false},    {"arith.subf", true, false},     {"arith.mulf", true, false},
      {"arith.divf", true, false},    {"arith.maximumf", true, false}, {"arith.minimumf", true, false},
      {"arith.maxnumf", true, false}, {"arith.minnumf", true, false},  {"math.powf", true, true},
  };
  for (const Rule& r : rules) {
    SCOPED_TRACE(r.op);
    const fa::Program p = fa::Program::parse(op_mod(r.op, r.binary), r.op);
    std::map<std::string, std::vector<float>> buffers;
    fa::Bindings env;
    if (r.binary) {
      buffers["w"] = {0.7f, 1.3f, -0.4f};
      if (r.positive) buffers["w"] = {0.7f, 1.3f, 2.5f};
      env.buffer("w", fa::HostBuffer::f32(buffers["w"].data(), {3}));
    }
    const std::vector<Sample> s = r.positive ? scores({0.3f, 0.8f, 1.7f, 2.9f, 0.05f, 4.0f})
                                             : scores({-1.7f, -0.6f, 0.3f, 0.9f, 1.8f, -0.05f});
    check_against_differences(p, s, buffers, env, r.op);
  }
}

TEST(Differentiate, SelectAndCastsMatchCentralDifferences) {
  const std::string text = std::string("fa.score_mod @m") + kHeader +
                           " captures(%w: !fa.buffer<f32, 1>) -> f32 {\n"
                           "  %zero = arith.constant 0.0 : f32\n"
                           "  %x = fa.load %w[%h] : !fa.buffer<f32, 1>\n"
                           "  %c = arith.cmpf ogt, %score, %x : f32\n"
                           "  %d = arith.subi %kv, %q : i32\n"
                           "  %df = arith.sitofp %d : i32 to f32\n"
                           "  %s = arith.mulf %score, %df : f32\n"
                           "  %t = arith.mulf %x, %x : f32\n"
                           "  %r = arith.select %c, %s, %t : f32\n"
                           "  fa.yield %r : f32\n}\n";
  const fa::Program p = fa::Program::parse(text, "select");
  std::map<std::string, std::vector<float>> buffers{{"w", {0.2f, -0.5f, 1.1f}}};
  fa::Bindings env;
  env.buffer("w", fa::HostBuffer::f32(buffers["w"].data(), {3}));
  check_against_differences(p, scores({-1.7f, -0.6f, 0.3f, 0.9f, 1.8f, -0.05f, 0.6f, 1.4f}), buffers, env,
                            "select");
}

TEST(Differentiate, LibraryModsMatchCentralDifferences) {
  const fa::MaskMod none = fa::noop_mask();
  {
    const fa::Program p = fa::trace(fa::mods::softcap(), none);
    std::map<std::string, std::vector<float>> buffers;
    fa::Bindings env;
    env.scalar_f32("softcap", 2.5f);
    check_against_differences(p, scores({-6.f, -1.7f, -0.6f, 0.3f, 0.9f, 1.8f, 7.f}), buffers, env,
                              "softcap");
  }
  {
    const fa::Program p = fa::trace(fa::mods::alibi(), none);
    std::map<std::string, std::vector<float>> buffers;
    fa::Bindings env;
    env.scalar_i32("num_heads", 8);
    check_against_differences(p, scores({-1.7f, 0.3f, 1.8f}), buffers, env, "alibi");
  }
  {
    const fa::Program p = fa::trace(fa::mods::alibi(fa::buffer<float>("slopes", 1)), none);
    std::map<std::string, std::vector<float>> buffers{{"slopes", {0.5f, 0.25f, 0.125f}}};
    fa::Bindings env;
    env.buffer("slopes", fa::HostBuffer::f32(buffers["slopes"].data(), {3}));
    check_against_differences(p, scores({-1.7f, 0.3f, 1.8f, 0.9f}), buffers, env, "alibi_slopes");
  }
  {
    const fa::Program p = fa::trace(fa::mods::relative_bias(), none);
    std::map<std::string, std::vector<float>> buffers{{"rel_bias", std::vector<float>(13)}};
    for (size_t i = 0; i < 13; ++i) buffers["rel_bias"][i] = 0.1f * float(i) - 0.6f;
    fa::Bindings env;
    env.buffer("rel_bias", fa::HostBuffer::f32(buffers["rel_bias"].data(), {13}));
    env.scalar_i32("rel_offset", 6);
    check_against_differences(p, scores({-1.7f, 0.3f, 1.8f, 0.9f}), buffers, env, "relative_bias");
  }
}

float grad_at(const std::string& op, float score, float x, float* dx) {
  const fa::Program p = fa::Program::parse(op_mod(op, true), op);
  fa::Bindings env;
  env.buffer("w", fa::HostBuffer::f32(&x, {1}));
  *dx = 0;
  return fa::ModProgram::grad_of(p).eval_score_grad(score, 0, 0, 0, 0, 2.0f, env,
                                                    [&](const fa::GradAdd& a) { *dx += a.value; });
}

TEST(Differentiate, TiesSplitForMaximumAndGoFirstForMaxnum) {
  float dx;
  EXPECT_EQ(grad_at("arith.maximumf", 1.5f, 1.5f, &dx), 1.0f);
  EXPECT_EQ(dx, 1.0f);
  EXPECT_EQ(grad_at("arith.minimumf", 1.5f, 1.5f, &dx), 1.0f);
  EXPECT_EQ(dx, 1.0f);
  EXPECT_EQ(grad_at("arith.maxnumf", 1.5f, 1.5f, &dx), 2.0f);
  EXPECT_EQ(dx, 0.0f);
  EXPECT_EQ(grad_at("arith.minnumf", 1.5f, 1.5f, &dx), 2.0f);
  EXPECT_EQ(dx, 0.0f);
  EXPECT_EQ(grad_at("arith.maximumf", 1.0f, 1.5f, &dx), 0.0f);
  EXPECT_EQ(dx, 2.0f);
  const fa::Program abs = fa::Program::parse(op_mod("math.absf", false), "abs");
  EXPECT_EQ(fa::ModProgram::grad_of(abs).eval_score_grad(0.0f, 0, 0, 0, 0, 1.0f, {}), 0.0f);
  EXPECT_EQ(fa::ModProgram::grad_of(abs).eval_score_grad(-0.5f, 0, 0, 0, 0, 1.0f, {}), -1.0f);
}

TEST(Differentiate, AdditiveBiasIsTheIdentityOnTheScore) {
  const fa::Program p = fa::trace(fa::mods::relative_bias(), fa::noop_mask());
  const fa::ModProgram g = fa::ModProgram::grad_of(p);
  EXPECT_EQ(g.kind(), fa::ModKind::kScoreGrad);
  EXPECT_EQ(g.name(), "relative_bias");
  std::vector<float> bias(9, 0.f);
  fa::Bindings env;
  env.buffer("rel_bias", fa::HostBuffer::f32(bias.data(), {9})).scalar_i32("rel_offset", 4);
  std::vector<std::string> seen;
  EXPECT_EQ(g.eval_score_grad(0.25f, 0, 0, 5, 2, 0.75f, env,
                              [&](const fa::GradAdd& a) {
                                seen.push_back(a.capture + "[" + std::to_string(a.index[0]) +
                                               "] += " + std::to_string(a.value));
                              }),
            0.75f);
  EXPECT_EQ(seen, std::vector<std::string>{"rel_bias[7] += 0.750000"});
  // grad_add checks its indices as fa.load does.
  EXPECT_EQ(fa::test::error_of([&] { g.eval_score_grad(0.f, 0, 0, 8, 2, 1.f, env); }),
            "capture 'rel_bias' index 10 is out of bounds for dimension 0 of size 9");
}

TEST(Differentiate, ModsWithoutDerivativeSayWhichOp) {
  const fa::Program p = fa::Program::parse(op_mod("math.floor", false), "floor.mlir");
  // The forward is unaffected; the derivative is refused with the pass's diagnostic.
  EXPECT_EQ(fa::ModProgram::score_of(p).eval_score(1.5f, 0, 0, 0, 0, {}), 1.0f);
  EXPECT_EQ(fa::test::error_of([&] { fa::ModProgram::grad_of(p); }),
            "cannot differentiate score_mod @m:\nfloor.mlir:2:8: error: 'math.floor' op has no derivative (a "
            "step function); the gradient of score_mod @m would flow through it");
}

TEST(Differentiate, GradientBuffersAreTheFloatBuffersRead) {
  const std::string text = std::string("fa.score_mod @m") + kHeader +
                           " captures(%doc: !fa.buffer<i32, 1>, %bias: !fa.buffer<f32, 1>, "
                           "%unused: !fa.buffer<f32, 1>) -> f32 {\n"
                           "  %d = fa.load %doc[%q] : !fa.buffer<i32, 1>\n"
                           "  %x = fa.load %bias[%d] : !fa.buffer<f32, 1>\n"
                           "  %r = arith.addf %score, %x : f32\n"
                           "  fa.yield %r : f32\n}\n";
  const fa::Program p = fa::Program::parse(text, "bufs");
  EXPECT_EQ(fa::detail::gradient_buffers(p), std::vector<std::string>{"bias"});
  fa::detail::check_gradient_buffers(p, {"bias"});
  EXPECT_EQ(fa::test::error_of([&] {
              fa::detail::check_gradient_buffers(p, {"bias", "doc"});
            }),
            "capture 'doc' is an i32 buffer: integer buffers have no gradient");
  EXPECT_EQ(fa::test::error_of([&] { fa::detail::check_gradient_buffers(p, {"slopes"}); }),
            "score_mod @m does not read a float buffer named 'slopes'");
}

TEST(Differentiate, ScoreGradIsNotAScoreMod) {
  const fa::Program p = fa::trace(fa::mods::softcap(), fa::noop_mask());
  fa::Bindings env;
  env.scalar_f32("softcap", 2.f);
  const fa::BoundMod g = fa::ModProgram::grad_of(p).bind(env);
  EXPECT_EQ(fa::test::error_of([&] { g.score(0.f, 0, 0, 0, 0); }),
            "@softcap is a score_grad, not a score_mod");
  EXPECT_EQ(
      fa::test::error_of([&] { fa::ModProgram::score_of(p).bind(env).score_grad(0.f, 0, 0, 0, 0, 1.f); }),
      "@softcap is a score_mod, not a score_grad");
}

}  // namespace
