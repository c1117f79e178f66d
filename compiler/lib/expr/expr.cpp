// The expression language of fajit/detail/expr.h: a lexer, a recursive-descent parser that builds
// and type-checks a small flat tree once, and an evaluator that replays the tree over the
// tracing frontend's symbolic values each time the mod is traced.
#include "fajit/detail/expr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace fa {
namespace {

using detail::BinOp;
using detail::Sym;
using detail::UnOp;
using detail::ValueKind;

constexpr int kMaxNesting = 256;     // parser recursion (parentheses, unary, calls, ?:)
constexpr int kMaxTreeDepth = 1024;  // depth of the parsed tree (long operator chains)

enum class Type { kInt, kFloat, kBool };

const char* type_phrase(Type t) {
  switch (t) {
    case Type::kInt: return "an integer";
    case Type::kFloat: return "a float";
    case Type::kBool: return "a boolean";
  }
  return "?";
}

ValueKind kind_of(Type t) {
  switch (t) {
    case Type::kInt: return ValueKind::kInt;
    case Type::kFloat: return ValueKind::kFloat;
    case Type::kBool: return ValueKind::kBool;
  }
  return ValueKind::kInt;
}

// ---- the tree ----------------------------------------------------------------------------
enum class NodeKind { kInt, kFloat, kBool, kVar, kScalar, kLoad, kUnary, kBinary, kSelect, kConvert };

// The coordinates and the score, in the order the evaluator receives them.
enum Var { kScore = 0, kB, kH, kQ, kKv };

struct Node {
  Node(NodeKind k, Type t) : kind(k), type(t) {}
  NodeKind kind;
  Type type;
  int depth = 1;
  int32_t ival = 0;  // kInt; kVar: the Var; kUnary/kBinary: the op
  float fval = 0.f;  // kFloat
  std::string name;  // kScalar / kLoad
  std::vector<int> kids;
};

struct Ast {
  std::vector<Node> nodes;  // flat: destruction never recurses
  int root = -1;
};

// Replays the tree in the active trace; left operands before right ones, like C++'s
// sequenced operators, so the IR reads in source order.
Sym eval(const Ast& ast, int id, const Sym* vars) {
  const Node& n = ast.nodes[static_cast<size_t>(id)];
  switch (n.kind) {
    case NodeKind::kInt: return detail::constant_int(n.ival);
    case NodeKind::kFloat: return detail::constant_float(n.fval);
    case NodeKind::kBool: return detail::constant_bool(n.ival != 0);
    case NodeKind::kVar: return vars[n.ival];
    case NodeKind::kScalar: return detail::scalar(n.name, kind_of(n.type));
    case NodeKind::kLoad: {
      Sym idx[4];
      int k = 0;
      for (int kid : n.kids) idx[k++] = eval(ast, kid, vars);
      return detail::load(n.name, kind_of(n.type), k, idx, k);
    }
    case NodeKind::kUnary: return detail::unary(static_cast<UnOp>(n.ival), eval(ast, n.kids[0], vars));
    case NodeKind::kBinary: {
      Sym a = eval(ast, n.kids[0], vars);
      Sym b = eval(ast, n.kids[1], vars);
      return detail::binary(static_cast<BinOp>(n.ival), a, b);
    }
    case NodeKind::kSelect: {
      Sym c = eval(ast, n.kids[0], vars);
      Sym a = eval(ast, n.kids[1], vars);
      Sym b = eval(ast, n.kids[2], vars);
      return detail::select(c, a, b);
    }
    case NodeKind::kConvert: return detail::convert(eval(ast, n.kids[0], vars), kind_of(n.type));
  }
  throw Error("expression evaluator: bad node", ErrorCode::kInternal);
}

// ---- lexer -------------------------------------------------------------------------------
enum class Tok { kInt, kFloat, kIdent, kOp, kEnd };

struct Token {
  Token(Tok k, size_t p, std::string t) : kind(k), pos(p), text(std::move(t)) {}
  Tok kind;
  size_t pos;
  std::string text;
  float fval = 0.f;
};

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

struct Func {
  const char* name;
  int arity;
};
constexpr Func kFuncs[] = {
    {"min", 2},  {"max", 2},  {"abs", 1},   {"exp", 1},     {"exp2", 1},  {"log", 1}, {"log2", 1},
    {"tanh", 1}, {"sqrt", 1}, {"rsqrt", 1}, {"sigmoid", 1}, {"sin", 1},   {"cos", 1}, {"floor", 1},
    {"ceil", 1}, {"erf", 1},  {"pow", 2},   {"where", 3},   {"float", 1}, {"int", 1},
};

// Roughly log10 of a well-formed unsigned decimal literal's magnitude (saturating), to tell
// overflow from underflow when from_chars reports out of range.
long decimal_exponent(std::string_view lit) {
  size_t e = lit.find_first_of("eE");
  std::string_view mant = lit.substr(0, e);
  long exp = 0;
  if (e != std::string_view::npos) {
    bool neg = lit[e + 1] == '-';
    for (char c : lit.substr(e + 1)) {
      if (c >= '0' && c <= '9') exp = std::min(exp * 10 + (c - '0'), 100000000L);
    }
    if (neg) exp = -exp;
  }
  size_t dot = mant.find('.');
  std::string_view ip = mant.substr(0, dot);
  size_t first = ip.find_first_not_of('0');
  if (first != std::string_view::npos) return exp + static_cast<long>(ip.size() - first);
  if (dot == std::string_view::npos) return exp - 100000000L;  // zero
  std::string_view fp = mant.substr(dot + 1);
  size_t nz = fp.find_first_not_of('0');
  if (nz == std::string_view::npos) return exp - 100000000L;  // zero
  return exp - static_cast<long>(nz);
}

const Func* find_func(const std::string& name) {
  for (const Func& f : kFuncs)
    if (name == f.name) return &f;
  return nullptr;
}

class Parser {
 public:
  Parser(std::string_view src, bool score_mod, const ExprCaptureTypes& types)
      : src_(src), score_mod_(score_mod), types_(types) {}

  std::shared_ptr<const Ast> run() {
    lex();
    if (toks_.size() == 1) throw Error(fmt::format("{} expression is empty", what()));
    int root = parse_expr();
    if (peek().kind != Tok::kEnd) fail(fmt::format("unexpected {}", describe(peek())), peek().pos);
    size_t start = toks_.front().pos;
    const Node& r = node(root);
    if (score_mod_) {
      if (r.type == Type::kBool) fail("a score_mod expression must be a number, got a boolean", start);
      if (r.type == Type::kInt) root = convert(root, Type::kFloat, start);
    } else if (r.type != Type::kBool) {
      fail(fmt::format("a mask_mod expression must be a boolean, got {}", type_phrase(r.type)), start);
    }
    ast_->root = root;
    return ast_;
  }

 private:
  // ---- errors --------------------------------------------------------------------------
  std::string what() const { return score_mod_ ? "score-mod" : "mask-mod"; }

  [[noreturn]] void fail(const std::string& msg, size_t pos) const {
    std::string echo(src_);
    for (char& c : echo) {
      auto u = static_cast<unsigned char>(c);
      if (u == '\t' || u == '\n' || u == '\r')
        c = ' ';
      else if (u < 0x20 || u >= 0x7f)
        c = '?';
    }
    throw Error(fmt::format("{} expression: {} at column {}\n  {}\n  {}^", what(), msg, pos + 1, echo,
                            std::string(pos, ' ')));
  }

  std::string describe(const Token& t) const {
    if (t.kind == Tok::kEnd) return "end of expression";
    return fmt::format("'{}'", t.text);
  }

  // ---- lexing --------------------------------------------------------------------------
  void lex() {
    size_t i = 0, n = src_.size();
    while (true) {
      while (i < n && is_space(src_[i])) ++i;
      if (i >= n) break;
      char c = src_[i];
      size_t start = i;
      if (is_ident_start(c)) {
        while (i < n && is_ident_char(src_[i])) ++i;
        toks_.push_back({Tok::kIdent, start, std::string(src_.substr(start, i - start))});
      } else if (is_digit(c) || (c == '.' && i + 1 < n && is_digit(src_[i + 1]))) {
        lex_number(i);
      } else {
        static const char* const kOps[] = {"<=", ">=", "==", "!=", "&&", "||", "(", ")", "[", "]", ",",
                                           "?",  ":",  "+",  "-",  "*",  "/",  "%", "!", "<", ">"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          size_t len = std::char_traits<char>::length(o);
          if (src_.substr(i, len) == o) {
            op = o;
            break;
          }
        }
        if (!op) {
          auto u = static_cast<unsigned char>(c);
          if (c == '=') fail("'=' is not an operator (use '==')", i);
          if (c == '&') fail("'&' is not an operator (use '&&')", i);
          if (c == '|') fail("'|' is not an operator (use '||')", i);
          if (u >= 0x80) fail(fmt::format("non-ASCII character (byte 0x{:02x})", u), i);
          if (u < 0x20 || u == 0x7f) fail(fmt::format("illegal control character (byte 0x{:02x})", u), i);
          fail(fmt::format("illegal character '{}'", c), i);
        }
        i += std::char_traits<char>::length(op);
        toks_.push_back({Tok::kOp, start, op});
      }
    }
    toks_.push_back({Tok::kEnd, n, ""});
  }

  void lex_number(size_t& i) {
    size_t n = src_.size(), start = i;
    bool is_float = false, bad = false;
    while (i < n && is_digit(src_[i])) ++i;
    if (i < n && src_[i] == '.') {
      is_float = true;
      ++i;
      while (i < n && is_digit(src_[i])) ++i;
    }
    if (i < n && (src_[i] == 'e' || src_[i] == 'E')) {
      is_float = true;
      ++i;
      if (i < n && (src_[i] == '+' || src_[i] == '-')) ++i;
      if (i >= n || !is_digit(src_[i])) bad = true;
      while (i < n && is_digit(src_[i])) ++i;
    }
    size_t digits_end = i;
    if (is_float && i < n && (src_[i] == 'f' || src_[i] == 'F')) ++i;
    // Anything glued on (1.2.3, 12abc, 1f, 0x10) makes the whole run a bad literal.
    if (i < n && (is_ident_char(src_[i]) || src_[i] == '.')) bad = true;
    if (bad) {
      while (i < n && (is_ident_char(src_[i]) || src_[i] == '.')) ++i;
      fail(fmt::format("bad number literal '{}'", src_.substr(start, i - start)), start);
    }
    std::string text(src_.substr(start, i - start));
    if (!is_float) {
      if (text.size() > 1 && text[0] == '0')
        fail(fmt::format("bad number literal '{}' (no leading zeros: octal is not supported)", text), start);
      toks_.push_back({Tok::kInt, start, text});
      return;
    }
    std::string_view digits = src_.substr(start, digits_end - start);
    double d = 0;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (ec == std::errc::invalid_argument || ptr != digits.data() + digits.size())
      fail(fmt::format("bad number literal '{}'", text), start);
    if (ec == std::errc::result_out_of_range) {
      // Too small rounds to zero; too large is an error.
      if (decimal_exponent(digits) > 0)
        fail(fmt::format("float literal '{}' is out of the f32 range", text), start);
      d = 0;
    }
    if (std::isinf(static_cast<float>(d)))
      fail(fmt::format("float literal '{}' is out of the f32 range", text), start);
    Token t{Tok::kFloat, start, text};
    t.fval = static_cast<float>(d);
    toks_.push_back(t);
  }

  // ---- tokens --------------------------------------------------------------------------
  const Token& peek() const { return toks_[pos_]; }
  bool is_op(const char* op) const { return peek().kind == Tok::kOp && peek().text == op; }
  Token take() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }

  // ---- tree building -------------------------------------------------------------------
  Node& node(int id) { return ast_->nodes[static_cast<size_t>(id)]; }

  int add(Node n, size_t pos) {
    for (int k : n.kids) n.depth = std::max(n.depth, node(k).depth + 1);
    if (n.depth > kMaxTreeDepth)
      fail(fmt::format("expression is too deeply nested (more than {} levels)", kMaxTreeDepth), pos);
    ast_->nodes.push_back(std::move(n));
    return static_cast<int>(ast_->nodes.size() - 1);
  }

  int leaf(NodeKind kind, Type type, size_t pos) {
    Node n{kind, type};
    return add(std::move(n), pos);
  }

  int convert(int id, Type to, size_t pos) {
    if (node(id).type == to) return id;
    Node n{NodeKind::kConvert, to};
    n.kids = {id};
    return add(std::move(n), pos);
  }

  int unary(UnOp op, Type type, int a, size_t pos) {
    Node n{NodeKind::kUnary, type};
    n.ival = static_cast<int32_t>(op);
    n.kids = {a};
    return add(std::move(n), pos);
  }

  int binary(BinOp op, Type type, int a, int b, size_t pos) {
    Node n{NodeKind::kBinary, type};
    n.ival = static_cast<int32_t>(op);
    n.kids = {a, b};
    return add(std::move(n), pos);
  }

  // Converts an integer side to float when the other is float; both must be numbers.
  Type promote(int& a, int& b, const std::string& op, size_t pos) {
    Type ta = node(a).type, tb = node(b).type;
    if (ta == Type::kBool || tb == Type::kBool)
      fail(fmt::format("'{}' needs numbers, got a boolean", op), pos);
    if (ta == tb) return ta;
    a = convert(a, Type::kFloat, pos);
    b = convert(b, Type::kFloat, pos);
    return Type::kFloat;
  }

  int select(int c, int a, int b, const std::string& op, size_t pos) {
    if (node(c).type != Type::kBool)
      fail(fmt::format("'{}' needs a boolean condition, got {}", op, type_phrase(node(c).type)), pos);
    Type ta = node(a).type, tb = node(b).type;
    Type t = ta;
    if ((ta == Type::kBool) != (tb == Type::kBool))
      fail(fmt::format("'{}' branches must both be numbers or both booleans, got {} and {}", op,
                       type_phrase(ta), type_phrase(tb)),
           pos);
    if (ta != Type::kBool) t = promote(a, b, op, pos);
    Node n{NodeKind::kSelect, t};
    n.kids = {c, a, b};
    return add(std::move(n), pos);
  }

  // ---- grammar -------------------------------------------------------------------------
  // Counts the recursion of parse_expr (one per parenthesis, call argument, index, ?: arm)
  // and parse_unary (one per prefix operator).
  struct Nest {
    Parser& p;
    Nest(Parser& parser, size_t pos) : p(parser) {
      if (++p.depth_ > kMaxNesting)
        p.fail(fmt::format("expression is too deeply nested (more than {} levels)", kMaxNesting), pos);
    }
    ~Nest() { --p.depth_; }
  };

  int parse_expr() {
    Nest nest(*this, peek().pos);
    int c = parse_or();
    if (!is_op("?")) return c;
    size_t qpos = take().pos;
    int a = parse_expr();
    if (!is_op(":")) {
      if (peek().kind == Tok::kEnd) fail("'?' without a matching ':'", qpos);
      fail(fmt::format("expected ':' but found {}", describe(peek())), peek().pos);
    }
    take();
    int b = parse_expr();
    return select(c, a, b, "?", qpos);
  }

  int parse_or() {
    int a = parse_and();
    while (is_op("||")) {
      size_t pos = take().pos;
      int b = parse_and();
      a = logical(BinOp::kOr, "||", a, b, pos);
    }
    return a;
  }

  int parse_and() {
    int a = parse_eq();
    while (is_op("&&")) {
      size_t pos = take().pos;
      int b = parse_eq();
      a = logical(BinOp::kAnd, "&&", a, b, pos);
    }
    return a;
  }

  int logical(BinOp op, const char* sym, int a, int b, size_t pos) {
    for (int x : {a, b})
      if (node(x).type != Type::kBool)
        fail(fmt::format("'{}' needs booleans, got {}", sym, type_phrase(node(x).type)), pos);
    return binary(op, Type::kBool, a, b, pos);
  }

  int parse_eq() {
    int a = parse_rel();
    while (is_op("==") || is_op("!=")) {
      Token t = take();
      int b = parse_rel();
      BinOp op = t.text == "==" ? BinOp::kEq : BinOp::kNe;
      Type ta = node(a).type, tb = node(b).type;
      if ((ta == Type::kBool) != (tb == Type::kBool))
        fail(fmt::format("'{}' cannot compare {} with {}", t.text, type_phrase(ta), type_phrase(tb)), t.pos);
      if (ta != Type::kBool) promote(a, b, t.text, t.pos);
      a = binary(op, Type::kBool, a, b, t.pos);
    }
    return a;
  }

  int parse_rel() {
    int a = parse_add();
    while (is_op("<") || is_op("<=") || is_op(">") || is_op(">=")) {
      Token t = take();
      int b = parse_add();
      BinOp op = t.text == "<"    ? BinOp::kLt
                 : t.text == "<=" ? BinOp::kLe
                 : t.text == ">"  ? BinOp::kGt
                                  : BinOp::kGe;
      promote(a, b, t.text, t.pos);
      a = binary(op, Type::kBool, a, b, t.pos);
    }
    return a;
  }

  int parse_add() {
    int a = parse_mul();
    while (is_op("+") || is_op("-")) {
      Token t = take();
      int b = parse_mul();
      Type ty = promote(a, b, t.text, t.pos);
      a = binary(t.text == "+" ? BinOp::kAdd : BinOp::kSub, ty, a, b, t.pos);
    }
    return a;
  }

  int parse_mul() {
    int a = parse_unary();
    while (is_op("*") || is_op("/") || is_op("%")) {
      Token t = take();
      int b = parse_unary();
      Type ty = promote(a, b, t.text, t.pos);
      if (t.text == "%" && ty != Type::kInt) fail("'%' needs integers, got a float", t.pos);
      BinOp op = t.text == "*" ? BinOp::kMul : t.text == "/" ? BinOp::kDiv : BinOp::kRem;
      a = binary(op, ty, a, b, t.pos);
    }
    return a;
  }

  int parse_unary() {
    if (!is_op("-") && !is_op("!")) return parse_primary();
    Nest nest(*this, peek().pos);
    Token t = take();
    if (t.text == "-") {
      // A negated literal is a literal: -2147483648 fits, -inf is a constant.
      if (peek().kind == Tok::kInt) return int_literal(take(), /*negated=*/true);
      if (peek().kind == Tok::kFloat) {
        Token f = take();
        int id = leaf(NodeKind::kFloat, Type::kFloat, f.pos);
        node(id).fval = -f.fval;
        return id;
      }
      if (peek().kind == Tok::kIdent && peek().text == "inf") {
        take();
        int id = leaf(NodeKind::kFloat, Type::kFloat, t.pos);
        node(id).fval = -std::numeric_limits<float>::infinity();
        return id;
      }
      int a = parse_unary();
      if (node(a).type == Type::kBool) fail("'-' needs a number, got a boolean", t.pos);
      return unary(UnOp::kNeg, node(a).type, a, t.pos);
    }
    int a = parse_unary();
    if (node(a).type != Type::kBool)
      fail(fmt::format("'!' needs a boolean, got {}", type_phrase(node(a).type)), t.pos);
    return unary(UnOp::kNot, Type::kBool, a, t.pos);
  }

  int int_literal(const Token& t, bool negated) {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    int64_t limit = negated ? int64_t{2147483648} : int64_t{2147483647};
    if (ec != std::errc() || v > limit)
      fail(fmt::format("integer literal '{}{}' is out of the i32 range", negated ? "-" : "", t.text), t.pos);
    int id = leaf(NodeKind::kInt, Type::kInt, t.pos);
    node(id).ival = static_cast<int32_t>(negated ? -v : v);
    return id;
  }

  // Parses `open args close` after the name; returns the argument nodes.
  std::vector<int> parse_list(const Token& open, const char* close) {
    std::vector<int> args;
    if (is_op(close)) {
      take();
      return args;
    }
    while (true) {
      args.push_back(parse_expr());
      if (is_op(",")) {
        take();
        continue;
      }
      if (is_op(close)) {
        take();
        return args;
      }
      if (peek().kind == Tok::kEnd) fail(fmt::format("unclosed '{}'", open.text), open.pos);
      fail(fmt::format("expected ',' or '{}' but found {}", close, describe(peek())), peek().pos);
    }
  }

  int parse_primary() {
    Token t = take();
    switch (t.kind) {
      case Tok::kInt: return int_literal(t, false);
      case Tok::kFloat: {
        int id = leaf(NodeKind::kFloat, Type::kFloat, t.pos);
        node(id).fval = t.fval;
        return id;
      }
      case Tok::kIdent: return parse_name(t);
      case Tok::kEnd: fail("unexpected end of expression", t.pos);
      case Tok::kOp: break;
    }
    if (t.text != "(") fail(fmt::format("unexpected {}", describe(t)), t.pos);
    int e = parse_expr();
    if (is_op(")")) {
      take();
      return e;
    }
    if (peek().kind == Tok::kEnd) fail("unclosed '('", t.pos);
    fail(fmt::format("expected ')' but found {}", describe(peek())), peek().pos);
  }

  int parse_name(const Token& t) {
    const std::string& name = t.text;
    static const std::pair<const char*, Var> kVars[] = {
        {"score", kScore}, {"b", kB}, {"h", kH}, {"q", kQ}, {"kv", kKv}};
    for (const auto& [vname, var] : kVars) {
      if (name != vname) continue;
      if (var == kScore && !score_mod_) fail("'score' is only available in a score_mod", t.pos);
      if (is_op("(")) fail(fmt::format("'{}' is not a function", name), t.pos);
      if (is_op("[")) fail(fmt::format("'{}' is not a buffer", name), t.pos);
      int id = leaf(NodeKind::kVar, var == kScore ? Type::kFloat : Type::kInt, t.pos);
      node(id).ival = var;
      return id;
    }
    if (name == "true" || name == "false" || name == "inf") {
      if (is_op("(")) fail(fmt::format("'{}' is not a function", name), t.pos);
      if (is_op("[")) fail(fmt::format("'{}' is not a buffer", name), t.pos);
      if (name == "inf") {
        int id = leaf(NodeKind::kFloat, Type::kFloat, t.pos);
        node(id).fval = std::numeric_limits<float>::infinity();
        return id;
      }
      int id = leaf(NodeKind::kBool, Type::kBool, t.pos);
      node(id).ival = name == "true";
      return id;
    }
    const Func* f = find_func(name);
    if (is_op("(")) {
      if (!f) fail(fmt::format("unknown function '{}'", name), t.pos);
      Token open = take();
      std::vector<int> args = parse_list(open, ")");
      if (static_cast<int>(args.size()) != f->arity)
        fail(fmt::format("'{}' takes {} argument{}, got {}", name, f->arity, f->arity == 1 ? "" : "s",
                         args.size()),
             t.pos);
      return call(name, args, t.pos);
    }
    if (f) fail(fmt::format("'{}' is a function: call it as {}(...)", name, name), t.pos);
    return capture(t);
  }

  int capture(const Token& t) {
    const std::string& name = t.text;
    auto ov = types_.types.find(name);
    bool is_float = ov != types_.types.end() ? ov->second : score_mod_;
    Type type = is_float ? Type::kFloat : Type::kInt;
    bool is_buffer = is_op("[");
    std::vector<int> idx;
    if (is_buffer) {
      Token open = take();
      idx = parse_list(open, "]");
      if (idx.empty()) fail(fmt::format("buffer '{}' needs at least one index", name), t.pos);
      if (idx.size() > 4)
        fail(fmt::format("buffer '{}' has rank {}; ranks 1 to 4 are supported", name, idx.size()), t.pos);
      for (size_t i = 0; i < idx.size(); ++i)
        if (node(idx[i]).type != Type::kInt)
          fail(fmt::format("index {} of buffer '{}' must be an integer, got {}", i + 1, name,
                           type_phrase(node(idx[i]).type)),
               t.pos);
    }
    int rank = static_cast<int>(idx.size());
    auto [it, fresh] = uses_.emplace(name, rank);
    if (!fresh && it->second != rank) {
      if (it->second == 0 || rank == 0)
        fail(fmt::format("'{}' is used both as a buffer and as a scalar", name), t.pos);
      fail(fmt::format("buffer '{}' is used with rank {} and with rank {}", name, it->second, rank), t.pos);
    }
    Node n{is_buffer ? NodeKind::kLoad : NodeKind::kScalar, type};
    n.name = name;
    n.kids = std::move(idx);
    return add(std::move(n), t.pos);
  }

  int call(const std::string& name, std::vector<int>& args, size_t pos) {
    auto need_number = [&](int a) {
      if (node(a).type == Type::kBool) fail(fmt::format("'{}' needs a number, got a boolean", name), pos);
    };
    if (name == "where") return select(args[0], args[1], args[2], "where", pos);
    if (name == "float") return convert(args[0], Type::kFloat, pos);
    if (name == "int") return convert(args[0], Type::kInt, pos);
    if (name == "min" || name == "max" || name == "pow") {
      need_number(args[0]);
      need_number(args[1]);
      Type t = promote(args[0], args[1], name, pos);
      if (name == "pow") {
        args[0] = convert(args[0], Type::kFloat, pos);
        args[1] = convert(args[1], Type::kFloat, pos);
        return binary(BinOp::kPow, Type::kFloat, args[0], args[1], pos);
      }
      return binary(name == "min" ? BinOp::kMin : BinOp::kMax, t, args[0], args[1], pos);
    }
    need_number(args[0]);
    if (name == "abs") return unary(UnOp::kAbs, node(args[0]).type, args[0], pos);
    static const std::pair<const char*, UnOp> kMath[] = {
        {"exp", UnOp::kExp},   {"exp2", UnOp::kExp2}, {"log", UnOp::kLog},     {"log2", UnOp::kLog2},
        {"tanh", UnOp::kTanh}, {"sqrt", UnOp::kSqrt}, {"rsqrt", UnOp::kRsqrt}, {"sigmoid", UnOp::kSigmoid},
        {"sin", UnOp::kSin},   {"cos", UnOp::kCos},   {"floor", UnOp::kFloor}, {"ceil", UnOp::kCeil},
        {"erf", UnOp::kErf}};
    for (const auto& [fname, op] : kMath)
      if (name == fname) return unary(op, Type::kFloat, convert(args[0], Type::kFloat, pos), pos);
    throw Error(fmt::format("expression parser: unhandled function '{}'", name), ErrorCode::kInternal);
  }

  std::string_view src_;
  bool score_mod_;
  const ExprCaptureTypes& types_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::map<std::string, int> uses_;  // capture -> rank (0: scalar)
  std::shared_ptr<Ast> ast_ = std::make_shared<Ast>();
};

}  // namespace

ScoreMod parse_score_mod(std::string_view expr, const ExprCaptureTypes& types) {
  std::shared_ptr<const Ast> ast = Parser(expr, /*score_mod=*/true, types).run();
  return {"score_expr", [ast](Score s, Index b, Index h, Index q, Index kv) {
            const Sym vars[] = {s.sym(), b.sym(), h.sym(), q.sym(), kv.sym()};
            return Score(eval(*ast, ast->root, vars));
          }};
}

MaskMod parse_mask_mod(std::string_view expr, const ExprCaptureTypes& types) {
  std::shared_ptr<const Ast> ast = Parser(expr, /*score_mod=*/false, types).run();
  return {"mask_expr", [ast](Index b, Index h, Index q, Index kv) {
            const Sym vars[] = {Sym{}, b.sym(), h.sym(), q.sym(), kv.sym()};
            return Bool(eval(*ast, ast->root, vars));
          }};
}

}  // namespace fa
