// Tests of fa::reference_attention and fa::brute_force_block_classes
// (compiler/include/fajit/detail/reference.h) against plainly written loops.
#include "fajit/detail/reference.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/error.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

namespace {

fa::ModProgram compile_mod(const std::string& text) {
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  mlir::MLIRContext ctx(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  if (!module) throw std::runtime_error("parse failed:\n" + text);
  for (mlir::Operation& op : module->getBody()->getOperations())
    if (llvm::isa<mlir::fa::ScoreModOp, mlir::fa::MaskModOp>(op)) return fa::ModProgram::compile(&op);
  throw std::runtime_error("no mod in:\n" + text);
}

const char* kCausal =
    "fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
    "  %c = arith.cmpi sge, %q, %kv : i32\n"
    "  fa.yield %c : i1\n"
    "}\n";

const char* kAlibi =
    "fa.score_mod @alibi(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)\n"
    "    captures(%slopes: !fa.buffer<f32, 1>) -> f32 {\n"
    "  %d = arith.subi %kv, %q : i32\n"
    "  %df = arith.sitofp %d : i32 to f32\n"
    "  %s = fa.load %slopes[%h] : !fa.buffer<f32, 1>\n"
    "  %m = arith.mulf %df, %s : f32\n"
    "  %r = arith.addf %score, %m : f32\n"
    "  fa.yield %r : f32\n"
    "}\n";

const char* kSoftcap =
    "fa.score_mod @softcap(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
    "  %cap = fa.scalar \"cap\" : f32\n"
    "  %d = arith.divf %score, %cap : f32\n"
    "  %t = math.tanh %d : f32\n"
    "  %r = arith.mulf %cap, %t : f32\n"
    "  fa.yield %r : f32\n"
    "}\n";

// keep[b][q] != 0 keeps row q of batch b; a row with 0 is fully masked.
const char* kKeepRows =
    "fa.mask_mod @keep(%b: i32, %h: i32, %q: i32, %kv: i32)\n"
    "    captures(%keep: !fa.buffer<i32, 2>) -> i1 {\n"
    "  %k = fa.load %keep[%b, %q] : !fa.buffer<i32, 2>\n"
    "  %z = arith.constant 0 : i32\n"
    "  %c = arith.cmpi ne, %k, %z : i32\n"
    "  fa.yield %c : i1\n"
    "}\n";

struct Problem {
  int B = 2, Hq = 4, Hkv = 2, Lq = 5, Lkv = 7, Dqk = 8, Dv = 4;
  std::vector<float> q, k, v;
  explicit Problem(uint32_t seed = 42) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    q.resize(size_t(B) * Hq * Lq * Dqk);
    k.resize(size_t(B) * Hkv * Lkv * Dqk);
    v.resize(size_t(B) * Hkv * Lkv * Dv);
    for (float& x : q) x = u(rng);
    for (float& x : k) x = u(rng);
    for (float& x : v) x = u(rng);
  }
  fa::ReferenceShape shape() const { return {B, Hq, Hkv, Lq, Lkv, Dqk, Dv}; }
};

using ScoreFn = std::function<double(double, int, int, int, int)>;
using MaskFn = std::function<bool(int, int, int, int)>;

// softmax(Q K^T * scale) V, written out plainly.
fa::ReferenceResult naive(const Problem& p, double scale, const ScoreFn& score_mod, const MaskFn& mask_mod) {
  fa::ReferenceResult r;
  r.out.assign(size_t(p.B) * p.Hq * p.Lq * p.Dv, 0.0);
  r.lse.assign(size_t(p.B) * p.Hq * p.Lq, 0.0);
  r.max_score.assign(r.lse.size(), 0.0);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h) {
      int hk = h / (p.Hq / p.Hkv);
      for (int i = 0; i < p.Lq; ++i) {
        std::vector<double> s(p.Lkv);
        std::vector<bool> keep(p.Lkv);
        for (int j = 0; j < p.Lkv; ++j) {
          double dot = 0;
          for (int d = 0; d < p.Dqk; ++d)
            dot += double(p.q[((size_t(b) * p.Hq + h) * p.Lq + i) * p.Dqk + d]) *
                   double(p.k[((size_t(b) * p.Hkv + hk) * p.Lkv + j) * p.Dqk + d]);
          s[j] = dot * scale;
          keep[j] = !mask_mod || mask_mod(b, h, i, j);
          if (keep[j] && score_mod) s[j] = score_mod(s[j], b, h, i, j);
        }
        double mx = -INFINITY;
        for (int j = 0; j < p.Lkv; ++j)
          if (keep[j]) mx = std::max(mx, s[j]);
        size_t row = (size_t(b) * p.Hq + h) * p.Lq + i;
        r.max_score[row] = mx;
        if (mx == -INFINITY) {
          r.lse[row] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int j = 0; j < p.Lkv; ++j)
          if (keep[j]) sum += std::exp(s[j] - mx);
        for (int d = 0; d < p.Dv; ++d) {
          double acc = 0;
          for (int j = 0; j < p.Lkv; ++j)
            if (keep[j])
              acc +=
                  std::exp(s[j] - mx) / sum * double(p.v[((size_t(b) * p.Hkv + hk) * p.Lkv + j) * p.Dv + d]);
          r.out[row * p.Dv + d] = acc;
        }
        r.lse[row] = mx + std::log(sum);
      }
    }
  return r;
}

void expect_close(const fa::ReferenceResult& got, const fa::ReferenceResult& want) {
  ASSERT_EQ(got.out.size(), want.out.size());
  ASSERT_EQ(got.lse.size(), want.lse.size());
  for (size_t i = 0; i < want.out.size(); ++i) {
    ASSERT_FALSE(std::isnan(got.out[i])) << i;
    EXPECT_NEAR(got.out[i], want.out[i], 1e-12) << "out[" << i << "]";
  }
  ASSERT_EQ(got.max_score.size(), want.max_score.size());
  for (size_t i = 0; i < want.max_score.size(); ++i) {
    if (std::isinf(want.max_score[i])) {
      EXPECT_EQ(got.max_score[i], want.max_score[i]) << "max_score[" << i << "]";
    } else {
      EXPECT_NEAR(got.max_score[i], want.max_score[i], 1e-12) << "max_score[" << i << "]";
    }
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got.lse[i], want.lse[i]) << "lse[" << i << "]";
    } else {
      EXPECT_NEAR(got.lse[i], want.lse[i], 1e-12) << "lse[" << i << "]";
    }
  }
}

using fa::test::error_of;

TEST(Reference, PlainSoftmaxMatchesNaive) {
  Problem p;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data());
  expect_close(got, naive(p, 1.0 / std::sqrt(8.0), nullptr, nullptr));
  // Explicit scale.
  fa::ReferenceOptions opt;
  opt.scale = 0.3;
  expect_close(fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt),
               naive(p, 0.3, nullptr, nullptr));
}

TEST(Reference, CausalMask) {
  Problem p;
  fa::ModProgram causal = compile_mod(kCausal);
  fa::ReferenceOptions opt;
  opt.mask_mod = &causal;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  expect_close(got, naive(p, 1.0 / std::sqrt(8.0), nullptr, [](int, int, int q, int kv) { return q >= kv; }));
}

TEST(Reference, AlibiScoreModReadsBuffer) {
  Problem p;
  fa::ModProgram alibi = compile_mod(kAlibi);
  fa::ModProgram causal = compile_mod(kCausal);
  std::vector<float> slopes(p.Hq);
  for (int h = 0; h < p.Hq; ++h) slopes[h] = std::exp2(-8.0f * (h + 1) / p.Hq);
  fa::Bindings env;
  env.buffer("slopes", fa::HostBuffer::f32(slopes.data(), {p.Hq}));
  fa::ReferenceOptions opt;
  opt.score_mod = &alibi;
  opt.mask_mod = &causal;
  opt.bindings = &env;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  ScoreFn ref = [&](double s, int, int h, int q, int kv) {
    float df = static_cast<float>(kv - q);
    float m = df * slopes[h];
    return double(static_cast<float>(s) + m);
  };
  expect_close(got, naive(p, 1.0 / std::sqrt(8.0), ref, [](int, int, int q, int kv) { return q >= kv; }));
  // Without the mask too (kv - q positive).
  opt.mask_mod = nullptr;
  expect_close(fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt),
               naive(p, 1.0 / std::sqrt(8.0), ref, nullptr));
}

TEST(Reference, SoftcapScoreModUsesScalar) {
  Problem p;
  fa::ModProgram softcap = compile_mod(kSoftcap);
  fa::Bindings env;
  env.scalar_f32("cap", 1.5f);
  fa::ReferenceOptions opt;
  opt.score_mod = &softcap;
  opt.bindings = &env;
  opt.scale = 1.0;  // large scores so the cap matters
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  ScoreFn ref = [](double s, int, int, int, int) {
    float cap = 1.5f;
    float d = static_cast<float>(s) / cap;
    float t = std::tanh(d);
    return double(cap * t);
  };
  expect_close(got, naive(p, 1.0, ref, nullptr));
  for (double l : got.lse) EXPECT_LE(l, 1.5 + std::log(7.0) + 1e-12);
  // The scalar is required.
  fa::Bindings none;
  opt.bindings = &none;
  EXPECT_EQ(error_of([&] { fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt); }),
            "missing scalar 'cap' (f32)");
}

TEST(Reference, FullyMaskedRowsGiveZeroAndMinusInf) {
  Problem p;
  fa::ModProgram keep_rows = compile_mod(kKeepRows);
  std::vector<int32_t> keep = {1, 0, 1, 0, 0,   // batch 0: rows 1, 3, 4 fully masked
                               0, 1, 1, 1, 0};  // batch 1: rows 0, 4
  fa::Bindings env;
  env.buffer("keep", fa::HostBuffer::i32(keep.data(), {p.B, p.Lq}));
  fa::ModProgram softcap = compile_mod(kSoftcap);
  env.scalar_f32("cap", 20.0f);
  fa::ReferenceOptions opt;
  opt.mask_mod = &keep_rows;
  opt.score_mod = &softcap;
  opt.bindings = &env;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int i = 0; i < p.Lq; ++i) {
        size_t row = (size_t(b) * p.Hq + h) * p.Lq + i;
        for (int d = 0; d < p.Dv; ++d) EXPECT_FALSE(std::isnan(got.out[row * p.Dv + d]));
        EXPECT_FALSE(std::isnan(got.lse[row]));
        if (keep[b * p.Lq + i]) {
          EXPECT_TRUE(std::isfinite(got.lse[row]));
        } else {
          EXPECT_EQ(got.lse[row], -std::numeric_limits<double>::infinity());
          EXPECT_EQ(got.max_score[row], -std::numeric_limits<double>::infinity());
          for (int d = 0; d < p.Dv; ++d) EXPECT_EQ(got.out[row * p.Dv + d], 0.0);
        }
      }
  ScoreFn ref = [](double s, int, int, int, int) {
    float d = static_cast<float>(s) / 20.0f;
    return double(20.0f * std::tanh(d));
  };
  expect_close(got, naive(p, 1.0 / std::sqrt(8.0), ref,
                          [&](int b, int, int q, int) { return keep[b * p.Lq + q] != 0; }));
  // A score_mod that yields -inf everywhere also masks every row.
  fa::ModProgram ninf = compile_mod(
      "fa.score_mod @ninf(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %r = arith.constant 0xFF800000 : f32\n  fa.yield %r : f32\n}\n");
  fa::ReferenceOptions o2;
  o2.score_mod = &ninf;
  auto all = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), o2);
  for (double x : all.out) EXPECT_EQ(x, 0.0);
  for (double l : all.lse) EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
  for (double m : all.max_score) EXPECT_EQ(m, -std::numeric_limits<double>::infinity());
}

// A row whose every unmasked score is NaN is NaN (softmax of NaN), not a fully masked row; one
// NaN among finite scores makes the row NaN too. Causal: row 0 has one key, later rows several.
TEST(Reference, NanScoresPropagateNotMask) {
  Problem p;
  fa::ModProgram nan_at_0 = compile_mod(
      "fa.score_mod @nan0(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %z = arith.constant 0 : i32\n"
      "  %c = arith.cmpi eq, %kv, %z : i32\n"
      "  %n = arith.constant 0x7FC00000 : f32\n"
      "  %r = arith.select %c, %n, %score : f32\n"
      "  fa.yield %r : f32\n"
      "}\n");
  fa::ModProgram causal = compile_mod(kCausal);
  fa::ReferenceOptions opt;
  opt.score_mod = &nan_at_0;
  opt.mask_mod = &causal;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  for (size_t row = 0; row < got.lse.size(); ++row) {
    EXPECT_TRUE(std::isnan(got.lse[row])) << "lse[" << row << "]";
    EXPECT_TRUE(std::isnan(got.max_score[row])) << "max_score[" << row << "]";
    for (int d = 0; d < p.Dv; ++d) EXPECT_TRUE(std::isnan(got.out[row * p.Dv + d])) << "out row " << row;
  }
}

// A +inf score makes the row's max +inf (a NaN score beside it too: the kernels cannot tell).
TEST(Reference, InfiniteScoreIsTheMax) {
  Problem p;
  fa::ModProgram inf_at_0 = compile_mod(
      "fa.score_mod @inf0(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %z = arith.constant 0 : i32\n"
      "  %c = arith.cmpi eq, %kv, %z : i32\n"
      "  %n = arith.constant 0x7F800000 : f32\n"
      "  %r = arith.select %c, %n, %score : f32\n"
      "  fa.yield %r : f32\n"
      "}\n");
  fa::ReferenceOptions opt;
  opt.score_mod = &inf_at_0;
  auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  for (double m : got.max_score) EXPECT_EQ(m, std::numeric_limits<double>::infinity());
}

// The problem cut to its first key: a row's softmax is that key alone (P = 1, O = v).
Problem one_key() {
  Problem p;
  p.Lkv = 1;
  p.k.resize(size_t(p.B) * p.Hkv * p.Dqk);
  p.v.resize(size_t(p.B) * p.Hkv * p.Dv);
  return p;
}

// dot_shift moves each q·k by shift·Σ|q_d·k_d|: with one key the LSE is that score exactly,
// in the forward and in the backward's own forward.
TEST(Reference, DotShiftMovesEveryScoreByItsMagnitude) {
  const Problem p = one_key();
  const double shift = 1e-3, scale = 1.0 / std::sqrt(double(p.Dqk));
  fa::ReferenceOptions opt;
  opt.dot_shift = shift;
  const auto got = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int i = 0; i < p.Lq; ++i) {
        const float* q = &p.q[((size_t(b) * p.Hq + h) * p.Lq + i) * p.Dqk];
        const float* k = &p.k[(size_t(b) * p.Hkv + h / (p.Hq / p.Hkv)) * p.Dqk];
        double dot = 0, mag = 0;
        for (int d = 0; d < p.Dqk; ++d) dot += double(q[d]) * k[d], mag += std::fabs(double(q[d]) * k[d]);
        EXPECT_NEAR(got.lse[(size_t(b) * p.Hq + h) * p.Lq + i], (dot + shift * mag) * scale, 1e-12);
      }
  std::vector<double> dout(size_t(p.B) * p.Hq * p.Lq * p.Dv, 1.0);
  const auto g = fa::reference_attention_backward(p.shape(), p.q.data(), p.k.data(), p.v.data(), dout.data(),
                                                  nullptr, opt);
  EXPECT_EQ(g.forward.lse, got.lse);
}

// dp_shift moves dP - Δ by shift·(Σ|dO·v| + Σ|dO·o|): with one key P = 1 and O = v, so dS is
// exactly that and dQ = scale·dS·k.
TEST(Reference, DpShiftMovesEveryDsByItsMagnitude) {
  const Problem p = one_key();
  const double shift = 1e-3, scale = 1.0 / std::sqrt(double(p.Dqk));
  std::vector<double> dout(size_t(p.B) * p.Hq * p.Lq * p.Dv);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(double(i));
  fa::ReferenceOptions opt;
  opt.dp_shift = shift;
  const auto g = fa::reference_attention_backward(p.shape(), p.q.data(), p.k.data(), p.v.data(), dout.data(),
                                                  nullptr, opt);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int i = 0; i < p.Lq; ++i) {
        const size_t ri = (size_t(b) * p.Hq + h) * p.Lq + i;
        const size_t kv = size_t(b) * p.Hkv + h / (p.Hq / p.Hkv);
        double mag = 0;
        for (int d = 0; d < p.Dv; ++d) mag += 2 * std::fabs(dout[ri * p.Dv + d] * p.v[kv * p.Dv + d]);
        for (int d = 0; d < p.Dqk; ++d)
          EXPECT_NEAR(g.dq[ri * p.Dqk + d], scale * shift * mag * p.k[kv * p.Dqk + d], 1e-9)
              << ri << " " << d;
      }
}

// round_operand takes P into dV and dS into dQ and dK as the kernels' 16-bit matrix operands
// do: a rounding that doubles doubles every gradient, and one that flushes gives zeros.
TEST(Reference, RoundOperandIsWhatPAndDsBecomeBeforeTheProducts) {
  Problem p;
  std::vector<double> dout(size_t(p.B) * p.Hq * p.Lq * p.Dv);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = std::sin(double(i));
  fa::ReferenceOptions opt;
  const auto exact = fa::reference_attention_backward(p.shape(), p.q.data(), p.k.data(), p.v.data(),
                                                      dout.data(), nullptr, opt);
  opt.round_operand = [](double x) { return 2 * x; };
  const auto twice = fa::reference_attention_backward(p.shape(), p.q.data(), p.k.data(), p.v.data(),
                                                      dout.data(), nullptr, opt);
  opt.round_operand = [](double) { return 0.0; };
  const auto flushed = fa::reference_attention_backward(p.shape(), p.q.data(), p.k.data(), p.v.data(),
                                                        dout.data(), nullptr, opt);
  for (auto [e, t, f] :
       {std::tuple{&exact.dq, &twice.dq, &flushed.dq}, std::tuple{&exact.dk, &twice.dk, &flushed.dk},
        std::tuple{&exact.dv, &twice.dv, &flushed.dv}}) {
    double mag = 0;
    for (size_t i = 0; i < e->size(); ++i) {
      EXPECT_NEAR((*t)[i], 2 * (*e)[i], 1e-12) << i;
      EXPECT_EQ((*f)[i], 0.0) << i;
      mag += std::fabs((*e)[i]);
    }
    EXPECT_GT(mag, 0);  // not vacuous
  }
}

TEST(Reference, GqaMapsQueryHeadsToKvGroups) {
  Problem p;
  // Same problem with K/V repeated per query head (Hkv = Hq) must give the same answer.
  Problem e = p;
  e.Hkv = p.Hq;
  const int group = p.Hq / p.Hkv;
  e.k.assign(size_t(p.B) * p.Hq * p.Lkv * p.Dqk, 0);
  e.v.assign(size_t(p.B) * p.Hq * p.Lkv * p.Dv, 0);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int j = 0; j < p.Lkv; ++j) {
        for (int d = 0; d < p.Dqk; ++d)
          e.k[((size_t(b) * p.Hq + h) * p.Lkv + j) * p.Dqk + d] =
              p.k[((size_t(b) * p.Hkv + h / group) * p.Lkv + j) * p.Dqk + d];
        for (int d = 0; d < p.Dv; ++d)
          e.v[((size_t(b) * p.Hq + h) * p.Lkv + j) * p.Dv + d] =
              p.v[((size_t(b) * p.Hkv + h / group) * p.Lkv + j) * p.Dv + d];
      }
  auto gqa = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data());
  auto mha = fa::reference_attention(e.shape(), e.q.data(), e.k.data(), e.v.data());
  ASSERT_EQ(gqa.out, mha.out);
  ASSERT_EQ(gqa.lse, mha.lse);
  fa::ReferenceShape bad = p.shape();
  bad.heads_kv = 3;
  EXPECT_EQ(error_of([&] { fa::reference_attention(bad, p.q.data(), p.k.data(), p.v.data()); }),
            "reference_attention: heads_q (4) is not a multiple of heads_kv (3)");
}

TEST(Reference, StridedInputsMatchContiguous) {
  Problem p;
  // q stored as [B, Lq, Hq, D] (the common "BSHD" layout).
  std::vector<float> q_bshd(p.q.size());
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.Hq; ++h)
      for (int i = 0; i < p.Lq; ++i)
        for (int d = 0; d < p.Dqk; ++d)
          q_bshd[((size_t(b) * p.Lq + i) * p.Hq + h) * p.Dqk + d] =
              p.q[((size_t(b) * p.Hq + h) * p.Lq + i) * p.Dqk + d];
  fa::ReferenceOptions opt;
  opt.q_strides = std::array<int64_t, 4>{int64_t(p.Lq) * p.Hq * p.Dqk, p.Dqk, int64_t(p.Hq) * p.Dqk, 1};
  auto got = fa::reference_attention(p.shape(), q_bshd.data(), p.k.data(), p.v.data(), opt);
  auto want = fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data());
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.lse, want.lse);
}

TEST(Reference, WrongModKindsAndShapes) {
  Problem p;
  fa::ModProgram causal = compile_mod(kCausal);
  fa::ModProgram softcap = compile_mod(kSoftcap);
  fa::ReferenceOptions opt;
  opt.score_mod = &causal;
  EXPECT_EQ(error_of([&] { fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt); }),
            "reference_attention: score_mod @causal is a mask_mod");
  opt.score_mod = nullptr;
  opt.mask_mod = &softcap;
  EXPECT_EQ(error_of([&] { fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), opt); }),
            "reference_attention: mask_mod @softcap is a score_mod");
  fa::ReferenceShape s = p.shape();
  s.dim_qk = 0;
  EXPECT_EQ(error_of([&] { fa::reference_attention(s, p.q.data(), p.k.data(), p.v.data()); }),
            "reference_attention: dim_qk must be > 0, got 0");
  // An out-of-bounds load inside a mod surfaces as the interpreter's error.
  fa::ModProgram alibi = compile_mod(kAlibi);
  std::vector<float> slopes(2, 0.5f);  // too short for Hq = 4
  fa::Bindings env;
  env.buffer("slopes", fa::HostBuffer::f32(slopes.data(), {2}));
  fa::ReferenceOptions o2;
  o2.score_mod = &alibi;
  o2.bindings = &env;
  EXPECT_EQ(error_of([&] { fa::reference_attention(p.shape(), p.q.data(), p.k.data(), p.v.data(), o2); }),
            "capture 'slopes' index 2 is out of bounds for dimension 0 of size 2");
}

TEST(Reference, EmptyKvGivesMaskedRows) {
  Problem p;
  fa::ReferenceShape s = p.shape();
  s.len_kv = 0;
  auto r = fa::reference_attention(s, p.q.data(), p.k.data(), p.v.data());
  for (double x : r.out) EXPECT_EQ(x, 0.0);
  for (double l : r.lse) EXPECT_EQ(l, -std::numeric_limits<double>::infinity());
}

// ---- block classes -------------------------------------------------------------------------

std::vector<uint8_t> enumerate_blocks(const MaskFn& mask, int B, int H, int Lq, int Lkv, int qb, int kb) {
  int nq = (Lq + qb - 1) / qb, nk = (Lkv + kb - 1) / kb;
  std::vector<uint8_t> out;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < nq; ++i)
        for (int j = 0; j < nk; ++j) {
          int n = 0, kept = 0;
          for (int q = i * qb; q < std::min(Lq, (i + 1) * qb); ++q)
            for (int kv = j * kb; kv < std::min(Lkv, (j + 1) * kb); ++kv, ++n) kept += mask(b, h, q, kv);
          out.push_back(kept == 0 ? 0 : kept == n ? 2 : 1);
        }
  return out;
}

TEST(Reference, BlockClassesCausal) {
  fa::ModProgram causal = compile_mod(kCausal);
  const fa::Bindings env;
  for (auto [Lq, Lkv, qb, kb] : std::vector<std::array<int, 4>>{
           {10, 13, 4, 3}, {16, 16, 4, 4}, {7, 5, 8, 8}, {1, 1, 1, 1}, {9, 30, 2, 7}}) {
    auto got = fa::brute_force_block_classes(causal, env, 2, 3, Lq, Lkv, qb, kb);
    auto want = enumerate_blocks([](int, int, int q, int kv) { return q >= kv; }, 2, 3, Lq, Lkv, qb, kb);
    EXPECT_EQ(got, want) << Lq << " " << Lkv << " " << qb << " " << kb;
  }
  // Square 16 x 16 causal with 4 x 4 tiles: diagonal partial, below full, above empty.
  auto k = fa::brute_force_block_classes(causal, env, 1, 1, 16, 16, 4, 4);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(k[i * 4 + j], i == j ? 1 : i > j ? 2 : 0) << i << j;
  // A tail tile counts only in-range elements: 5 x 5 causal with 4 x 4 tiles, tile (1, 0) holds
  // row 4, cols 0..3, all kept: full; tile (1, 1) holds (4, 4): full.
  auto tail = fa::brute_force_block_classes(causal, env, 1, 1, 5, 5, 4, 4);
  EXPECT_EQ(tail, (std::vector<uint8_t>{1, 0, 2, 2}));
}

TEST(Reference, BlockClassesReadBatchHeadAndBuffers) {
  // Document mask that also drops head 1 entirely: exercises the [B, H, nq, nkv] layout.
  fa::ModProgram doc = compile_mod(
      "fa.mask_mod @doc(%b: i32, %h: i32, %q: i32, %kv: i32)\n"
      "    captures(%ids: !fa.buffer<i32, 2>) -> i1 {\n"
      "  %a = fa.load %ids[%b, %q] : !fa.buffer<i32, 2>\n"
      "  %c = fa.load %ids[%b, %kv] : !fa.buffer<i32, 2>\n"
      "  %same = arith.cmpi eq, %a, %c : i32\n"
      "  %one = arith.constant 1 : i32\n"
      "  %nh = arith.cmpi ne, %h, %one : i32\n"
      "  %r = arith.andi %same, %nh : i1\n"
      "  fa.yield %r : i1\n"
      "}\n");
  const int B = 2, H = 3, L = 11;
  std::vector<int32_t> ids = {0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3};
  fa::Bindings env;
  env.buffer("ids", fa::HostBuffer::i32(ids.data(), {B, L}));
  auto got = fa::brute_force_block_classes(doc, env, B, H, L, L, 4, 3);
  auto want = enumerate_blocks(
      [&](int b, int h, int q, int kv) { return ids[b * L + q] == ids[b * L + kv] && h != 1; }, B, H, L, L, 4,
      3);
  EXPECT_EQ(got, want);
  EXPECT_EQ(error_of([&] { fa::brute_force_block_classes(doc, env, B, H, L, L, 0, 3); }),
            "brute_force_block_classes: block sizes must be > 0, got 0 x 3");
  fa::ModProgram softcap = compile_mod(kSoftcap);
  EXPECT_EQ(error_of([&] { fa::brute_force_block_classes(softcap, env, 1, 1, 4, 4, 2, 2); }),
            "brute_force_block_classes: @softcap is a score_mod, not a mask_mod");
}

}  // namespace
