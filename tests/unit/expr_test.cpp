// The expression language of `fajit dump --mask-mod EXPR --score-mod EXPR` (fajit/detail/expr.h):
// expressions trace to the IR the C++ mods give, and every malformed input is an fa::Error
// with a column and a caret.
#include "fajit/detail/expr.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fajit/mods.h"

namespace {

using fa::Bool;
using fa::Index;
using fa::Score;

using fa::test::error_of;

::testing::AssertionResult StartsWith(const std::string& s, const std::string& prefix) {
  if (s.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << s << "'\ndoes not start with\n'" << prefix << "'";
}

// The printed IR with each mod body replaced by its yielded value written as one nested
// expression, so two bodies that build the same tree in a different op order (C++ leaves
// the evaluation order of overloaded `a + b` operands unspecified; the expression evaluator
// goes left to right) compare equal.
std::string canonical(const std::string& ir) {
  std::map<std::string, std::string> defs;
  std::function<std::string(const std::string&)> expand = [&](const std::string& text) {
    std::string r;
    for (size_t i = 0; i < text.size();) {
      if (text[i] != '%') {
        r += text[i++];
        continue;
      }
      size_t j = i + 1;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      std::string name = text.substr(i, j - i);
      auto it = defs.find(name);
      r += it == defs.end() ? name : "(" + expand(it->second) + ")";
      i = j;
    }
    return r;
  };
  std::istringstream in(ir);
  std::string line, out;
  while (std::getline(in, line)) {
    line.erase(0, line.find_first_not_of(' '));
    size_t eq = line.find(" = ");
    if (!line.empty() && line[0] == '%' && eq != std::string::npos) {
      defs[line.substr(0, eq)] = line.substr(eq + 3);
      continue;
    }
    out += (line.rfind("fa.yield", 0) == 0 ? expand(line) : line) + "\n";
  }
  return out;
}

// The IR of a mod with its name replaced, so mods of different names compare equal.
std::string mask_ir(fa::MaskMod m) {
  m.name = "m";
  return canonical(fa::trace(fa::identity_score(), m).to_mlir());
}
std::string score_ir(fa::ScoreMod s) {
  s.name = "s";
  return canonical(fa::trace(s, fa::noop_mask()).to_mlir());
}
std::string mask_ir(std::string_view e, const fa::ExprCaptureTypes& t = {}) {
  return mask_ir(fa::parse_mask_mod(e, t));
}
std::string score_ir(std::string_view e, const fa::ExprCaptureTypes& t = {}) {
  return score_ir(fa::parse_score_mod(e, t));
}
std::string mask_error(std::string_view e, const fa::ExprCaptureTypes& t = {}) {
  return error_of([&] { fa::parse_mask_mod(e, t); });
}
std::string score_error(std::string_view e, const fa::ExprCaptureTypes& t = {}) {
  return error_of([&] { fa::parse_score_mod(e, t); });
}

// ---- same IR as the library --------------------------------------------------------------

TEST(Expr, LibraryMasksAsExpressions) {
  EXPECT_EQ(mask_ir("q >= kv"), mask_ir(fa::mods::causal()));
  EXPECT_EQ(mask_ir("q >= kv && q - kv <= window"), mask_ir(fa::mods::sliding_window()));
  EXPECT_EQ(mask_ir("kv < prefix || q >= kv"), mask_ir(fa::mods::prefix_lm()));
  EXPECT_EQ(mask_ir("doc_ids[q] == doc_ids[kv]"), mask_ir(fa::mods::document()));
  EXPECT_EQ(mask_ir("q >= kv && q - kv <= window && (q - kv) % dilation == 0"),
            mask_ir(fa::mods::dilated_sliding_window()));
  EXPECT_EQ(mask_ir("q >= n_pad && kv >= n_pad"), mask_ir(fa::mods::padding()));
  EXPECT_EQ(mask_ir("true"), mask_ir(fa::noop_mask()));
}

TEST(Expr, LibraryScoreModsAsExpressions) {
  EXPECT_EQ(score_ir("score + exp2(-8.0 * (h + 1) / float(num_heads)) * (kv - q)", {{{"num_heads", false}}}),
            score_ir(fa::mods::alibi()));
  EXPECT_EQ(score_ir("score + slopes[h] * (kv - q)"),
            score_ir(fa::mods::alibi(fa::buffer<float>("slopes", 1))));
  EXPECT_EQ(score_ir("softcap * tanh(score / softcap)"), score_ir(fa::mods::softcap()));
  EXPECT_EQ(score_ir("score + rel_bias[q - kv + rel_offset]", {{{"rel_offset", false}}}),
            score_ir(fa::mods::relative_bias()));
  EXPECT_EQ(score_ir("score"), score_ir(fa::identity_score()));
}

TEST(Expr, NamesAndTracesRepeatedly) {
  fa::MaskMod m = fa::parse_mask_mod("q >= kv");
  fa::ScoreMod s = fa::parse_score_mod("score * 2");
  EXPECT_EQ(m.name, "mask_expr");
  EXPECT_EQ(s.name, "score_expr");
  std::string first = fa::trace(s, m).to_mlir();
  EXPECT_NE(first.find("fa.mask_mod @mask_expr("), std::string::npos) << first;
  EXPECT_NE(first.find("fa.score_mod @score_expr("), std::string::npos) << first;
  EXPECT_EQ(fa::trace(s, m).to_mlir(), first);  // the tree is replayed, not consumed
  fa::MaskMod copy = m;
  EXPECT_EQ(fa::trace(s, copy).to_mlir(), first);
}

// ---- types -------------------------------------------------------------------------------

TEST(Expr, IntFloatPromotion) {
  std::string ir = score_ir("score + q");
  EXPECT_NE(ir.find("arith.sitofp %q : i32 to f32"), std::string::npos) << ir;
  ir = score_ir("q / 2");  // integer division, then the result becomes the score
  EXPECT_NE(ir.find("arith.divsi"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.sitofp"), std::string::npos) << ir;
  ir = score_ir("q / 2.0");
  EXPECT_EQ(ir.find("arith.divsi"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.divf"), std::string::npos) << ir;
  ir = mask_ir("q < kv * 0.5");
  EXPECT_NE(ir.find("arith.cmpf olt"), std::string::npos) << ir;
  ir = score_ir("exp(q) + min(kv, 1.5) + abs(h) + pow(2, b)");
  EXPECT_NE(ir.find("math.exp"), std::string::npos) << ir;
  EXPECT_NE(ir.find("math.absi"), std::string::npos) << ir;  // abs of an integer stays integer
  EXPECT_NE(ir.find("math.powf"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("arith.minsi"), std::string::npos) << ir;
  EXPECT_EQ(score_ir("float(q) + score"), score_ir("q + score"));
  EXPECT_EQ(score_ir("score + 1"), score_ir("score + 1.0"));
  ir = mask_ir("int(float(q) * 0.5) == kv");
  EXPECT_NE(ir.find("arith.fptosi"), std::string::npos) << ir;
  ir = score_ir("score * float(q >= kv) + int(q > kv)");
  EXPECT_NE(ir.find("arith.uitofp"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.extui"), std::string::npos) << ir;
}

TEST(Expr, Literals) {
  EXPECT_EQ(score_ir("score * 1e-3"), score_ir("score * 0.001"));
  EXPECT_EQ(score_ir("score * 2.f"), score_ir("score * 2.0"));
  EXPECT_EQ(score_ir("score * .5F"), score_ir("score * 0.5"));
  EXPECT_EQ(score_ir("score * 1E+2"), score_ir("score * 100.0"));
  EXPECT_EQ(score_ir("score * 1e-60"), score_ir("score * 0.0"));  // underflows to zero
  EXPECT_EQ(mask_ir("q - kv > -2147483648"), mask_ir("q - kv > -2147483647 - 1"));
  EXPECT_EQ(mask_ir("q < 2147483647"),
            mask_ir(fa::MaskMod{"x", [](Index, Index, Index q, Index) { return q < Index(2147483647); }}));
  std::string ir = score_ir("q >= kv ? score : -inf");
  EXPECT_NE(ir.find("0xFF800000"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.select"), std::string::npos) << ir;
  EXPECT_EQ(mask_ir("q >= kv || false"), mask_ir("q >= kv"));
}

TEST(Expr, Ternary) {
  EXPECT_EQ(score_ir("q >= kv ? score : -inf"),
            score_ir(fa::ScoreMod{"x", [](Score s, Index, Index, Index q, Index kv) {
                                    Bool c = q >= kv;
                                    return fa::where(c, s, Score(-INFINITY));
                                  }}));
  EXPECT_EQ(score_ir("q >= kv ? score : -inf"), score_ir("where(q >= kv, score, -inf)"));
  // Integer and float branches meet as floats.
  std::string ir = score_ir("q > kv ? 1 : 0.5");
  EXPECT_NE(ir.find("arith.select"), std::string::npos) << ir;
  EXPECT_NE(ir.find(": f32"), std::string::npos) << ir;
  // Right associative, like C.
  EXPECT_EQ(mask_ir("q > kv ? true : q < kv ? false : h == 0"),
            mask_ir("q > kv ? true : (q < kv ? false : h == 0)"));
}

TEST(Expr, BuffersAndScalars) {
  fa::Program p = fa::trace(fa::parse_score_mod("score + bias[h, q - kv] * scale"),
                            fa::parse_mask_mod("doc[q] == doc[kv] && q - kv < w"));
  std::string ir = p.to_mlir();
  EXPECT_NE(ir.find("fa.load %bias[%h, %"), std::string::npos) << ir;
  EXPECT_NE(ir.find("!fa.buffer<f32, 2>"), std::string::npos) << ir;
  EXPECT_NE(ir.find("!fa.buffer<i32, 1>"), std::string::npos) << ir;
  EXPECT_NE(ir.find("fa.scalar \"scale\" : f32"), std::string::npos) << ir;
  EXPECT_NE(ir.find("fa.scalar \"w\" : i32"), std::string::npos) << ir;
  ASSERT_EQ(p.captures().size(), 4u);
  for (const auto& c : p.captures()) {
    if (c.name == "bias") {
      EXPECT_TRUE(c.is_buffer && c.is_float && c.rank == 2 && c.used_by_score);
    } else if (c.name == "doc") {
      EXPECT_TRUE(c.is_buffer && !c.is_float && c.rank == 1 && c.used_by_mask);
    } else if (c.name == "scale") {
      EXPECT_TRUE(!c.is_buffer && c.is_float);
    } else {
      EXPECT_EQ(c.name, "w");
      EXPECT_TRUE(!c.is_buffer && !c.is_float);
    }
  }
}

TEST(Expr, CaptureTypeOverrides) {
  fa::ExprCaptureTypes t{{{"w", true}, {"doc", true}, {"s", false}, {"unused", true}}};
  std::string ir = mask_ir("q - kv < w", t);
  EXPECT_NE(ir.find("fa.scalar \"w\" : f32"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.cmpf olt"), std::string::npos) << ir;
  ir = mask_ir("doc[q] > 0.5", t);
  EXPECT_NE(ir.find("!fa.buffer<f32, 1>"), std::string::npos) << ir;
  ir = score_ir("score * s", t);
  EXPECT_NE(ir.find("fa.scalar \"s\" : i32"), std::string::npos) << ir;
  EXPECT_NE(ir.find("arith.sitofp"), std::string::npos) << ir;
  // An i32 scalar in a score_mod keeps integer arithmetic until it meets a float.
  ir = score_ir("score + (s % 3)", t);
  EXPECT_NE(ir.find("arith.remsi"), std::string::npos) << ir;
}

TEST(Expr, Precedence) {
  struct Case {
    const char* expr;
    const char* same;
    const char* different;
  };
  const Case cases[] = {
      {"q + kv * 2 > h", "(q + (kv * 2)) > h", "((q + kv) * 2) > h"},
      {"q - kv - h > 0", "((q - kv) - h) > 0", "(q - (kv - h)) > 0"},
      {"q / kv % 3 == 0", "((q / kv) % 3) == 0", "(q / (kv % 3)) == 0"},
      {"-q * kv < 0", "((-q) * kv) < 0", "(-(q * kv)) < 0"},
      {"q < kv == h < b", "(q < kv) == (h < b)", "q < kv && h < b"},
      {"q > kv || h > 0 && b > 0", "(q > kv) || ((h > 0) && (b > 0))", "((q > kv) || (h > 0)) && (b > 0)"},
      {"!(q > kv) && h > 0", "(!(q > kv)) && (h > 0)", "!((q > kv) && (h > 0))"},
      {"q > kv && h > 0 ? b > 0 : b < 0", "((q > kv) && (h > 0)) ? (b > 0) : (b < 0)",
       "(q > kv) && ((h > 0) ? (b > 0) : (b < 0))"},
      {"q == kv != (h == b)", "(q == kv) != (h == b)", "q == kv"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(mask_ir(c.expr), mask_ir(c.same)) << c.expr;
    EXPECT_NE(mask_ir(c.expr), mask_ir(c.different)) << c.expr;
  }
  EXPECT_EQ(score_ir("score * -score + 1"), score_ir("(score * (-score)) + 1"));
  EXPECT_EQ(score_ir("2 * 3 + score"), score_ir("6 + score"));  // constants fold
}

TEST(Expr, WhitespaceIsFree) {
  EXPECT_EQ(mask_ir(" \tq>=kv&&q-kv<=window \r\n"), mask_ir(fa::mods::sliding_window()));
}

// ---- errors ------------------------------------------------------------------------------

TEST(ExprErrors, SyntaxWithCaret) {
  EXPECT_EQ(mask_error("q >= kv )"),
            "mask-mod expression: unexpected ')' at column 9\n  q >= kv )\n          ^");
  EXPECT_EQ(mask_error("q >= kv kv"),
            "mask-mod expression: unexpected 'kv' at column 9\n  q >= kv kv\n          ^");
  EXPECT_EQ(mask_error("q >="),
            "mask-mod expression: unexpected end of expression at column 5\n  q >=\n      ^");
  EXPECT_EQ(score_error("score * * 2"),
            "score-mod expression: unexpected '*' at column 9\n  score * * 2\n          ^");
  EXPECT_EQ(mask_error("(q >= kv"), "mask-mod expression: unclosed '(' at column 1\n  (q >= kv\n  ^");
  EXPECT_EQ(mask_error("(q >= kv]"),
            "mask-mod expression: expected ')' but found ']' at column 9\n  (q >= kv]\n          ^");
  EXPECT_EQ(mask_error("doc[q == doc[kv]"),
            "mask-mod expression: unclosed '[' at column 4\n  doc[q == doc[kv]\n     ^");
  EXPECT_EQ(mask_error("doc[q) == 1"),
            "mask-mod expression: expected ',' or ']' but found ')' at column 6\n  doc[q) == 1\n       ^");
  EXPECT_EQ(score_error("min(score, 1"),
            "score-mod expression: unclosed '(' at column 4\n  min(score, 1\n     ^");
  EXPECT_EQ(mask_error("q > kv ? true"),
            "mask-mod expression: '?' without a matching ':' at column 8\n  q > kv ? true\n         ^");
  EXPECT_EQ(mask_error("q > kv ? true , false"),
            "mask-mod expression: expected ':' but found ',' at column 15\n  q > kv ? true , false\n"
            "                ^");
  EXPECT_EQ(mask_error("min(q, ) > 0"),
            "mask-mod expression: unexpected ')' at column 8\n  min(q, ) > 0\n         ^");
}

TEST(ExprErrors, Empty) {
  EXPECT_EQ(mask_error(""), "mask-mod expression is empty");
  EXPECT_EQ(score_error("  \t "), "score-mod expression is empty");
}

TEST(ExprErrors, Characters) {
  EXPECT_EQ(mask_error("q # kv"), "mask-mod expression: illegal character '#' at column 3\n  q # kv\n    ^");
  EXPECT_EQ(mask_error("q = kv"),
            "mask-mod expression: '=' is not an operator (use '==') at column 3\n  q = kv\n    ^");
  EXPECT_EQ(mask_error("q > 0 & kv > 0"),
            "mask-mod expression: '&' is not an operator (use '&&') at column 7\n  q > 0 & kv > 0\n"
            "        ^");
  EXPECT_TRUE(
      StartsWith(mask_error("q > 0 | kv > 0"), "mask-mod expression: '|' is not an operator (use '||') at "));
  EXPECT_EQ(mask_error("q \xc3\xa9 kv"),
            "mask-mod expression: non-ASCII character (byte 0xc3) at column 3\n  q ?? kv\n    ^");
  EXPECT_EQ(mask_error(std::string("q\0kv", 4)),
            "mask-mod expression: illegal control character (byte 0x00) at column 2\n  q?kv\n   ^");
  EXPECT_EQ(mask_error("q . kv"), "mask-mod expression: illegal character '.' at column 3\n  q . kv\n    ^");
}

TEST(ExprErrors, NumberLiterals) {
  EXPECT_EQ(score_error("score * 1.2.3"),
            "score-mod expression: bad number literal '1.2.3' at column 9\n  score * 1.2.3\n          ^");
  EXPECT_EQ(score_error("score * 1e"),
            "score-mod expression: bad number literal '1e' at column 9\n  score * 1e\n          ^");
  EXPECT_TRUE(StartsWith(score_error("score * 1e+x"), "score-mod expression: bad number literal '1e+x' "));
  EXPECT_EQ(score_error("score * 2f"),
            "score-mod expression: bad number literal '2f' at column 9\n  score * 2f\n          ^");
  EXPECT_EQ(mask_error("q < 12abc"),
            "mask-mod expression: bad number literal '12abc' at column 5\n  q < 12abc\n      ^");
  EXPECT_EQ(mask_error("q < 0x10"),
            "mask-mod expression: bad number literal '0x10' at column 5\n  q < 0x10\n      ^");
  EXPECT_EQ(mask_error("q < 010"),
            "mask-mod expression: bad number literal '010' (no leading zeros: octal is not "
            "supported) at column 5\n  q < 010\n      ^");
  EXPECT_EQ(mask_error("q < 2147483648"),
            "mask-mod expression: integer literal '2147483648' is out of the i32 range at column 5\n"
            "  q < 2147483648\n      ^");
  EXPECT_EQ(mask_error("q < -2147483649"),
            "mask-mod expression: integer literal '-2147483649' is out of the i32 range at column 6\n"
            "  q < -2147483649\n       ^");
  EXPECT_TRUE(
      StartsWith(mask_error("q < 99999999999999999999999"),
                 "mask-mod expression: integer literal '99999999999999999999999' is out of the i32 range"));
  EXPECT_TRUE(StartsWith(mask_error("q < -(2147483648)"),
                         "mask-mod expression: integer literal '2147483648' is out of the i32 range "));
  EXPECT_EQ(score_error("score * 1e39"),
            "score-mod expression: float literal '1e39' is out of the f32 range at column 9\n"
            "  score * 1e39\n          ^");
  EXPECT_TRUE(StartsWith(score_error("score * 1e999999999999"),
                         "score-mod expression: float literal '1e999999999999' is out of the f32"));
}

TEST(ExprErrors, Names) {
  EXPECT_EQ(mask_error("score > 0"),
            "mask-mod expression: 'score' is only available in a score_mod at column 1\n"
            "  score > 0\n  ^");
  EXPECT_EQ(score_error("foo(score)"),
            "score-mod expression: unknown function 'foo' at column 1\n  foo(score)\n  ^");
  EXPECT_EQ(score_error("score + exp"),
            "score-mod expression: 'exp' is a function: call it as exp(...) at column 9\n"
            "  score + exp\n          ^");
  EXPECT_EQ(mask_error("q(1) > 0"),
            "mask-mod expression: 'q' is not a function at column 1\n  q(1) > 0\n  ^");
  EXPECT_EQ(mask_error("kv[1] > 0"),
            "mask-mod expression: 'kv' is not a buffer at column 1\n  kv[1] > 0\n  ^");
  EXPECT_EQ(mask_error("true[1]"), "mask-mod expression: 'true' is not a buffer at column 1\n  true[1]\n  ^");
}

TEST(ExprErrors, Arity) {
  EXPECT_EQ(score_error("min(score)"),
            "score-mod expression: 'min' takes 2 arguments, got 1 at column 1\n  min(score)\n  ^");
  EXPECT_EQ(score_error("exp(score, 1)"),
            "score-mod expression: 'exp' takes 1 argument, got 2 at column 1\n  exp(score, 1)\n  ^");
  EXPECT_EQ(score_error("score + tanh()"),
            "score-mod expression: 'tanh' takes 1 argument, got 0 at column 9\n  score + tanh()\n"
            "          ^");
  EXPECT_TRUE(StartsWith(score_error("where(q > kv, score)"),
                         "score-mod expression: 'where' takes 3 arguments, got 2 "));
}

TEST(ExprErrors, Types) {
  EXPECT_EQ(mask_error("q && kv"),
            "mask-mod expression: '&&' needs booleans, got an integer at column 3\n  q && kv\n    ^");
  EXPECT_EQ(mask_error("q > kv || 1.5"),
            "mask-mod expression: '||' needs booleans, got a float at column 8\n  q > kv || 1.5\n"
            "         ^");
  EXPECT_EQ(mask_error("q - kv"),
            "mask-mod expression: a mask_mod expression must be a boolean, got an integer at column 1\n"
            "  q - kv\n  ^");
  EXPECT_EQ(mask_error("  q * 0.5"),
            "mask-mod expression: a mask_mod expression must be a boolean, got a float at column 3\n"
            "    q * 0.5\n    ^");
  EXPECT_EQ(score_error("score > 0"),
            "score-mod expression: a score_mod expression must be a number, got a boolean at column 1\n"
            "  score > 0\n  ^");
  EXPECT_EQ(mask_error("!q"),
            "mask-mod expression: '!' needs a boolean, got an integer at column 1\n  !q\n  ^");
  EXPECT_EQ(mask_error("-(q > kv)"),
            "mask-mod expression: '-' needs a number, got a boolean at column 1\n  -(q > kv)\n  ^");
  EXPECT_EQ(mask_error("(q > kv) + 1 > 0"),
            "mask-mod expression: '+' needs numbers, got a boolean at column 10\n  (q > kv) + 1 > 0\n"
            "           ^");
  EXPECT_TRUE(StartsWith(mask_error("(q > kv) < (h > b)"),
                         "mask-mod expression: '<' needs numbers, got a boolean at column 10"));
  EXPECT_EQ(mask_error("q > kv == 1"),
            "mask-mod expression: '==' cannot compare a boolean with an integer at column 8\n"
            "  q > kv == 1\n         ^");
  EXPECT_EQ(score_error("score % 2"),
            "score-mod expression: '%' needs integers, got a float at column 7\n  score % 2\n        ^");
  EXPECT_EQ(score_error("q ? score : 0"),
            "score-mod expression: '?' needs a boolean condition, got an integer at column 3\n"
            "  q ? score : 0\n    ^");
  EXPECT_TRUE(
      StartsWith(score_error("q > kv ? score : true"),
                 "score-mod expression: '?' branches must both be numbers or both booleans, got a float "
                 "and a boolean at column"));
  EXPECT_TRUE(StartsWith(score_error("where(1, score, 0)"),
                         "score-mod expression: 'where' needs a boolean condition, got an integer at "));
  EXPECT_TRUE(StartsWith(score_error("exp(q > kv)"),
                         "score-mod expression: 'exp' needs a number, got a boolean at "));
  EXPECT_TRUE(StartsWith(score_error("max(score, q > kv)"),
                         "score-mod expression: 'max' needs a number, got a boolean at "));
  EXPECT_EQ(score_error("bias[score]"),
            "score-mod expression: index 1 of buffer 'bias' must be an integer, got a float at column 1\n"
            "  bias[score]\n  ^");
}

TEST(ExprErrors, Captures) {
  EXPECT_EQ(mask_error("x[q] == x"),
            "mask-mod expression: 'x' is used both as a buffer and as a scalar at column 9\n"
            "  x[q] == x\n          ^");
  EXPECT_TRUE(StartsWith(mask_error("x == x[q]"),
                         "mask-mod expression: 'x' is used both as a buffer and as a scalar at"));
  EXPECT_EQ(mask_error("x[q] == x[q, kv]"),
            "mask-mod expression: buffer 'x' is used with rank 1 and with rank 2 at column 9\n"
            "  x[q] == x[q, kv]\n          ^");
  EXPECT_EQ(mask_error("x[] == 0"),
            "mask-mod expression: buffer 'x' needs at least one index at column 1\n  x[] == 0\n  ^");
  EXPECT_TRUE(StartsWith(mask_error("x[b, h, q, kv, 0] == 0"),
                         "mask-mod expression: buffer 'x' has rank 5; ranks 1 to 4 are supported at column"));
  // Rank 4 is fine.
  EXPECT_NO_THROW(mask_ir("x[b, h, q, kv] == 0"));
}

TEST(ExprErrors, NestingIsCapped) {
  std::string deep = std::string(300, '(') + "q > kv" + std::string(300, ')');
  EXPECT_TRUE(StartsWith(
      mask_error(deep),
      "mask-mod expression: expression is too deeply nested (more than 256 levels) at column 257\n"));
  EXPECT_NO_THROW(mask_ir(std::string(200, '(') + "q > kv" + std::string(200, ')')));
  std::string nots(100000, '!');
  EXPECT_TRUE(StartsWith(mask_error(nots + "true"),
                         "mask-mod expression: expression is too deeply nested (more than 256 levels) "));
  EXPECT_TRUE(StartsWith(score_error(std::string(100000, '-') + "score"),
                         "score-mod expression: expression is too deeply nested (more than 256 levels) "));
  // Long flat chains are parsed by loops but still limited in tree depth.
  std::string sum = "score";
  for (int i = 0; i < 5000; ++i) sum += " + q";
  EXPECT_TRUE(StartsWith(score_error(sum),
                         "score-mod expression: expression is too deeply nested (more than 1024 levels) "));
  std::string ok = "score";
  for (int i = 0; i < 500; ++i) ok += " + 1";
  EXPECT_NO_THROW(score_ir(ok));
  std::string calls;
  for (int i = 0; i < 1000; ++i) calls += "exp(";
  EXPECT_TRUE(StartsWith(score_error(calls + "score"),
                         "score-mod expression: expression is too deeply nested (more than 256 levels) "));
  std::string brackets;
  for (int i = 0; i < 1000; ++i) brackets += "x[";
  EXPECT_TRUE(StartsWith(mask_error(brackets + "q"),
                         "mask-mod expression: expression is too deeply nested (more than 256 levels) "));
}

// ---- robustness --------------------------------------------------------------------------

// Every input either parses and traces, or throws fa::Error: no crash, no other exception.
void parse_and_trace(const std::string& text, bool score, int& parsed) {
  try {
    if (score) {
      fa::ScoreMod s = fa::parse_score_mod(text);
      ++parsed;
      fa::trace(s, fa::noop_mask());
    } else {
      fa::MaskMod m = fa::parse_mask_mod(text);
      ++parsed;
      fa::trace(fa::identity_score(), m);
    }
  } catch (const fa::Error& e) {
    EXPECT_GT(std::string(e.what()).size(), 0u);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-fa::Error exception " << e.what() << " for: " << text;
  } catch (...) {
    ADD_FAILURE() << "unknown exception for: " << text;
  }
}

TEST(ExprFuzz, RandomTokenSoup) {
  const std::vector<std::string> alphabet = {
      "q",          "kv",   "b",     "h",   "score", "x",   "buf",   "w",     "[",   "]",   "(",   ")",
      ",",          "?",    ":",     "+",   "-",     "*",   "/",     "%",     "!",   "<",   "<=",  ">",
      ">=",         "==",   "!=",    "&&",  "||",    "0",   "1",     "7",     "2.5", "1e3", ".5",  "2.f",
      "inf",        "true", "false", "min", "max",   "exp", "where", "float", "int", "pow", "abs", "tanh",
      "2147483648", "1e39", " ",     "=",   "&",     "#",   "\xff",  "1.2.3"};
  std::mt19937 rng(20240611);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    int len = 1 + static_cast<int>(rng() % 16);
    std::string s;
    for (int k = 0; k < len; ++k) {
      s += alphabet[rng() % alphabet.size()];
      if (rng() % 3 == 0) s += ' ';
    }
    parse_and_trace(s, i % 2 == 0, parsed);
  }
  EXPECT_GT(parsed, 30) << parsed;
}

// Syntactically well-formed random expressions (types are random, so many fail to check).
std::string random_expr(std::mt19937& rng, int depth) {
  static const char* const leaves[] = {
      "q",    "kv",    "b",    "h",     "score",        "w",          "s",
      "0",    "1",     "3",    "-1",    "2.5",          "0.0",        "inf",
      "true", "false", "x[q]", "x[kv]", "m[h, q - kv]", "2147483647", "-2147483648"};
  static const char* const binops[] = {"+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||"};
  static const char* const fn1[] = {"abs",     "exp", "exp2", "log",   "log2", "tanh", "sqrt",  "rsqrt",
                                    "sigmoid", "sin", "cos",  "floor", "ceil", "erf",  "float", "int"};
  static const char* const fn2[] = {"min", "max", "pow"};
  if (depth <= 0 || rng() % 4 == 0) return leaves[rng() % std::size(leaves)];
  switch (rng() % 7) {
    case 0:
    case 1:
    case 2:
      return random_expr(rng, depth - 1) + " " + binops[rng() % std::size(binops)] + " " +
             random_expr(rng, depth - 1);
    case 3: return std::string(rng() % 2 ? "-" : "!") + random_expr(rng, depth - 1);
    case 4: return "(" + random_expr(rng, depth - 1) + ")";
    case 5:
      if (rng() % 2)
        return std::string(fn1[rng() % std::size(fn1)]) + "(" + random_expr(rng, depth - 1) + ")";
      return std::string(fn2[rng() % std::size(fn2)]) + "(" + random_expr(rng, depth - 1) + ", " +
             random_expr(rng, depth - 1) + ")";
    default:
      return random_expr(rng, depth - 1) + " ? " + random_expr(rng, depth - 1) + " : " +
             random_expr(rng, depth - 1);
  }
}

TEST(ExprFuzz, RandomWellFormedExpressions) {
  std::mt19937 rng(7);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_expr(rng, 1 + static_cast<int>(rng() % 5));
    // Wrap half of them in a comparison so mask expressions type-check more often.
    if (i % 4 == 1) s = "(" + s + ") > 0";
    parse_and_trace(s, i % 2 == 0, parsed);
  }
  EXPECT_GT(parsed, 500) << parsed;
}

}  // namespace
