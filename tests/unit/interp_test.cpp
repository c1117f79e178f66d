// Tests of fa::ModProgram (compiler/include/fajit/detail/interp.h): every allowlisted op against a
// direct C++ computation, all cmp predicates, the UB/poison errors and the binding errors.
#include "fajit/detail/interp.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/error.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

namespace {

// Parses `text` (one fa.score_mod or fa.mask_mod) and compiles it.
fa::ModProgram compile_text(const std::string& text) {
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  mlir::MLIRContext ctx(registry);
  std::string diags;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic& d) {
    diags += d.str() + "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);
  if (!module) throw std::runtime_error("parse failed: " + diags + "\n" + text);
  for (mlir::Operation& op : module->getBody()->getOperations())
    if (llvm::isa<mlir::fa::ScoreModOp, mlir::fa::MaskModOp>(op)) return fa::ModProgram::compile(&op);
  throw std::runtime_error("no mod in:\n" + text);
}

// mask_mod @t: yields (`expr` computed from %q, %kv) == %b. Lets a test read an exact i32.
fa::ModProgram int_binary(const std::string& op) {
  return compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %r = " +
      op +
      " %q, %kv : i32\n"
      "  %e = arith.cmpi eq, %r, %b : i32\n"
      "  fa.yield %e : i1\n"
      "}\n");
}

// score_mod @t: yields `op` applied to (%score, scalar "y").
fa::ModProgram float_binary(const std::string& op) {
  return compile_text(
      "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %y = fa.scalar \"y\" : f32\n"
      "  %r = " +
      op +
      " %score, %y : f32\n"
      "  fa.yield %r : f32\n"
      "}\n");
}

fa::ModProgram float_unary(const std::string& op) {
  return compile_text(
      "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %r = " +
      op +
      " %score : f32\n"
      "  fa.yield %r : f32\n"
      "}\n");
}

bool same_float(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

using fa::test::error_of;

std::vector<int32_t> int_samples(int n, uint32_t seed) {
  std::vector<int32_t> v = {0,  1,       -1,      2,           -2,          3,       -7,         7,   31,  32,
                            33, INT_MAX, INT_MIN, INT_MAX - 1, INT_MIN + 1, 1 << 16, -(1 << 16), 100, -100};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> full(INT_MIN, INT_MAX);
  std::uniform_int_distribution<int32_t> small(-50, 50);
  for (int i = 0; i < n; ++i) v.push_back(i % 2 ? full(rng) : small(rng));
  return v;
}

std::vector<float> float_samples(int n, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          0.5f,
                          -2.5f,
                          3.0f,
                          1e-3f,
                          100.0f,
                          1e30f,
                          -1e30f,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          7.25f,
                          -7.25f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f);
  for (int i = 0; i < n; ++i) v.push_back(u(rng));
  return v;
}

uint32_t U(int32_t x) { return static_cast<uint32_t>(x); }
int32_t S(uint64_t x) { return static_cast<int32_t>(static_cast<uint32_t>(x)); }

// ---- integer binary ops ----------------------------------------------------------------------

struct IntCase {
  const char* op;
  // nullopt: the interpreter must throw (UB / poison).
  std::function<std::optional<int32_t>(int32_t, int32_t)> ref;
  bool shift_amounts = false;  // draw rhs from [0, 40]
};

std::optional<int32_t> ref_div(int32_t a, int32_t b, char mode) {
  if (b == 0 || (a == INT_MIN && b == -1)) return std::nullopt;
  double q = static_cast<double>(a) / static_cast<double>(b);
  if (mode == 'f') return static_cast<int32_t>(std::floor(q));
  if (mode == 'c') return static_cast<int32_t>(std::ceil(q));
  return static_cast<int32_t>(std::trunc(q));
}

const std::vector<IntCase>& int_cases() {
  static const std::vector<IntCase> cases = {
      {"arith.addi", [](int32_t a, int32_t b) { return S(uint64_t(U(a)) + U(b)); }},
      {"arith.subi", [](int32_t a, int32_t b) { return S(uint64_t(U(a)) - U(b)); }},
      {"arith.muli", [](int32_t a, int32_t b) { return S(int64_t(a) * int64_t(b)); }},
      {"arith.divsi", [](int32_t a, int32_t b) { return ref_div(a, b, 't'); }},
      {"arith.floordivsi", [](int32_t a, int32_t b) { return ref_div(a, b, 'f'); }},
      {"arith.ceildivsi", [](int32_t a, int32_t b) { return ref_div(a, b, 'c'); }},
      {"arith.remsi",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         auto q = ref_div(a, b, 't');
         if (!q) return std::nullopt;
         return S(int64_t(a) - int64_t(*q) * b);
       }},
      {"arith.divui",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         if (b == 0) return std::nullopt;
         return S(U(a) / U(b));
       }},
      {"arith.remui",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         if (b == 0) return std::nullopt;
         return S(U(a) % U(b));
       }},
      {"arith.maxsi", [](int32_t a, int32_t b) { return std::max(a, b); }},
      {"arith.minsi", [](int32_t a, int32_t b) { return std::min(a, b); }},
      {"arith.maxui", [](int32_t a, int32_t b) { return S(std::max(U(a), U(b))); }},
      {"arith.minui", [](int32_t a, int32_t b) { return S(std::min(U(a), U(b))); }},
      {"arith.andi", [](int32_t a, int32_t b) { return a & b; }},
      {"arith.ori", [](int32_t a, int32_t b) { return a | b; }},
      {"arith.xori", [](int32_t a, int32_t b) { return a ^ b; }},
      {"arith.shli",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         if (U(b) >= 32) return std::nullopt;
         return S(uint64_t(U(a)) * (uint64_t{1} << b));
       },
       true},
      {"arith.shrui",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         if (U(b) >= 32) return std::nullopt;
         return S(U(a) / (uint64_t{1} << b));
       },
       true},
      {"arith.shrsi",
       [](int32_t a, int32_t b) -> std::optional<int32_t> {
         if (U(b) >= 32) return std::nullopt;
         return static_cast<int32_t>(std::floor(double(a) / double(uint64_t{1} << b)));
       },
       true},
  };
  return cases;
}

TEST(Interp, IntegerBinaryOpsMatchCpp) {
  const fa::Bindings env;
  const std::vector<int32_t> xs = int_samples(60, 1);
  for (const IntCase& c : int_cases()) {
    fa::ModProgram p = int_binary(c.op);
    fa::BoundMod m = p.bind(env);
    std::vector<int32_t> ys = c.shift_amounts
                                  ? std::vector<int32_t>{0, 1, 5, 16, 30, 31, 32, 33, 40, -1, INT_MIN}
                                  : int_samples(60, 2);
    int checked = 0, thrown = 0;
    for (int32_t a : xs)
      for (int32_t b : ys) {
        std::optional<int32_t> want = c.ref(a, b);
        if (!want) {
          EXPECT_THROW(m.mask(0, 0, a, b), fa::Error) << c.op << " " << a << ", " << b;
          ++thrown;
          continue;
        }
        EXPECT_TRUE(m.mask(*want, 0, a, b)) << c.op << "(" << a << ", " << b << ") != " << *want;
        EXPECT_FALSE(m.mask(*want ^ 1, 0, a, b)) << c.op << "(" << a << ", " << b << ")";
        ++checked;
      }
    EXPECT_GT(checked, 100) << c.op;
    (void)thrown;
  }
}

TEST(Interp, IntegerDivisionErrors) {
  const fa::Bindings env;
  for (const char* op :
       {"arith.divsi", "arith.divui", "arith.remsi", "arith.remui", "arith.floordivsi", "arith.ceildivsi"}) {
    fa::ModProgram p = int_binary(op);
    EXPECT_EQ(error_of([&] { p.eval_mask(0, 0, 5, 0, env); }), std::string("division by zero in ") + op);
  }
  for (const char* op : {"arith.divsi", "arith.remsi", "arith.floordivsi", "arith.ceildivsi"}) {
    fa::ModProgram p = int_binary(op);
    EXPECT_EQ(error_of([&] { p.eval_mask(0, 0, INT_MIN, -1, env); }),
              std::string("signed division overflow (-2147483648 / -1) in ") + op);
  }
  // Unsigned division of the same bits is fine: 0x80000000 / 0xffffffff == 0.
  EXPECT_TRUE(int_binary("arith.divui").eval_mask(0, 0, INT_MIN, -1, env));
}

TEST(Interp, ShiftOutOfRangeIsAnError) {
  const fa::Bindings env;
  EXPECT_EQ(error_of([&] { int_binary("arith.shli").eval_mask(0, 0, 1, 32, env); }),
            "shift amount 32 is out of range for i32 in arith.shli");
  EXPECT_EQ(error_of([&] { int_binary("arith.shrsi").eval_mask(0, 0, 1, -1, env); }),
            "shift amount 4294967295 is out of range for i32 in arith.shrsi");
  EXPECT_EQ(error_of([&] { int_binary("arith.shrui").eval_mask(0, 0, 1, 99, env); }),
            "shift amount 99 is out of range for i32 in arith.shrui");
  EXPECT_TRUE(int_binary("arith.shli").eval_mask(INT_MIN, 0, 1, 31, env));
}

TEST(Interp, AllCmpIPredicates) {
  const fa::Bindings env;
  struct P {
    const char* name;
    std::function<bool(int32_t, int32_t)> ref;
  };
  const std::vector<P> preds = {
      {"eq", [](int32_t a, int32_t b) { return a == b; }},
      {"ne", [](int32_t a, int32_t b) { return a != b; }},
      {"slt", [](int32_t a, int32_t b) { return a < b; }},
      {"sle", [](int32_t a, int32_t b) { return a <= b; }},
      {"sgt", [](int32_t a, int32_t b) { return a > b; }},
      {"sge", [](int32_t a, int32_t b) { return a >= b; }},
      {"ult", [](int32_t a, int32_t b) { return U(a) < U(b); }},
      {"ule", [](int32_t a, int32_t b) { return U(a) <= U(b); }},
      {"ugt", [](int32_t a, int32_t b) { return U(a) > U(b); }},
      {"uge", [](int32_t a, int32_t b) { return U(a) >= U(b); }},
  };
  std::vector<int32_t> xs = int_samples(30, 3);
  for (const P& p : preds) {
    fa::ModProgram prog =
        compile_text(std::string("fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                                 "  %c = arith.cmpi ") +
                     p.name +
                     ", %q, %kv : i32\n"
                     "  fa.yield %c : i1\n}\n");
    fa::BoundMod m = prog.bind(env);
    for (int32_t a : xs)
      for (int32_t b : xs) EXPECT_EQ(m.mask(0, 0, a, b), p.ref(a, b)) << p.name << " " << a << " " << b;
    for (int32_t a : xs) EXPECT_EQ(m.mask(0, 0, a, a), p.ref(a, a)) << p.name;
  }
}

// cmpi on i1 reads true as -1 when signed.
TEST(Interp, CmpIOnI1) {
  const fa::Bindings env;
  auto prog = [&](const char* pred) {
    return compile_text(std::string("fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                                    "  %z = arith.constant 0 : i32\n"
                                    "  %x = arith.cmpi ne, %q, %z : i32\n"
                                    "  %y = arith.cmpi ne, %kv, %z : i32\n"
                                    "  %c = arith.cmpi ") +
                        pred + ", %x, %y : i1\n  fa.yield %c : i1\n}\n");
  };
  // x = true, y = false: signed -1 < 0, unsigned 1 > 0.
  EXPECT_TRUE(prog("slt").eval_mask(0, 0, 1, 0, env));
  EXPECT_FALSE(prog("sgt").eval_mask(0, 0, 1, 0, env));
  EXPECT_TRUE(prog("ugt").eval_mask(0, 0, 1, 0, env));
  EXPECT_FALSE(prog("ult").eval_mask(0, 0, 1, 0, env));
  EXPECT_TRUE(prog("eq").eval_mask(0, 0, 5, 7, env));
  EXPECT_TRUE(prog("ne").eval_mask(0, 0, 0, 7, env));
}

// i1 logic, arithmetic mod 2, select, ext/trunc.
TEST(Interp, I1OpsAndCasts) {
  const fa::Bindings env;
  auto bin = [&](const char* op) {
    return compile_text(std::string("fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                                    "  %z = arith.constant 0 : i32\n"
                                    "  %x = arith.cmpi ne, %q, %z : i32\n"
                                    "  %y = arith.cmpi ne, %kv, %z : i32\n"
                                    "  %c = ") +
                        op + " %x, %y : i1\n  fa.yield %c : i1\n}\n");
  };
  struct C {
    const char* op;
    std::function<bool(bool, bool)> ref;
  };
  for (const C& c : std::vector<C>{
           {"arith.andi", [](bool x, bool y) { return x && y; }},
           {"arith.ori", [](bool x, bool y) { return x || y; }},
           {"arith.xori", [](bool x, bool y) { return x != y; }},
           {"arith.addi", [](bool x, bool y) { return x != y; }},
           {"arith.subi", [](bool x, bool y) { return x != y; }},
           {"arith.muli", [](bool x, bool y) { return x && y; }},
           {"arith.maxui", [](bool x, bool y) { return x || y; }},
           {"arith.minui", [](bool x, bool y) { return x && y; }},
           {"arith.maxsi", [](bool x, bool y) { return x && y; }},  // true is -1
           {"arith.minsi", [](bool x, bool y) { return x || y; }},
       }) {
    fa::ModProgram p = bin(c.op);
    for (int x = 0; x < 2; ++x)
      for (int y = 0; y < 2; ++y) EXPECT_EQ(p.eval_mask(0, 0, x, y, env), c.ref(x, y)) << c.op << x << y;
  }
  // extui / extsi / trunci / select: r = select(q != 0, extsi(c), extui(c)) + trunci(kv) checks.
  fa::ModProgram ext = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %z = arith.constant 0 : i32\n"
      "  %c = arith.cmpi ne, %kv, %z : i32\n"
      "  %u = arith.extui %c : i1 to i32\n"
      "  %s = arith.extsi %c : i1 to i32\n"
      "  %p = arith.cmpi ne, %q, %z : i32\n"
      "  %r = arith.select %p, %s, %u : i32\n"
      "  %e = arith.cmpi eq, %r, %b : i32\n"
      "  fa.yield %e : i1\n}\n");
  EXPECT_TRUE(ext.eval_mask(-1, 0, 1, 5, env));
  EXPECT_TRUE(ext.eval_mask(1, 0, 0, 5, env));
  EXPECT_TRUE(ext.eval_mask(0, 0, 1, 0, env));
  EXPECT_TRUE(ext.eval_mask(0, 0, 0, 0, env));
  fa::ModProgram tr = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %t = arith.trunci %q : i32 to i1\n"
      "  fa.yield %t : i1\n}\n");
  for (int32_t x : int_samples(40, 4)) EXPECT_EQ(tr.eval_mask(0, 0, x, 0, env), (U(x) & 1u) != 0) << x;
  // i1 -> f32: sitofp(true) = -1, uitofp(true) = 1.
  fa::ModProgram itof = compile_text(
      "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
      "  %z = arith.constant 0 : i32\n"
      "  %c = arith.cmpi ne, %q, %z : i32\n"
      "  %s = arith.sitofp %c : i1 to f32\n"
      "  %u = arith.uitofp %c : i1 to f32\n"
      "  %ten = arith.constant 10.0 : f32\n"
      "  %m = arith.mulf %s, %ten : f32\n"
      "  %r = arith.addf %m, %u : f32\n"
      "  fa.yield %r : f32\n}\n");
  EXPECT_EQ(itof.eval_score(0, 0, 0, 1, 0, env), -9.0f);
  EXPECT_EQ(itof.eval_score(0, 0, 0, 0, 0, env), 0.0f);
}

TEST(Interp, AbsIAndConstants) {
  const fa::Bindings env;
  fa::ModProgram p = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %a = math.absi %q : i32\n"
      "  %e = arith.cmpi eq, %a, %b : i32\n"
      "  fa.yield %e : i1\n}\n");
  for (int32_t x : int_samples(40, 5)) {
    int32_t want = x == INT_MIN ? INT_MIN : (x < 0 ? -x : x);
    EXPECT_TRUE(p.eval_mask(want, 0, x, 0, env)) << x;
  }
  fa::ModProgram c = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %m = arith.constant -2147483648 : i32\n"
      "  %n = arith.constant -5 : i32\n"
      "  %s = arith.addi %m, %n : i32\n"
      "  %t = arith.constant true\n"
      "  %e = arith.cmpi eq, %s, %b : i32\n"
      "  %r = arith.andi %e, %t : i1\n"
      "  fa.yield %r : i1\n}\n");
  EXPECT_TRUE(c.eval_mask(INT_MAX - 4, 0, 0, 0, env));
}

// ---- floats --------------------------------------------------------------------------------

float ref_maximum(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  if (a == 0 && b == 0) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
float ref_minimum(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  if (a == 0 && b == 0) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

TEST(Interp, FloatBinaryOpsMatchCpp) {
  struct C {
    const char* op;
    std::function<float(float, float)> ref;
  };
  const std::vector<C> cases = {
      {"arith.addf", [](float a, float b) { return a + b; }},
      {"arith.subf", [](float a, float b) { return a - b; }},
      {"arith.mulf", [](float a, float b) { return a * b; }},
      {"arith.divf", [](float a, float b) { return a / b; }},
      {"arith.remf", [](float a, float b) { return fmodf(a, b); }},
      {"arith.maximumf", ref_maximum},
      {"arith.minimumf", ref_minimum},
      {"arith.maxnumf",
       [](float a, float b) { return std::isnan(a)   ? b
                                     : std::isnan(b) ? a
                                                     : ref_maximum(a, b); }},
      {"arith.minnumf",
       [](float a, float b) { return std::isnan(a)   ? b
                                     : std::isnan(b) ? a
                                                     : ref_minimum(a, b); }},
      {"math.powf", [](float a, float b) { return powf(a, b); }},
  };
  const std::vector<float> xs = float_samples(25, 6), ys = float_samples(25, 7);
  for (const C& c : cases) {
    fa::ModProgram p = float_binary(c.op);
    for (float y : ys) {
      fa::Bindings env;
      env.scalar_f32("y", y);
      fa::BoundMod m = p.bind(env);
      for (float x : xs) {
        float got = m.score(x, 0, 0, 0, 0), want = c.ref(x, y);
        EXPECT_TRUE(same_float(got, want))
            << c.op << "(" << x << ", " << y << ") = " << got << ", want " << want;
      }
    }
  }
  // NaN behaviour spelled out.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  fa::Bindings env;
  env.scalar_f32("y", nan);
  EXPECT_TRUE(std::isnan(float_binary("arith.maximumf").eval_score(1.0f, 0, 0, 0, 0, env)));
  EXPECT_EQ(float_binary("arith.maxnumf").eval_score(1.0f, 0, 0, 0, 0, env), 1.0f);
  env.scalar_f32("y", -0.0f);
  EXPECT_FALSE(std::signbit(float_binary("arith.maximumf").eval_score(0.0f, 0, 0, 0, 0, env)));
  EXPECT_TRUE(std::signbit(float_binary("arith.minnumf").eval_score(0.0f, 0, 0, 0, 0, env)));
}

TEST(Interp, FloatUnaryOpsMatchCpp) {
  struct C {
    const char* op;
    std::function<float(float)> ref;
  };
  const std::vector<C> cases = {
      {"arith.negf", [](float a) { return -a; }},
      {"math.exp", [](float a) { return expf(a); }},
      {"math.exp2", [](float a) { return exp2f(a); }},
      {"math.log", [](float a) { return logf(a); }},
      {"math.log2", [](float a) { return log2f(a); }},
      {"math.tanh", [](float a) { return tanhf(a); }},
      {"math.sqrt", [](float a) { return sqrtf(a); }},
      {"math.rsqrt", [](float a) { return 1.0f / sqrtf(a); }},
      {"math.absf", [](float a) { return fabsf(a); }},
      {"math.sin", [](float a) { return sinf(a); }},
      {"math.cos", [](float a) { return cosf(a); }},
      {"math.floor", [](float a) { return floorf(a); }},
      {"math.ceil", [](float a) { return ceilf(a); }},
      {"math.erf", [](float a) { return erff(a); }},
  };
  const fa::Bindings env;
  for (const C& c : cases) {
    fa::BoundMod m = float_unary(c.op).bind(env);
    for (float x : float_samples(50, 8)) {
      float got = m.score(x, 0, 0, 0, 0), want = c.ref(x);
      EXPECT_TRUE(same_float(got, want)) << c.op << "(" << x << ") = " << got << ", want " << want;
    }
  }
}

TEST(Interp, AllCmpFPredicates) {
  struct P {
    const char* name;
    std::function<bool(float, float)> ref;
  };
  auto uno = [](float a, float b) { return std::isnan(a) || std::isnan(b); };
  const std::vector<P> preds = {
      {"false", [](float, float) { return false; }},
      {"oeq", [=](float a, float b) { return !uno(a, b) && a == b; }},
      {"ogt", [=](float a, float b) { return !uno(a, b) && a > b; }},
      {"oge", [=](float a, float b) { return !uno(a, b) && a >= b; }},
      {"olt", [=](float a, float b) { return !uno(a, b) && a < b; }},
      {"ole", [=](float a, float b) { return !uno(a, b) && a <= b; }},
      {"one", [=](float a, float b) { return !uno(a, b) && a != b; }},
      {"ord", [=](float a, float b) { return !uno(a, b); }},
      {"ueq", [=](float a, float b) { return uno(a, b) || a == b; }},
      {"ugt", [=](float a, float b) { return uno(a, b) || a > b; }},
      {"uge", [=](float a, float b) { return uno(a, b) || a >= b; }},
      {"ult", [=](float a, float b) { return uno(a, b) || a < b; }},
      {"ule", [=](float a, float b) { return uno(a, b) || a <= b; }},
      {"une", [=](float a, float b) { return uno(a, b) || a != b; }},
      {"uno", [=](float a, float b) { return uno(a, b); }},
      {"true", [](float, float) { return true; }},
  };
  // score_mod yielding select(cmpf(score, y), 1, 0).
  const std::vector<float> xs = float_samples(12, 9);
  for (const P& p : preds) {
    fa::ModProgram prog = compile_text(
        std::string("fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
                    "  %y = fa.scalar \"y\" : f32\n"
                    "  %c = arith.cmpf ") +
        p.name +
        ", %score, %y : f32\n"
        "  %one = arith.constant 1.0 : f32\n"
        "  %zero = arith.constant 0.0 : f32\n"
        "  %r = arith.select %c, %one, %zero : f32\n"
        "  fa.yield %r : f32\n}\n");
    for (float y : xs) {
      fa::Bindings env;
      env.scalar_f32("y", y);
      fa::BoundMod m = prog.bind(env);
      for (float x : xs)
        EXPECT_EQ(m.score(x, 0, 0, 0, 0), p.ref(x, y) ? 1.0f : 0.0f) << p.name << " " << x << " " << y;
    }
  }
}

TEST(Interp, FloatIntConversions) {
  const fa::Bindings env;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // sitofp / uitofp: round to nearest even, like static_cast.
  fa::BoundMod si = compile_text(
                        "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
                        "  %r = arith.sitofp %q : i32 to f32\n  fa.yield %r : f32\n}\n")
                        .bind(env);
  fa::BoundMod ui = compile_text(
                        "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {\n"
                        "  %r = arith.uitofp %q : i32 to f32\n  fa.yield %r : f32\n}\n")
                        .bind(env);
  for (int32_t x : int_samples(60, 10)) {
    EXPECT_EQ(si.score(0, 0, 0, x, 0), static_cast<float>(x)) << x;
    EXPECT_EQ(ui.score(0, 0, 0, x, 0), static_cast<float>(U(x))) << x;
  }
  EXPECT_EQ(si.score(0, 0, 0, 16777217, 0), 16777216.0f);  // ties to even
  // fptosi / fptoui: truncate, saturate, NaN -> 0 (cvt.rzi).
  fa::ModProgram fs = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %f = fa.scalar \"f\" : f32\n"
      "  %r = arith.fptosi %f : f32 to i32\n"
      "  %e = arith.cmpi eq, %r, %b : i32\n  fa.yield %e : i1\n}\n");
  fa::ModProgram fu = compile_text(
      "fa.mask_mod @t(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
      "  %f = fa.scalar \"f\" : f32\n"
      "  %r = arith.fptoui %f : f32 to i32\n"
      "  %e = arith.cmpi eq, %r, %b : i32\n  fa.yield %e : i1\n}\n");
  struct C {
    float f;
    int32_t s;
    uint32_t u;
  };
  for (const C& c : std::vector<C>{{0.0f, 0, 0},
                                   {-0.0f, 0, 0},
                                   {1.9f, 1, 1},
                                   {-1.9f, -1, 0},
                                   {-0.5f, 0, 0},
                                   {123456.75f, 123456, 123456},
                                   {2147483520.0f, 2147483520, 2147483520u},
                                   {2147483648.0f, INT_MAX, 2147483648u},
                                   {3e9f, INT_MAX, 3000000000u},
                                   {4294967040.0f, INT_MAX, 4294967040u},
                                   {5e9f, INT_MAX, UINT_MAX},
                                   {-2147483648.0f, INT_MIN, 0},
                                   {-3e9f, INT_MIN, 0},
                                   {inf, INT_MAX, UINT_MAX},
                                   {-inf, INT_MIN, 0},
                                   {nan, 0, 0}}) {
    fa::Bindings e;
    e.scalar_f32("f", c.f);
    EXPECT_TRUE(fs.eval_mask(c.s, 0, 0, 0, e)) << "fptosi " << c.f;
    EXPECT_TRUE(fu.eval_mask(static_cast<int32_t>(c.u), 0, 0, 0, e)) << "fptoui " << c.f;
  }
}

// ---- fa.load, fa.scalar, bindings ----------------------------------------------------------

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

TEST(Interp, AlibiLoad) {
  fa::ModProgram p = compile_text(kAlibi);
  EXPECT_EQ(p.kind(), fa::ModKind::kScore);
  EXPECT_EQ(p.name(), "alibi");
  ASSERT_EQ(p.captures().size(), 1u);
  EXPECT_EQ(p.captures()[0].name, "slopes");
  EXPECT_EQ(p.captures()[0].dtype, fa::ScalarType::kF32);
  EXPECT_EQ(p.captures()[0].rank, 1);
  EXPECT_TRUE(p.scalars().empty());
  std::vector<float> slopes(16);
  for (int i = 0; i < 16; ++i) slopes[i] = std::exp2(-0.5f * (i + 1));
  fa::Bindings env;
  env.buffer("slopes", fa::HostBuffer::f32(slopes.data(), {16}));
  fa::BoundMod m = p.bind(env);
  for (int h = 0; h < 16; ++h)
    for (int q = 0; q < 5; ++q)
      for (int kv = 0; kv < 7; ++kv) {
        float want = 0.25f + static_cast<float>(kv - q) * slopes[h];
        EXPECT_EQ(m.score(0.25f, 1, h, q, kv), want);
      }
  EXPECT_EQ(error_of([&] { m.score(0, 0, 16, 0, 0); }),
            "capture 'slopes' index 16 is out of bounds for dimension 0 of size 16");
  EXPECT_EQ(error_of([&] { m.score(0, 0, -1, 0, 0); }),
            "capture 'slopes' index -1 is out of bounds for dimension 0 of size 16");
}

TEST(Interp, Rank4StridedAndI32Loads) {
  // bias[b][h][q][kv] stored as a transposed view (kv outermost) plus an i32 doc-id buffer.
  fa::ModProgram p = compile_text(
      "fa.score_mod @t(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)\n"
      "    captures(%bias: !fa.buffer<f32, 4>, %doc: !fa.buffer<i32, 2>) -> f32 {\n"
      "  %x = fa.load %bias[%b, %h, %q, %kv] : !fa.buffer<f32, 4>\n"
      "  %dq = fa.load %doc[%b, %q] : !fa.buffer<i32, 2>\n"
      "  %dk = fa.load %doc[%b, %kv] : !fa.buffer<i32, 2>\n"
      "  %same = arith.cmpi eq, %dq, %dk : i32\n"
      "  %ninf = arith.constant 0xFF800000 : f32\n"
      "  %s = arith.addf %score, %x : f32\n"
      "  %r = arith.select %same, %s, %ninf : f32\n"
      "  fa.yield %r : f32\n"
      "}\n");
  ASSERT_EQ(p.captures().size(), 2u);
  EXPECT_EQ(p.captures()[1].dtype, fa::ScalarType::kI32);
  EXPECT_EQ(p.captures()[1].rank, 2);
  const int B = 2, H = 3, Q = 4, K = 5;
  std::vector<float> storage(B * H * Q * K);  // physical [K][Q][H][B]
  auto at = [&](int b, int h, int q, int k) -> float& { return storage[((k * Q + q) * H + h) * B + b]; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int q = 0; q < Q; ++q)
        for (int k = 0; k < K; ++k) at(b, h, q, k) = 1000.0f * b + 100.0f * h + 10.0f * q + k;
  std::vector<int32_t> doc = {0, 0, 1, 1, 1, 7, 7, 7, 8, 8};  // [B][5]
  fa::Bindings env;
  env.buffer("bias", fa::HostBuffer::f32(storage.data(), {B, H, Q, K}, {1, B, B * H, B * H * Q}));
  env.buffer("doc", fa::HostBuffer::i32(doc.data(), {B, 5}));
  fa::BoundMod m = p.bind(env);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int q = 0; q < Q; ++q)
        for (int k = 0; k < K; ++k) {
          float got = m.score(0.5f, b, h, q, k);
          if (doc[b * 5 + q] == doc[b * 5 + k])
            EXPECT_EQ(got, 0.5f + at(b, h, q, k));
          else
            EXPECT_EQ(got, -std::numeric_limits<float>::infinity());
        }
  EXPECT_EQ(error_of([&] { m.score(0, 0, 0, 4, 0); }),
            "capture 'bias' index 4 is out of bounds for dimension 2 of size 4");
  EXPECT_EQ(error_of([&] { m.score(0, 2, 0, 0, 0); }),
            "capture 'bias' index 2 is out of bounds for dimension 0 of size 2");
}

const char* kSoftcapWindow =
    "fa.mask_mod @win(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
    "  %w = fa.scalar \"window\" : i32\n"
    "  %d = arith.subi %q, %kv : i32\n"
    "  %c = arith.cmpi sle, %d, %w : i32\n"
    "  %w2 = fa.scalar \"window\" : i32\n"
    "  %z = arith.constant 0 : i32\n"
    "  %c2 = arith.cmpi sge, %d, %z : i32\n"
    "  %r = arith.andi %c, %c2 : i1\n"
    "  fa.yield %r : i1\n"
    "}\n";

TEST(Interp, ScalarsAreNamedAndDeduplicated) {
  fa::ModProgram p = compile_text(kSoftcapWindow);
  EXPECT_EQ(p.kind(), fa::ModKind::kMask);
  ASSERT_EQ(p.scalars().size(), 1u);
  EXPECT_EQ(p.scalars()[0].name, "window");
  EXPECT_EQ(p.scalars()[0].type, fa::ScalarType::kI32);
  fa::Bindings env;
  env.scalar_i32("window", 3);
  fa::BoundMod m = p.bind(env);
  for (int q = 0; q < 10; ++q)
    for (int kv = 0; kv < 10; ++kv) EXPECT_EQ(m.mask(0, 0, q, kv), q - kv >= 0 && q - kv <= 3);
}

TEST(Interp, BindingErrors) {
  fa::ModProgram alibi = compile_text(kAlibi);
  std::vector<float> f(16);
  std::vector<int32_t> i(16);
  {
    fa::Bindings env;
    EXPECT_EQ(error_of([&] { alibi.bind(env); }), "missing capture 'slopes' (a f32 buffer of rank 1)");
  }
  {
    fa::Bindings env;
    env.buffer("slopes", fa::HostBuffer::i32(i.data(), {16}));
    EXPECT_EQ(error_of([&] { alibi.bind(env); }), "capture 'slopes' must be a f32 buffer, got i32");
  }
  {
    fa::Bindings env;
    env.buffer("slopes", fa::HostBuffer::f32(f.data(), {4, 4}));
    EXPECT_EQ(error_of([&] { alibi.bind(env); }), "capture 'slopes' must have rank 1, got 2");
  }
  {
    fa::Bindings env;
    env.buffer("slopes", fa::HostBuffer::f32(f.data(), {16}, {1, 1}));
    EXPECT_EQ(error_of([&] { alibi.bind(env); }), "capture 'slopes' has 2 strides for 1 dimensions");
  }
  fa::ModProgram win = compile_text(kSoftcapWindow);
  {
    fa::Bindings env;
    EXPECT_EQ(error_of([&] { win.eval_mask(0, 0, 0, 0, env); }), "missing scalar 'window' (i32)");
  }
  {
    fa::Bindings env;
    env.scalar_f32("window", 3.0f);
    EXPECT_EQ(error_of([&] { win.bind(env); }), "scalar 'window' must be i32, got f32");
  }
  // Wrong kind of evaluation.
  fa::Bindings env;
  env.scalar_i32("window", 3);
  EXPECT_EQ(error_of([&] { win.eval_score(0, 0, 0, 0, 0, env); }), "@win is a mask_mod, not a score_mod");
}

TEST(Interp, CompileRejectsNonMods) {
  mlir::DialectRegistry registry;
  mlir::fa::registerFADialects(registry);
  mlir::MLIRContext ctx(registry);
  auto module = mlir::parseSourceString<mlir::ModuleOp>("module {}", &ctx);
  ASSERT_TRUE(module);
  EXPECT_EQ(error_of([&] { fa::ModProgram::compile(module->getOperation()); }),
            "ModProgram::compile: expected an fa.score_mod, fa.mask_mod or fa.score_grad, got 'builtin.module'");
  EXPECT_EQ(error_of([&] { fa::ModProgram::compile(nullptr); }), "ModProgram::compile: null operation");
}

TEST(Interp, ProgramOutlivesContextAndIsFlat) {
  fa::ModProgram p = compile_text(kAlibi);  // the MLIRContext is gone by now
  EXPECT_EQ(p.num_instructions(), 5u);      // subi, sitofp, load, mulf, addf
  std::vector<float> slopes(4, 2.0f);
  fa::Bindings env;
  env.buffer("slopes", fa::HostBuffer::f32(slopes.data(), {4}));
  EXPECT_EQ(p.eval_score(1.0f, 0, 3, 2, 5, env), 7.0f);
}

}  // namespace
