// Tests of the body-op table (dialect/include/fajit/Dialect/FA/BodyOps.def): for every entry,
// a one-op score_mod and mask_mod that the verifier accepts, the interpreter evaluates, the
// interval analysis evaluates exactly on points (or knowingly models as "anything"), codegen
// lowers and fa-differentiate differentiates. An op added to the table fails here until every evaluator
// handles it.
#include "fajit/Dialect/FA/BodyOps.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include <fmt/format.h>

#include "fa_test_util.h"
#include "fajit/Dialect/FA/FAOps.h"
#include "fajit/analysis/range_program.h"
#include "fajit/detail/codegen.h"
#include "fajit/detail/interp.h"
#include "fajit/detail/mask_analysis.h"
#include "fajit/detail/program_impl.h"
#include "fajit/error.h"

namespace {

using fa::test::error_of;
using mlir::fa::BodyOp;
using mlir::fa::BodyOpKind;

const std::string kNoError = "<no fa::Error>";

// Operand values: x0 = 7, x1 = 3 (i32), f0 = 0.75, f1 = 0.5 (f32), c = (x1 < x0) = true (i1),
// buf[x1] (a rank-1 f32 capture): every op is defined on them.
constexpr int32_t kX0 = 7, kX1 = 3;
constexpr float kF0 = 0.75f, kF1 = 0.5f;
const float kBuf[8] = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f};

struct Signature {
  const char* operands;  // SSA names
  const char* types;     // their types
  const char* result;    // result type
  const char* props;     // inherent attributes in generic form
};

Signature signature_of(BodyOpKind kind) {
  switch (kind) {
    case BodyOpKind::IntBinary: return {"%x0, %x1", "i32, i32", "i32", ""};
    case BodyOpKind::IntUnary: return {"%x0", "i32", "i32", ""};
    case BodyOpKind::IntCompare: return {"%x0, %x1", "i32, i32", "i1", " <{predicate = 2 : i64}>"};  // slt
    case BodyOpKind::FloatBinary: return {"%f0, %f1", "f32, f32", "f32", ""};
    case BodyOpKind::FloatUnary: return {"%f0", "f32", "f32", ""};
    case BodyOpKind::FloatCompare: return {"%f0, %f1", "f32, f32", "i1", " <{predicate = 4 : i64}>"};  // olt
    case BodyOpKind::IntToFloat: return {"%x0", "i32", "f32", ""};
    case BodyOpKind::FloatToInt: return {"%f0", "f32", "i32", ""};
    case BodyOpKind::IntExtend: return {"%c", "i1", "i32", ""};
    case BodyOpKind::IntTruncate: return {"%x0", "i32", "i1", ""};
    case BodyOpKind::Select: return {"%c, %x0, %x1", "i1, i32, i32", "i32", ""};
    case BodyOpKind::Load: return {"%buf, %x1", "!fa.buffer<f32, 1>, i32", "f32", ""};
  }
  return {"", "", "", ""};
}

// The op in generic form, with the operands it reads.
std::string op_body(BodyOp op) {
  Signature s = signature_of(mlir::fa::getBodyOpKind(op));
  return fmt::format(
      "  %x0 = fa.scalar \"x0\" : i32\n  %x1 = fa.scalar \"x1\" : i32\n"
      "  %f0 = fa.scalar \"f0\" : f32\n  %f1 = fa.scalar \"f1\" : f32\n"
      "  %c = arith.cmpi slt, %x1, %x0 : i32\n"
      "  %r = \"{}\"({}){} : ({}) -> {}\n",
      mlir::fa::getBodyOpName(op).str(), s.operands, s.props, s.types, s.result);
}

// score_mod: the op's value as f32. mask_mod: the op's value when it is an i1, else whether it
// equals the scalar "y" (i32) / "yf" (f32).
std::string module_of(BodyOp op) {
  const std::string result = signature_of(mlir::fa::getBodyOpKind(op)).result;
  const std::string to_f32 = result == "f32"   ? "  %s = arith.addf %r, %score : f32\n"
                             : result == "i32" ? "  %s0 = arith.sitofp %r : i32 to f32\n"
                                                 "  %s = arith.addf %s0, %score : f32\n"
                                               : "  %s0 = arith.uitofp %r : i1 to f32\n"
                                                 "  %s = arith.addf %s0, %score : f32\n";
  const std::string to_i1 = result == "f32"   ? "  %y = fa.scalar \"yf\" : f32\n"
                                                "  %m = arith.cmpf oeq, %r, %y : f32\n"
                            : result == "i32" ? "  %y = fa.scalar \"y\" : i32\n"
                                                "  %m = arith.cmpi eq, %r, %y : i32\n"
                                              : "";
  const char* yielded = result == "i1" ? "%r" : "%m";
  const char* captures = " captures(%buf: !fa.buffer<f32, 1>)";
  return "fa.score_mod @s(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32)" + std::string(captures) +
         " -> f32 {\n" + op_body(op) + to_f32 + "  fa.yield %s : f32\n}\n" +
         "fa.mask_mod @m(%b: i32, %h: i32, %q: i32, %kv: i32)" + captures + " -> i1 {\n" + op_body(op) +
         to_i1 + "  fa.yield " + yielded + " : i1\n}\n";
}

// Whether `mod` still holds `op` after the program's canonicalization.
bool holds(mlir::Operation* mod, BodyOp op) {
  bool found = false;
  mod->walk([&](mlir::Operation* o) { found |= mlir::fa::getBodyOp(o) == op; });
  return found;
}

TEST(BodyOps, NamesAndKindsComeFromTheTable) {
  EXPECT_EQ(mlir::fa::getBodyOpName(BodyOp::AddI), "arith.addi");
  EXPECT_EQ(mlir::fa::getBodyOpName(BodyOp::Erf), "math.erf");
  EXPECT_EQ(mlir::fa::getBodyOpName(BodyOp::Load), "fa.load");
  EXPECT_EQ(mlir::fa::getBodyOpKind(BodyOp::CmpF), BodyOpKind::FloatCompare);
  EXPECT_EQ(mlir::fa::getBodyOpArity(BodyOpKind::Select), 3u);
}

// `op` through the verifier, the interpreter, the interval analysis and codegen.
void check_op(BodyOp op) {
  const std::string name = mlir::fa::getBodyOpName(op).str();
  const std::string text = module_of(op);
  SCOPED_TRACE(name + "\n" + text);

  // Verifier (and the program's canonicalization, which must leave the op in place).
  std::optional<fa::Program> p;
  ASSERT_EQ(error_of([&] { p = fa::Program::parse(text, name); }), kNoError);
  ASSERT_TRUE(holds(p->impl().score.getOperation(), op) && holds(p->impl().mask.getOperation(), op))
      << "canonicalization removed the op; change its operands here\n"
      << p->to_mlir();

  // Interpreter: the op's value, then the mask that compares against it.
  fa::Bindings env;
  env.scalar_i32("x0", kX0).scalar_i32("x1", kX1).scalar_f32("f0", kF0).scalar_f32("f1", kF1);
  env.buffer("buf", fa::HostBuffer::f32(kBuf, {8}));
  float value = 0;
  ASSERT_EQ(error_of([&] { value = fa::ModProgram::score_of(*p).eval_score(0.0f, 0, 0, 0, 0, env); }),
            kNoError);
  env.scalar_f32("yf", value).scalar_i32("y", static_cast<int32_t>(value));
  bool want = false;
  ASSERT_EQ(error_of([&] { want = fa::ModProgram::mask_of(*p).eval_mask(0, 0, 0, 0, env); }), kNoError);
  if (signature_of(mlir::fa::getBodyOpKind(op)).result != std::string("i1")) {
    EXPECT_TRUE(want);
  }

  // Interval analysis: exact on points, unless the op is one it models as "anything".
  std::optional<fa::MaskRangeProgram> range;
  ASSERT_EQ(error_of([&] { range = fa::MaskRangeProgram::compile(*p); }), kNoError);
  fa::ScalarValues scalars;
  const fa::ModProgram mask = fa::ModProgram::mask_of(*p);
  for (const fa::ScalarInfo& s : mask.scalars()) scalars[s.name] = *env.find_scalar(s.name);
  const fa::IndexRange zero{0, 0};
  const fa::MaskVerdict got = range->eval(zero, zero, zero, zero, scalars);
  const fa::MaskVerdict exact = want ? fa::MaskVerdict::kTrue : fa::MaskVerdict::kFalse;
  if (range->fields().opaque)
    EXPECT_TRUE(got == exact || got == fa::MaskVerdict::kUnknown) << fa::to_string(got);
  else
    EXPECT_EQ(fa::to_string(got), fa::to_string(exact))
        << "the interval analysis neither models " << name << " nor lists it as \"anything\"";

  // Codegen: one C++ line per use, tagged with the op.
  std::string mods;
  ASSERT_EQ(error_of([&] { mods = fa::emit_mods(*p); }), kNoError);
  EXPECT_NE(mods.find(" = " + name + " "), std::string::npos) << mods;

  // Differentiation (its chain rules are a switch over the table: -Wswitch names a missing
  // one; tests/unit/differentiate_test.cpp checks them on the score): the op's value does not
  // depend on the score here, so dS = dt, and the derivative lowers.
  float ds = 0;
  ASSERT_EQ(error_of([&] { ds = fa::ModProgram::grad_of(*p).eval_score_grad(0.0f, 0, 0, 0, 0, 1.5f, env); }),
            kNoError);
  EXPECT_EQ(ds, 1.5f);
  ASSERT_EQ(error_of([&] { fa::emit_mods(*p, /*with_backward=*/true); }), kNoError);
}

TEST(BodyOps, EveryEvaluatorHandlesEveryTableOp) {
  for (unsigned i = 0; i < mlir::fa::kNumBodyOps; ++i) check_op(static_cast<BodyOp>(i));
}

}  // namespace

namespace {

// The three mods bodies answer through one interface (ModBody) what passes, the interpreter and
// codegen read of them: their fixed arguments' count and names, their captures' names, the mod's
// name and kind.
TEST(ModBody, NamesFixedArgumentsAndCaptures) {
  const fa::Program p = fa::Program::parse(R"(
    fa.score_mod @bias(%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32) captures(%w: !fa.buffer<f32, 1>) -> f32 {
      %x = fa.load %w[%h] : !fa.buffer<f32, 1>
      %r = arith.addf %score, %x : f32
      fa.yield %r : f32
    }
    fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
      %c = arith.cmpi sge, %q, %kv : i32
      fa.yield %c : i1
    })",
                                           "bodies");
  const fa::Program::Impl& impl = p.impl();
  auto names = [](mlir::fa::ModBody body) {
    std::string s;
    for (unsigned i = 0; i < body.getNumFixedArgs(); ++i) s += body.getFixedArgName(i).str() + " ";
    for (unsigned i = body.getNumFixedArgs(); i < body.getEntryBlock().getNumArguments(); ++i)
      s += "[" + body.getCaptureName(i - body.getNumFixedArgs()).str() + "] ";
    return body.getKindName().str() + " @" + body.getModName().str() + ": " + s;
  };
  EXPECT_EQ(names(llvm::cast<mlir::fa::ModBody>(impl.score.getOperation())),
            "fa.score_mod @bias: score b h q kv [w] ");
  EXPECT_EQ(names(llvm::cast<mlir::fa::ModBody>(impl.mask.getOperation())), "fa.mask_mod @causal: b h q kv ");
  EXPECT_EQ(names(llvm::cast<mlir::fa::ModBody>(fa::detail::score_grad_of(p).getOperation())),
            "fa.score_grad @bias: score b h q kv dt [w] ");
}

}  // namespace
