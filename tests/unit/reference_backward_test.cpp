// fa::reference_attention_backward (compiler/include/fajit/reference.h) against central
// differences of its own forward: L = sum(out * dout) + sum(lse * dlse), on small random
// shapes with GQA, Lq != Lkv, a causal mask (fully masked rows included) and dLSE.
#include "fajit/detail/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fa_test_util.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/error.h"
#include "fajit/frontend.h"
#include "fajit/mods.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

namespace {

fa::ModProgram compile_mod(const std::string& text) {
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  mlir::MLIRContext ctx(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  if (!module) throw std::runtime_error("parse failed:\n" + text);
  return fa::ModProgram::compile(&module->getBody()->front());
}

// q >= kv + offset: rows q < offset have no keys at all.
std::string shifted_causal(int offset) {
  return "fa.mask_mod @shifted(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
         "  %o = arith.constant " +
         std::to_string(offset) +
         " : i32\n"
         "  %k = arith.addi %kv, %o : i32\n"
         "  %c = arith.cmpi sge, %q, %k : i32\n"
         "  fa.yield %c : i1\n}\n";
}

double loss(const fa::ReferenceShape& s, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const std::vector<double>& dout, const std::vector<double>& dlse,
            const fa::ReferenceOptions& opt) {
  const fa::ReferenceResult r = fa::reference_attention(s, q.data(), k.data(), v.data(), opt);
  double l = 0;
  for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * dout[i];
  for (size_t i = 0; i < r.lse.size(); ++i)
    if (std::isfinite(r.lse[i])) l += r.lse[i] * dlse[i];
  return l;
}

// Central difference of `loss` in x[i] (x is one of q, k, v; float inputs, double steps are
// not representable, so the step is a power of two that float holds exactly around x[i]).
double numeric(std::vector<float>& x, size_t i, const std::function<double()>& f) {
  const float x0 = x[i];
  const float h = 1.0f / 256;
  x[i] = x0 + h;
  const double up = f();
  x[i] = x0 - h;
  const double down = f();
  x[i] = x0;
  return (up - down) / (2.0 * h);
}

struct Case {
  fa::ReferenceShape shape;
  int mask_offset;  // < 0: no mask
  bool with_dlse;
};

class ReferenceBackward : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceBackward, MatchesCentralDifferences) {
  const Case c = GetParam();
  const fa::ReferenceShape& s = c.shape;
  std::mt19937 rng(1234 + s.len_q * 7 + s.len_kv);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = u(rng);
    return x;
  };
  std::vector<float> q = fill(size_t(s.batch) * s.heads_q * s.len_q * s.dim_qk);
  std::vector<float> k = fill(size_t(s.batch) * s.heads_kv * s.len_kv * s.dim_qk);
  std::vector<float> v = fill(size_t(s.batch) * s.heads_kv * s.len_kv * s.dim_v);
  std::vector<double> dout(size_t(s.batch) * s.heads_q * s.len_q * s.dim_v);
  std::vector<double> dlse(size_t(s.batch) * s.heads_q * s.len_q, 0.0);
  for (double& e : dout) e = u(rng);
  if (c.with_dlse)
    for (double& e : dlse) e = u(rng);

  std::optional<fa::ModProgram> mask;
  fa::ReferenceOptions opt;
  opt.scale = 0.5;
  if (c.mask_offset >= 0) {
    mask.emplace(compile_mod(shifted_causal(c.mask_offset)));
    opt.mask_mod = &*mask;
  }
  const fa::ReferenceGrads g = fa::reference_attention_backward(s, q.data(), k.data(), v.data(), dout.data(),
                                                                c.with_dlse ? dlse.data() : nullptr, opt);
  auto f = [&] { return loss(s, q, k, v, dout, dlse, opt); };
  double worst = 0;
  auto check = [&](const char* what, std::vector<float>& x, const std::vector<double>& analytic) {
    ASSERT_EQ(x.size(), analytic.size()) << what;
    for (size_t i = 0; i < x.size(); ++i) {
      const double n = numeric(x, i, f);
      const double err = std::abs(n - analytic[i]);
      worst = std::max(worst, err);
      EXPECT_NEAR(analytic[i], n, 2e-3 * (1 + std::abs(n))) << what << "[" << i << "]";
    }
  };
  check("dq", q, g.dq);
  check("dk", k, g.dk);
  check("dv", v, g.dv);
  RecordProperty("worst_abs_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ReferenceBackward,
    ::testing::Values(Case{{1, 1, 1, 3, 4, 4, 3}, -1, false},   // plain, Lq != Lkv, Dqk != Dv
                      Case{{2, 4, 2, 5, 5, 3, 2}, 0, true},     // GQA 2, causal, dLSE
                      Case{{1, 3, 1, 6, 4, 2, 4}, 2, true},     // MQA, rows 0-1 fully masked
                      Case{{1, 2, 2, 1, 7, 4, 4}, -1, true}));  // one query row

TEST(ReferenceBackward, FullyMaskedRowsAndUnseenKeysGetZeroGradients) {
  const fa::ReferenceShape s{1, 1, 1, 4, 6, 2, 2};
  std::vector<float> q(8, 0.5f), k(12, -0.25f), v(12, 1.5f);
  std::vector<double> dout(8, 1.0), dlse(4, 1.0);
  fa::ModProgram mask = compile_mod(shifted_causal(2));  // q=0,1 see nothing; kv 2..5 seen by no q < kv+2
  fa::ReferenceOptions opt;
  opt.mask_mod = &mask;
  const fa::ReferenceGrads g =
      fa::reference_attention_backward(s, q.data(), k.data(), v.data(), dout.data(), dlse.data(), opt);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(g.dq[0 * 2 + d], 0.0);
    EXPECT_EQ(g.dq[1 * 2 + d], 0.0);
    EXPECT_EQ(g.dk[5 * 2 + d], 0.0);  // key 5 needs q >= 7
    EXPECT_EQ(g.dv[5 * 2 + d], 0.0);
    EXPECT_EQ(g.dk[4 * 2 + d], 0.0);  // key 4 needs q >= 6
  }
  for (double x : g.dq) EXPECT_TRUE(std::isfinite(x));
}

TEST(ReferenceBackward, ScoreModNeedsItsDerivative) {
  const fa::ReferenceShape s{1, 1, 1, 1, 1, 1, 1};
  fa::ModProgram neg = compile_mod(
      "fa.score_mod @neg(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %n = arith.negf %score : f32\n  fa.yield %n : f32\n}\n");
  fa::ReferenceOptions opt;
  opt.score_mod = &neg;
  const float one = 1.f;
  const double d = 1.0;
  EXPECT_EQ(
      fa::test::error_of([&] { fa::reference_attention_backward(s, &one, &one, &one, &d, nullptr, opt); }),
      "reference_attention_backward: score_mod @neg needs its derivative: set ReferenceOptions::score_grad "
      "(fa::ModProgram::grad_of)");
  opt.score_grad = &neg;
  EXPECT_EQ(
      fa::test::error_of([&] { fa::reference_attention_backward(s, &one, &one, &one, &d, nullptr, opt); }),
      "reference_attention_backward: score_grad @neg is not an fa.score_grad");
}

// The backward with a score_mod and its derivative against central differences of the
// forward, in q, k, v and every element of the f32 buffers the score_mod reads.
struct ModCase {
  const char* name;
  std::function<fa::ScoreMod()> mod;
  std::map<std::string, std::vector<float>> buffers;  // rank 1
  std::function<void(fa::Bindings&)> scalars;
};
void PrintTo(const ModCase& c, std::ostream* os) { *os << c.name; }

class ReferenceBackwardScoreMod : public ::testing::TestWithParam<ModCase> {};

TEST_P(ReferenceBackwardScoreMod, MatchesCentralDifferences) {
  ModCase c = GetParam();
  const fa::ReferenceShape s{2, 4, 2, 5, 6, 3, 2};  // GQA 2, Lq != Lkv
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = 2 * u(rng);
    return x;
  };
  std::vector<float> q = fill(size_t(s.batch) * s.heads_q * s.len_q * s.dim_qk);
  std::vector<float> k = fill(size_t(s.batch) * s.heads_kv * s.len_kv * s.dim_qk);
  std::vector<float> v = fill(size_t(s.batch) * s.heads_kv * s.len_kv * s.dim_v);
  std::vector<double> dout(size_t(s.batch) * s.heads_q * s.len_q * s.dim_v);
  std::vector<double> dlse(size_t(s.batch) * s.heads_q * s.len_q);
  for (double& e : dout) e = u(rng);
  for (double& e : dlse) e = u(rng);

  const fa::Program program = fa::trace(c.mod(), fa::mods::causal());
  const fa::ModProgram mod = fa::ModProgram::score_of(program);
  const fa::ModProgram grad = fa::ModProgram::grad_of(program);
  const fa::ModProgram mask = fa::ModProgram::mask_of(program);
  fa::Bindings env;
  for (auto& [name, data] : c.buffers)
    env.buffer(name, fa::HostBuffer::f32(data.data(), {static_cast<int64_t>(data.size())}));
  if (c.scalars) c.scalars(env);
  fa::ReferenceOptions opt;
  opt.scale = 0.75;
  opt.score_mod = &mod;
  opt.score_grad = &grad;
  opt.mask_mod = &mask;
  opt.bindings = &env;
  const fa::ReferenceGrads g =
      fa::reference_attention_backward(s, q.data(), k.data(), v.data(), dout.data(), dlse.data(), opt);
  auto f = [&] { return loss(s, q, k, v, dout, dlse, opt); };
  auto check = [&](const std::string& what, std::vector<float>& x, const std::vector<double>& analytic) {
    ASSERT_EQ(x.size(), analytic.size()) << what;
    for (size_t i = 0; i < x.size(); ++i) {
      const double n = numeric(x, i, f);
      EXPECT_NEAR(analytic[i], n, 2e-3 * (1 + std::abs(n))) << what << "[" << i << "]";
    }
  };
  check("dq", q, g.dq);
  check("dk", k, g.dk);
  check("dv", v, g.dv);
  EXPECT_EQ(g.buffer_grads.size(), c.buffers.size());
  for (auto& [name, data] : c.buffers) {
    ASSERT_TRUE(g.buffer_grads.count(name)) << name;
    check("d" + name, data, g.buffer_grads.at(name));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mods, ReferenceBackwardScoreMod,
    ::testing::Values(ModCase{"softcap",
                              [] { return fa::mods::softcap(); },
                              {},
                              [](fa::Bindings& e) { e.scalar_f32("softcap", 1.5f); }},
                      ModCase{"alibi_slopes",
                              [] { return fa::mods::alibi(fa::buffer<float>("slopes", 1)); },
                              {{"slopes", {0.5f, -0.25f, 0.125f, 0.75f}}},
                              {}},
                      ModCase{"relative_bias",
                              [] { return fa::mods::relative_bias(); },
                              {{"rel_bias",
                                {0.3f, -0.2f, 0.1f, 0.7f, -0.5f, 0.2f, 0.4f, -0.1f, 0.6f, 0.05f, -0.3f}}},
                              [](fa::Bindings& e) { e.scalar_i32("rel_offset", 5); }}),
    [](const ::testing::TestParamInfo<ModCase>& i) { return std::string(i.param.name); });

}  // namespace
