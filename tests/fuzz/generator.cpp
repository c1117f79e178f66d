// The fuzzer's generator: random well-typed graphs, captures and shapes (fuzz.h), their
// lowering to the tracing frontend, and a direct evaluator with the interpreter's semantics.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fuzz.h"

namespace fa_fuzz {
namespace {

NodeP mk(Op op, Ty ty, std::vector<NodeP> kids = {}) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->ty = ty;
  n->kids = std::move(kids);
  return n;
}
NodeP cst_i(int32_t v) {
  auto n = std::make_shared<Node>();
  n->op = Op::kConstI;
  n->ty = Ty::kIndex;
  n->i = v;
  return n;
}
NodeP cst_f(float v) {
  auto n = std::make_shared<Node>();
  n->op = Op::kConstF;
  n->ty = Ty::kScore;
  n->f = v;
  return n;
}
NodeP named(Op op, Ty ty, std::string name, std::vector<NodeP> kids = {}) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->ty = ty;
  n->name = std::move(name);
  n->kids = std::move(kids);
  return n;
}
NodeP cmp(Op op, int pred, NodeP a, NodeP b) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->ty = Ty::kBool;
  n->i = pred;
  n->kids = {std::move(a), std::move(b)};
  return n;
}

// The scalars every case may use (only those read are kept): divisors d* are never 0 or -1.
const char* const kDivScalars[] = {"d0", "d1"};
const char* const kIntScalars[] = {"w0", "w1"};
const char* const kFloatScalars[] = {"c0", "c1"};

class Gen {
 public:
  Gen(uint64_t seed, int index) : rng_(mix(seed, index)) {}

  std::mt19937_64& rng() { return rng_; }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  void make_captures(Case& c) {
    int nf = uniform(0, 2), ni = uniform(0, 2);
    for (int k = 0; k < nf + ni; ++k) {
      BufferSpec b;
      b.is_float = k < nf;
      b.name = fmt::format("{}{}", b.is_float ? "bf" : "bi", b.is_float ? k : k - nf);
      if (chance(0.7))
        b.shape = {uniform(1, 48)};
      else
        b.shape = {uniform(1, 8), uniform(1, 8)};
      int64_t n = 1;
      for (int64_t d : b.shape) n *= d;
      for (int64_t e = 0; e < n; ++e) {
        if (b.is_float)
          b.f.push_back(chance(0.1) ? 0.0f : static_cast<float>(real(-3, 3)));
        else
          b.i.push_back(chance(0.5) ? uniform(-4, 4) : uniform(-20, 5000));
      }
      c.buffers.push_back(std::move(b));
    }
    for (const char* n : kDivScalars) {
      int v = uniform(-9, 9);
      if (v == 0 || v == -1) v = 1;
      c.scalars.push_back({n, false, static_cast<double>(v)});
    }
    for (const char* n : kIntScalars)
      c.scalars.push_back({n, false, static_cast<double>(uniform(-50, 3000))});
    for (const char* n : kFloatScalars) c.scalars.push_back({n, true, static_cast<float>(real(-8, 8))});
    buffers_ = &c.buffers;
  }

  // ---- leaves ----
  NodeP index_leaf(bool score_ok) {
    switch (uniform(0, 9)) {
      case 0: return mk(Op::kB, Ty::kIndex);
      case 1: return mk(Op::kH, Ty::kIndex);
      case 2:
      case 3: return mk(Op::kQ, Ty::kIndex);
      case 4:
      case 5: return mk(Op::kKv, Ty::kIndex);
      case 6: return cst_i(chance(0.5) ? uniform(-10, 10) : uniform(-100, 5000));
      case 7: return named(Op::kScalarI, Ty::kIndex, kIntScalars[uniform(0, 1)]);
      case 8: return named(Op::kScalarI, Ty::kIndex, kDivScalars[uniform(0, 1)]);
      default: {
        NodeP l = load(false, 0, score_ok);
        return l ? l : mk(Op::kQ, Ty::kIndex);
      }
    }
  }
  NodeP score_leaf(bool score_ok) {
    int k = uniform(0, 9);
    if (score_ok && k < 4) return mk(Op::kScoreArg, Ty::kScore);
    switch (k % 6) {
      case 0: {
        static const float kConsts[] = {0.0f, 1.0f, -1.0f, 0.5f, 2.0f, 3.14159f, 1e-3f, 30.0f, -0.0f, 1e4f};
        return cst_f(chance(0.5) ? kConsts[uniform(0, 9)] : static_cast<float>(real(-5, 5)));
      }
      case 1: return named(Op::kScalarF, Ty::kScore, kFloatScalars[uniform(0, 1)]);
      case 2: {
        NodeP l = load(true, 0, score_ok);
        if (l) return l;
        [[fallthrough]];
      }
      default: return mk(Op::kIToF, Ty::kScore, {index_leaf(score_ok)});
    }
  }
  NodeP bool_leaf(bool score_ok) {
    if (chance(0.05)) {
      NodeP n = mk(Op::kConstB, Ty::kBool);
      const_cast<Node&>(*n).i = chance(0.5);
      return n;
    }
    return cmp(Op::kCmpI, uniform(0, 5), index_leaf(score_ok), index_leaf(score_ok));
  }

  // An in-range index into dimension `n` computed from `e`: a clamp, a double modulo, or nested
  // wheres.
  NodeP in_range(NodeP e, int64_t n) {
    NodeP nn = cst_i(static_cast<int32_t>(n));
    switch (uniform(0, 2)) {
      case 0:
        return mk(Op::kMinI, Ty::kIndex,
                  {mk(Op::kMaxI, Ty::kIndex, {e, cst_i(0)}), cst_i(static_cast<int32_t>(n - 1))});
      case 1:
        return mk(Op::kRemI, Ty::kIndex,
                  {mk(Op::kAddI, Ty::kIndex, {mk(Op::kRemI, Ty::kIndex, {e, nn}), nn}), nn});
      default:
        return mk(
            Op::kWhere, Ty::kIndex,
            {cmp(Op::kCmpI, 0, e, cst_i(0)), cst_i(0),
             mk(Op::kWhere, Ty::kIndex, {cmp(Op::kCmpI, 3, e, nn), cst_i(static_cast<int32_t>(n - 1)), e})});
    }
  }

  // A load of a random buffer of the wanted type (null when the case has none).
  NodeP load(bool want_float, int depth, bool score_ok) {
    std::vector<const BufferSpec*> pool;
    for (const BufferSpec& b : *buffers_)
      if (b.is_float == want_float) pool.push_back(&b);
    if (pool.empty()) return nullptr;
    const BufferSpec& b = *pool[uniform(0, static_cast<int>(pool.size()) - 1)];
    std::vector<NodeP> idx;
    for (int64_t d : b.shape)
      idx.push_back(in_range(depth > 0 ? index(depth - 1, score_ok) : index_leaf(false), d));
    return named(want_float ? Op::kLoadF : Op::kLoadI, want_float ? Ty::kScore : Ty::kIndex, b.name, idx);
  }

  // A divisor: never 0 and never -1 (so neither division by zero nor INT_MIN / -1).
  NodeP divisor(int depth, bool score_ok) {
    switch (uniform(0, 2)) {
      case 0: {
        int v = uniform(2, 9);
        return cst_i(chance(0.3) ? -v : v);
      }
      case 1: return named(Op::kScalarI, Ty::kIndex, kDivScalars[uniform(0, 1)]);
      default: {
        NodeP e = index(depth, score_ok);
        return mk(
            Op::kWhere, Ty::kIndex,
            {cmp(Op::kCmpI, 2, e, cst_i(0)),
             mk(Op::kAddI, Ty::kIndex, {mk(Op::kRemI, Ty::kIndex, {e, cst_i(7)}), cst_i(1)}), cst_i(3)});
      }
    }
  }

  // ---- inner nodes ----
  bool text = false;  // may use the MLIR-text-only ops

  NodeP index(int depth, bool score_ok) {
    if (depth <= 0 || chance(0.25)) return index_leaf(score_ok);
    int d = depth - 1;
    if (text && chance(0.35)) {
      static const Op kDiv[] = {Op::kDivUI, Op::kRemUI, Op::kFloorDivI, Op::kCeilDivI};
      static const Op kBin[] = {Op::kMinUI, Op::kMaxUI, Op::kAndI, Op::kOrI, Op::kXorI};
      static const Op kShift[] = {Op::kShlI, Op::kShrSI, Op::kShrUI};
      switch (uniform(0, 4)) {
        case 0: return mk(kDiv[uniform(0, 3)], Ty::kIndex, {index(d, score_ok), divisor(d, score_ok)});
        case 1: return mk(kBin[uniform(0, 4)], Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
        case 2:
          return mk(kShift[uniform(0, 2)], Ty::kIndex,
                    {index(d, score_ok), mk(Op::kAndI, Ty::kIndex, {index(d, score_ok), cst_i(31)})});
        case 3: return mk(Op::kFToUI, Ty::kIndex, {score(d, score_ok)});
        default: return mk(Op::kExtSI, Ty::kIndex, {boolean(d, score_ok)});
      }
    }
    switch (uniform(0, 13)) {
      case 0: return mk(Op::kAddI, Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
      case 1: return mk(Op::kSubI, Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
      case 2: return mk(Op::kMulI, Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
      case 3: return mk(Op::kDivI, Ty::kIndex, {index(d, score_ok), divisor(d, score_ok)});
      case 4: return mk(Op::kRemI, Ty::kIndex, {index(d, score_ok), divisor(d, score_ok)});
      case 5: return mk(Op::kMinI, Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
      case 6: return mk(Op::kMaxI, Ty::kIndex, {index(d, score_ok), index(d, score_ok)});
      case 7: return mk(Op::kAbsI, Ty::kIndex, {index(d, score_ok)});
      case 8: return mk(Op::kNegI, Ty::kIndex, {index(d, score_ok)});
      case 9:
        return mk(Op::kWhere, Ty::kIndex, {boolean(d, score_ok), index(d, score_ok), index(d, score_ok)});
      case 10: return mk(Op::kFToI, Ty::kIndex, {score(d, score_ok)});
      case 11: return mk(Op::kBToI, Ty::kIndex, {boolean(d, score_ok)});
      default: {
        NodeP l = load(false, d, score_ok);
        return l ? l : index(d, score_ok);
      }
    }
  }

  NodeP score(int depth, bool score_ok) {
    if (depth <= 0 || chance(0.2)) return score_leaf(score_ok);
    int d = depth - 1;
    if (text && chance(0.2)) {
      switch (uniform(0, 2)) {
        case 0: return mk(Op::kMaxNumF, Ty::kScore, {score(d, score_ok), score(d, score_ok)});
        case 1: return mk(Op::kMinNumF, Ty::kScore, {score(d, score_ok), score(d, score_ok)});
        default: return mk(Op::kUIToF, Ty::kScore, {index(d, score_ok)});
      }
    }
    static const Op kBin[] = {Op::kAddF, Op::kSubF, Op::kMulF, Op::kDivF, Op::kMinF,
                              Op::kMaxF, Op::kPowF, Op::kRemF, Op::kAddF, Op::kMulF};
    static const Op kUn[] = {Op::kNegF, Op::kAbsF,  Op::kExp,  Op::kExp2,  Op::kLog,
                             Op::kLog2, Op::kTanh,  Op::kSqrt, Op::kRsqrt, Op::kSin,
                             Op::kCos,  Op::kFloor, Op::kCeil, Op::kErf,   Op::kSigmoid};
    switch (uniform(0, 9)) {
      case 0:
      case 1:
      case 2:
      case 3: return mk(kBin[uniform(0, 9)], Ty::kScore, {score(d, score_ok), score(d, score_ok)});
      case 4:
      case 5: return mk(kUn[uniform(0, 14)], Ty::kScore, {score(d, score_ok)});
      case 6:
        return mk(Op::kWhere, Ty::kScore, {boolean(d, score_ok), score(d, score_ok), score(d, score_ok)});
      case 7: return mk(Op::kIToF, Ty::kScore, {index(d, score_ok)});
      case 8: return mk(Op::kBToF, Ty::kScore, {boolean(d, score_ok)});
      default: {
        NodeP l = load(true, d, score_ok);
        return l ? l : score(d, score_ok);
      }
    }
  }

  NodeP boolean(int depth, bool score_ok) {
    if (depth <= 0 || chance(0.2)) return bool_leaf(score_ok);
    int d = depth - 1;
    if (text && chance(0.3)) {
      switch (uniform(0, 2)) {
        case 0: return cmp(Op::kCmpFX, uniform(0, 13), score(d, score_ok), score(d, score_ok));
        case 1: return cmp(Op::kCmpIU, uniform(0, 3), index(d, score_ok), index(d, score_ok));
        default: return mk(Op::kTruncI, Ty::kBool, {index(d, score_ok)});
      }
    }
    switch (uniform(0, 7)) {
      case 0:
      case 1: return cmp(Op::kCmpI, uniform(0, 5), index(d, score_ok), index(d, score_ok));
      case 2: return cmp(Op::kCmpF, uniform(0, 5), score(d, score_ok), score(d, score_ok));
      case 3: return mk(Op::kAnd, Ty::kBool, {boolean(d, score_ok), boolean(d, score_ok)});
      case 4: return mk(Op::kOr, Ty::kBool, {boolean(d, score_ok), boolean(d, score_ok)});
      case 5: return mk(Op::kNot, Ty::kBool, {boolean(d, score_ok)});
      case 6: return cmp(Op::kCmpB, uniform(4, 5), boolean(d, score_ok), boolean(d, score_ok));
      default:
        return mk(Op::kWhere, Ty::kBool, {boolean(d, score_ok), boolean(d, score_ok), boolean(d, score_ok)});
    }
  }

  // A mask with some structure: often a causal / window / document-like core combined with
  // random conditions, so blocks come out empty, full and partial, and rows fully masked.
  NodeP mask(int depth) {
    NodeP q = mk(Op::kQ, Ty::kIndex), kv = mk(Op::kKv, Ty::kIndex);
    NodeP core;
    switch (uniform(0, 5)) {
      case 0: core = cmp(Op::kCmpI, 3, q, kv); break;  // causal
      case 1:
        core =
            mk(Op::kAnd, Ty::kBool,
               {cmp(Op::kCmpI, 3, q, kv), cmp(Op::kCmpI, 1, mk(Op::kSubI, Ty::kIndex, {q, kv}),
                                              named(Op::kScalarI, Ty::kIndex, kIntScalars[uniform(0, 1)]))});
        break;
      case 2: {
        NodeP l1 = load(false, 0, false);
        core = l1 ? cmp(Op::kCmpI, 4, l1, load(false, 0, false)) : cmp(Op::kCmpI, 0, kv, q);
        break;
      }
      default: core = boolean(depth, false); break;
    }
    if (chance(0.5)) return core;
    return mk(chance(0.5) ? Op::kAnd : Op::kOr, Ty::kBool, {core, boolean(depth, false)});
  }

  // score ± rate·(kv − q) or (q − kv), in either operand order, the rate a random score-free
  // graph that does not read kv (else a constant or a float scalar): what codegen finds kv-linear.
  NodeP kv_linear_score_mod(int depth) {
    NodeP rate = score(depth, false);
    if (reads(rate, Op::kKv))
      rate = chance(0.5) ? cst_f(static_cast<float>(real(-0.5, 0.5)))
                         : named(Op::kScalarF, Ty::kScore, kFloatScalars[uniform(0, 1)]);
    NodeP q = mk(Op::kQ, Ty::kIndex), kv = mk(Op::kKv, Ty::kIndex);
    NodeP d = mk(Op::kIToF, Ty::kScore,
                 {chance(0.5) ? mk(Op::kSubI, Ty::kIndex, {kv, q}) : mk(Op::kSubI, Ty::kIndex, {q, kv})});
    NodeP t = chance(0.5) ? mk(Op::kMulF, Ty::kScore, {rate, d}) : mk(Op::kMulF, Ty::kScore, {d, rate});
    NodeP s = mk(Op::kScoreArg, Ty::kScore);
    if (chance(0.3)) return mk(Op::kSubF, Ty::kScore, {s, t});
    return chance(0.5) ? mk(Op::kAddF, Ty::kScore, {s, t}) : mk(Op::kAddF, Ty::kScore, {t, s});
  }
  // A mask that keeps one interval of keys a row (what codegen finds kMaskKvRange): compares of
  // kv, kv − q or q − kv (either operand order) with index graphs that do not read kv, else an int
  // scalar or a bound at int32's ends (wrapped sums, empty and all-key rows), joined by `and`, by
  // `or` of two half-lines open on the same side, and with booleans of the row.
  NodeP kv_range_leaf(int depth, int side) {  // side: 0 bounds kv above, 1 below, -1 either or both
    static const int32_t kEnds[] = {2147483647, -2147483647 - 1, -2147483647, -1, 0, 7, 1000, -40};
    NodeP q = mk(Op::kQ, Ty::kIndex), kv = mk(Op::kKv, Ty::kIndex);
    const int form = uniform(0, 2);  // kv, kv − q, q − kv
    NodeP f = form == 0 ? kv : mk(Op::kSubI, Ty::kIndex, {form == 1 ? kv : q, form == 1 ? q : kv});
    NodeP x = index(depth, false);
    if (reads(x, Op::kKv))
      x = chance(0.5) ? named(Op::kScalarI, Ty::kIndex, kIntScalars[uniform(0, 1)])
                      : cst_i(kEnds[uniform(0, 7)]);
    // slt 0, sle 1, sgt 2, sge 3, eq 4: f < x bounds kv above unless f is q − kv.
    int pred = side < 0 ? uniform(0, 4) : (side == 0) == (form != 2) ? uniform(0, 1) : uniform(2, 3);
    if (chance(0.5)) return cmp(Op::kCmpI, pred, f, x);
    static const int kSwapped[] = {2, 3, 0, 1, 4};
    return cmp(Op::kCmpI, kSwapped[pred], x, f);
  }
  NodeP kv_range_mask(int depth) {
    switch (uniform(0, 3)) {
      case 0: return kv_range_leaf(depth, -1);
      case 1: return mk(Op::kAnd, Ty::kBool, {kv_range_leaf(depth, -1), kv_range_leaf(depth, -1)});
      case 2: {
        const int side = uniform(0, 1);
        return mk(Op::kOr, Ty::kBool, {kv_range_leaf(depth, side), kv_range_leaf(depth, side)});
      }
      default: {
        NodeP row = boolean(depth, false);
        if (reads(row, Op::kKv))
          row = cmp(Op::kCmpI, 3, mk(Op::kQ, Ty::kIndex),
                    named(Op::kScalarI, Ty::kIndex, kIntScalars[uniform(0, 1)]));
        NodeP r = depth > 0 ? kv_range_mask(depth - 1) : kv_range_leaf(0, -1);
        return chance(0.5) ? mk(Op::kAnd, Ty::kBool, {r, row}) : mk(Op::kAnd, Ty::kBool, {row, r});
      }
    }
  }
  static bool reads(const NodeP& n, Op op) {
    if (n->op == op) return true;
    for (const NodeP& k : n->kids)
      if (reads(k, op)) return true;
    return false;
  }
  void use_buffers(std::vector<BufferSpec>* b) { buffers_ = b; }

  NodeP score_mod(int depth) {
    NodeP s = mk(Op::kScoreArg, Ty::kScore);
    switch (uniform(0, 3)) {
      case 0: return s;  // identity
      case 1: return mk(Op::kAddF, Ty::kScore, {s, score(depth, true)});
      default: return score(depth, true);
    }
  }

 private:
  static uint64_t mix(uint64_t seed, int index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::mt19937_64 rng_;
  const std::vector<BufferSpec>* buffers_ = nullptr;
};

void collect_names(const NodeP& n, std::set<std::string>& out) {
  if (!n->name.empty()) out.insert(n->name);
  for (const NodeP& k : n->kids) collect_names(k, out);
}

int length(Gen& g) {
  if (g.chance(0.3)) return g.uniform(1, 300);
  return g.uniform(1, 5000);
}

// A length near `len` on a tile's edge (generate_case's tile_edges): a multiple of a block
// height the kernels use, 64 or 128 rows more on the 192-row tiles (most often 64: the
// persistent forward leads such a partial block), or a row either side.
int edge_length(Gen& g, int len) {
  static constexpr int kBlocks[] = {192, 128, 112, 64};
  const int block = g.chance(0.5) ? 192 : kBlocks[g.uniform(1, 3)];
  const int base = block * std::max(1, len / block);
  if (block == 192 && g.chance(0.6)) return base + (g.chance(0.7) ? 64 : 128);
  return std::max(1, base + g.uniform(-1, 1));
}

}  // namespace

Case generate_case(uint64_t seed, int index, bool kv_linear, bool kv_range, bool tile_edges) {
  Gen g(seed, index);
  Case c;
  c.seed = seed;
  c.index = index;
  g.make_captures(c);
  c.text = g.chance(0.4);
  g.text = c.text;
  c.score = g.score_mod(g.uniform(1, 5));
  c.mask = g.mask(g.uniform(1, 4));
  // The rewrites draw from streams of their own: the rest of the case is drawn as without them.
  auto rewrite_stream = [&](uint64_t salt) {
    Gen k(seed ^ salt, index);
    k.text = c.text;
    k.use_buffers(&c.buffers);
    return k;
  };
  if (kv_linear) {
    Gen k = rewrite_stream(0x6b766c696e656172ull);
    if (k.chance(0.5)) c.score = k.kv_linear_score_mod(k.uniform(0, 3)), c.kv_linear = true;
  }
  if (kv_range) {
    Gen k = rewrite_stream(0x6b7672616e676573ull);
    if (k.chance(0.5)) c.mask = k.kv_range_mask(k.uniform(0, 2)), c.kv_range = true;
  }
  // Keep only the captures the graphs read.
  std::set<std::string> used;
  collect_names(c.score, used);
  collect_names(c.mask, used);
  c.buffers.erase(std::remove_if(c.buffers.begin(), c.buffers.end(),
                                 [&](const BufferSpec& b) { return !used.count(b.name); }),
                  c.buffers.end());
  c.scalars.erase(std::remove_if(c.scalars.begin(), c.scalars.end(),
                                 [&](const ScalarSpec& s) { return !used.count(s.name); }),
                  c.scalars.end());

  Shape& s = c.shape;
  s.batch = g.uniform(1, 3);
  s.heads_kv = g.uniform(1, 4);
  s.heads_q = s.heads_kv * (g.chance(0.5) ? 1 : g.uniform(2, 4));
  s.len_q = length(g);
  s.len_kv = g.chance(0.2) ? s.len_q : length(g);
  if (tile_edges) {
    Gen k = rewrite_stream(0x74696c6565646765ull);
    if (k.chance(0.5)) {
      const bool same = s.len_kv == s.len_q;
      s.len_q = edge_length(k, s.len_q);
      s.len_kv = same ? s.len_q : k.chance(0.5) ? edge_length(k, s.len_kv) : s.len_kv;
      c.tile_edges = true;
    }
  }
  if (g.chance(0.6)) {  // the common head dims
    s.dim_qk = g.chance(0.5) ? 64 : 128;
    s.dim_v = g.chance(0.7) ? s.dim_qk : 192 - s.dim_qk;
  } else {  // any multiple of 8 from 32 to 256 (the mma.sync kernels)
    s.dim_qk = 8 * g.uniform(4, 32);
    s.dim_v = g.chance(0.5) ? s.dim_qk : 8 * g.uniform(4, 32);
  }
  s.dtype = g.chance(0.5) ? fa::DType::bf16 : fa::DType::f16;
  // The float64 reference of the GPU mode costs B * Hq * Lq * Lkv * D: about 2e7 pairs at most
  // (2.6e7 where one head of two tile-edge lengths already passes it), so long sequences come
  // with few heads.
  while (int64_t(s.batch) * s.heads_q * s.len_q * s.len_kv > 20000000 && s.batch * s.heads_q > 1) {
    if (s.batch > 1)
      --s.batch;
    else if (s.heads_q > s.heads_kv)
      s.heads_q -= s.heads_kv;
    else
      s.heads_q = s.heads_kv = s.heads_kv - 1;
  }
  c.small = s;
  c.small.batch = g.uniform(1, 2);
  c.small.heads_kv = g.uniform(1, 2);
  c.small.heads_q = c.small.heads_kv * g.uniform(1, 2);
  c.small.len_q = g.uniform(1, 300);
  c.small.len_kv = g.chance(0.2) ? c.small.len_q : g.uniform(1, 300);
  c.arch = g.chance(0.5) ? "sm_80" : "sm_90a";
  return c;
}

// ---- printing ------------------------------------------------------------------------------
namespace {
const char* const kPred[] = {"<", "<=", ">", ">=", "==", "!="};
const char* const kCmpFPreds[] = {"olt", "ole", "ogt", "oge", "oeq", "one", "ueq",
                                  "ult", "ule", "ugt", "uge", "une", "ord", "uno"};
const char* const kCmpIUPreds[] = {"ult", "ule", "ugt", "uge"};

const char* fn_name(Op op) {
  switch (op) {
    case Op::kMinI:
    case Op::kMinF: return "min";
    case Op::kMaxI:
    case Op::kMaxF: return "max";
    case Op::kAbsI:
    case Op::kAbsF: return "abs";
    case Op::kPowF: return "pow";
    case Op::kExp: return "exp";
    case Op::kExp2: return "exp2";
    case Op::kLog: return "log";
    case Op::kLog2: return "log2";
    case Op::kTanh: return "tanh";
    case Op::kSqrt: return "sqrt";
    case Op::kRsqrt: return "rsqrt";
    case Op::kSin: return "sin";
    case Op::kCos: return "cos";
    case Op::kFloor: return "floor";
    case Op::kCeil: return "ceil";
    case Op::kErf: return "erf";
    case Op::kSigmoid: return "sigmoid";
    case Op::kWhere: return "where";
    case Op::kIToF:
    case Op::kBToF: return "to_float";
    case Op::kFToI:
    case Op::kBToI: return "to_int";
    case Op::kDivUI: return "divui";
    case Op::kRemUI: return "remui";
    case Op::kFloorDivI: return "floordiv";
    case Op::kCeilDivI: return "ceildiv";
    case Op::kMinUI: return "minui";
    case Op::kMaxUI: return "maxui";
    case Op::kShlI: return "shl";
    case Op::kShrSI: return "shrs";
    case Op::kShrUI: return "shru";
    case Op::kMaxNumF: return "maxnum";
    case Op::kMinNumF: return "minnum";
    case Op::kFToUI: return "fptoui";
    case Op::kUIToF: return "uitofp";
    case Op::kExtSI: return "extsi";
    case Op::kTruncI: return "trunci";
    default: return nullptr;
  }
}
const char* infix(Op op) {
  switch (op) {
    case Op::kAddI:
    case Op::kAddF: return "+";
    case Op::kSubI:
    case Op::kSubF: return "-";
    case Op::kMulI:
    case Op::kMulF: return "*";
    case Op::kDivI:
    case Op::kDivF: return "/";
    case Op::kRemI:
    case Op::kRemF: return "%";
    case Op::kAnd: return "&&";
    case Op::kOr: return "||";
    case Op::kAndI: return "&";
    case Op::kOrI: return "|";
    case Op::kXorI: return "^";
    default: return nullptr;
  }
}
}  // namespace

std::string to_string(const NodeP& n) {
  auto k = [&](size_t i) { return to_string(n->kids[i]); };
  switch (n->op) {
    case Op::kScoreArg: return "score";
    case Op::kB: return "b";
    case Op::kH: return "h";
    case Op::kQ: return "q";
    case Op::kKv: return "kv";
    case Op::kConstF: return fmt::format("{}f", n->f);
    case Op::kConstI: return fmt::format("{}", n->i);
    case Op::kConstB: return n->i ? "true" : "false";
    case Op::kScalarF:
    case Op::kScalarI: return n->name;
    case Op::kLoadF:
    case Op::kLoadI: {
      std::string s = n->name + "(";
      for (size_t i = 0; i < n->kids.size(); ++i) s += (i ? ", " : "") + k(i);
      return s + ")";
    }
    case Op::kNegI:
    case Op::kNegF: return "-(" + k(0) + ")";
    case Op::kNot: return "!(" + k(0) + ")";
    case Op::kCmpI:
    case Op::kCmpF:
    case Op::kCmpB: return "(" + k(0) + " " + kPred[n->i] + " " + k(1) + ")";
    case Op::kCmpFX: return fmt::format("cmpf_{}({}, {})", kCmpFPreds[n->i], k(0), k(1));
    case Op::kCmpIU: return fmt::format("cmpi_{}({}, {})", kCmpIUPreds[n->i], k(0), k(1));
    default: break;
  }
  if (const char* s = infix(n->op)) return "(" + k(0) + " " + s + " " + k(1) + ")";
  std::string s = std::string(fn_name(n->op)) + "(";
  for (size_t i = 0; i < n->kids.size(); ++i) s += (i ? ", " : "") + k(i);
  return s + ")";
}

std::string describe(const Case& c) {
  std::string s = fmt::format("score_mod: {}\nmask_mod:  {}\n", to_string(c.score), to_string(c.mask));
  for (const ScalarSpec& sc : c.scalars)
    s += fmt::format("scalar {} ({}) = {}\n", sc.name, sc.is_float ? "f32" : "i32", sc.value);
  for (const BufferSpec& b : c.buffers) {
    s += fmt::format("buffer {} ({}) shape [{}]:", b.name, b.is_float ? "f32" : "i32",
                     fmt::join(b.shape, ", "));
    if (b.is_float)
      s += fmt::format(" {}\n", fmt::join(b.f, " "));
    else
      s += fmt::format(" {}\n", fmt::join(b.i, " "));
  }
  auto sh = [](const Shape& x) {
    return fmt::format("B={} Hq={} Hkv={} Lq={} Lkv={} Dqk={} Dv={} {}", x.batch, x.heads_q, x.heads_kv,
                       x.len_q, x.len_kv, x.dim_qk, x.dim_v, x.dtype == fa::DType::bf16 ? "bf16" : "f16");
  };
  if (c.kv_linear) s += "score_mod: the kv-linear rewrite (fajit fuzz --kv-linear)\n";
  if (c.kv_range) s += "mask_mod: the interval rewrite (fajit fuzz --kv-range)\n";
  s += fmt::format("shape: {}\nsmall shape (brute force): {}\narch: {}\nbuilt from: {}\n", sh(c.shape),
                   sh(c.small), c.arch, c.text ? "MLIR text (Program::parse)" : "the tracing frontend");
  return s;
}

// ---- lowering to the frontend ----------------------------------------------------------------
namespace {

struct Args {
  const fa::Score* score;
  fa::Index b, h, q, kv;
};

fa::detail::Sym lower(const NodeP& n, const Args& a, const Case& c) {
  using fa::Bool;
  using fa::Index;
  using fa::Score;
  auto S = [&](size_t i) { return Score(lower(n->kids[i], a, c)); };
  auto I = [&](size_t i) { return Index(lower(n->kids[i], a, c)); };
  auto B = [&](size_t i) { return Bool(lower(n->kids[i], a, c)); };
  auto rank_of = [&](const std::string& name) {
    for (const BufferSpec& b : c.buffers)
      if (b.name == name) return static_cast<int>(b.shape.size());
    return 1;
  };
  switch (n->op) {
    case Op::kScoreArg: return a.score->sym();
    case Op::kB: return a.b.sym();
    case Op::kH: return a.h.sym();
    case Op::kQ: return a.q.sym();
    case Op::kKv: return a.kv.sym();
    case Op::kConstF: return Score(n->f).sym();
    case Op::kConstI: return Index(n->i).sym();
    case Op::kConstB: return Bool(n->i != 0).sym();
    case Op::kScalarF: return fa::scalar<float>(n->name).value().sym();
    case Op::kScalarI: return fa::scalar<int32_t>(n->name).value().sym();
    case Op::kLoadF: {
      auto buf = fa::buffer<float>(n->name, rank_of(n->name));
      return (n->kids.size() == 1 ? buf(I(0)) : buf(I(0), I(1))).sym();
    }
    case Op::kLoadI: {
      auto buf = fa::buffer<int32_t>(n->name, rank_of(n->name));
      return (n->kids.size() == 1 ? buf(I(0)) : buf(I(0), I(1))).sym();
    }
    case Op::kAddI: return (I(0) + I(1)).sym();
    case Op::kSubI: return (I(0) - I(1)).sym();
    case Op::kMulI: return (I(0) * I(1)).sym();
    case Op::kDivI: return (I(0) / I(1)).sym();
    case Op::kRemI: return (I(0) % I(1)).sym();
    case Op::kMinI: return fa::min(I(0), I(1)).sym();
    case Op::kMaxI: return fa::max(I(0), I(1)).sym();
    case Op::kAbsI: return fa::abs(I(0)).sym();
    case Op::kNegI: return (-I(0)).sym();
    case Op::kAddF: return (S(0) + S(1)).sym();
    case Op::kSubF: return (S(0) - S(1)).sym();
    case Op::kMulF: return (S(0) * S(1)).sym();
    case Op::kDivF: return (S(0) / S(1)).sym();
    case Op::kRemF: return fa::detail::binary(fa::detail::BinOp::kRem, S(0).sym(), S(1).sym());
    case Op::kMinF: return fa::min(S(0), S(1)).sym();
    case Op::kMaxF: return fa::max(S(0), S(1)).sym();
    case Op::kPowF: return fa::pow(S(0), S(1)).sym();
    case Op::kNegF: return (-S(0)).sym();
    case Op::kAbsF: return fa::abs(S(0)).sym();
    case Op::kExp: return fa::exp(S(0)).sym();
    case Op::kExp2: return fa::exp2(S(0)).sym();
    case Op::kLog: return fa::log(S(0)).sym();
    case Op::kLog2: return fa::log2(S(0)).sym();
    case Op::kTanh: return fa::tanh(S(0)).sym();
    case Op::kSqrt: return fa::sqrt(S(0)).sym();
    case Op::kRsqrt: return fa::rsqrt(S(0)).sym();
    case Op::kSin: return fa::sin(S(0)).sym();
    case Op::kCos: return fa::cos(S(0)).sym();
    case Op::kFloor: return fa::floor(S(0)).sym();
    case Op::kCeil: return fa::ceil(S(0)).sym();
    case Op::kErf: return fa::erf(S(0)).sym();
    case Op::kSigmoid: return fa::sigmoid(S(0)).sym();
    case Op::kCmpI: {
      Index x = I(0), y = I(1);
      switch (n->i) {
        case 0: return (x < y).sym();
        case 1: return (x <= y).sym();
        case 2: return (x > y).sym();
        case 3: return (x >= y).sym();
        case 4: return (x == y).sym();
        default: return (x != y).sym();
      }
    }
    case Op::kCmpF: {
      Score x = S(0), y = S(1);
      switch (n->i) {
        case 0: return (x < y).sym();
        case 1: return (x <= y).sym();
        case 2: return (x > y).sym();
        case 3: return (x >= y).sym();
        case 4: return (x == y).sym();
        default: return (x != y).sym();
      }
    }
    case Op::kCmpB: return n->i == 4 ? (B(0) == B(1)).sym() : (B(0) != B(1)).sym();
    case Op::kAnd: return (B(0) && B(1)).sym();
    case Op::kOr: return (B(0) || B(1)).sym();
    case Op::kNot: return (!B(0)).sym();
    case Op::kWhere: return fa::detail::select(B(0).sym(), lower(n->kids[1], a, c), lower(n->kids[2], a, c));
    case Op::kIToF: return fa::to_float(I(0)).sym();
    case Op::kBToF: return fa::to_float(B(0)).sym();
    case Op::kFToI: return fa::to_int(S(0)).sym();
    case Op::kBToI: return fa::to_int(B(0)).sym();
    default: break;
  }
  throw fa::Error("fuzz: an MLIR-text-only op reached the frontend lowering");
}

}  // namespace

fa::ScoreMod score_mod_of(const Case& c) {
  return {"fuzz_score", [c](fa::Score s, fa::Index b, fa::Index h, fa::Index q, fa::Index kv) {
            Args a{&s, b, h, q, kv};
            return fa::Score(lower(c.score, a, c));
          }};
}

fa::MaskMod mask_mod_of(const Case& c) {
  return {"fuzz_mask", [c](fa::Index b, fa::Index h, fa::Index q, fa::Index kv) {
            Args a{nullptr, b, h, q, kv};
            return fa::Bool(lower(c.mask, a, c));
          }};
}

fa::Bindings bindings_of(const Case& c) {
  fa::Bindings env;
  for (const BufferSpec& b : c.buffers)
    env.buffer(b.name, b.is_float ? fa::HostBuffer::f32(b.f.data(), b.shape)
                                  : fa::HostBuffer::i32(b.i.data(), b.shape));
  for (const ScalarSpec& s : c.scalars) {
    if (s.is_float)
      env.scalar_f32(s.name, static_cast<float>(s.value));
    else
      env.scalar_i32(s.name, static_cast<int32_t>(s.value));
  }
  return env;
}

// ---- direct evaluation -------------------------------------------------------------------
namespace {

template <typename T>
struct Val {
  T f = 0;
  int32_t i = 0;
  bool b = false;
};

int32_t wrap(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }

template <typename T>
int32_t to_i32(T x) {  // fptosi: truncate, saturate, NaN -> 0
  if (std::isnan(x)) return 0;
  if (x >= T(2147483648.0)) return std::numeric_limits<int32_t>::max();
  if (x <= T(-2147483648.0)) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(std::trunc(x));
}

template <typename T>
T minimum(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
template <typename T>
T maximum(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

template <typename T>
struct Evaluator {
  const Case& c;
  T score;
  Point p;
  std::vector<int64_t>* br;
  const std::map<std::pair<std::string, int64_t>, double>* perturb;
  bool f32_invariants = false;  // float subtrees free of the score and perturbed buffers: in f32
  int ulps = 0;                 // each transcendental's finite result moved by this many ulps
  double magnitude = 0;         // the largest finite |float value| computed

  // A transcendental's result as a device's libm may give it: `ulps` ulps away (0: as is).
  T dev(T x) const {
    if (ulps == 0 || !std::isfinite(x)) return x;
    const T to = ulps > 0 ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
    for (int k = 0; k < std::abs(ulps); ++k) x = std::nextafter(x, to);
    return x;
  }

  void note(int64_t v) {
    if (br) br->push_back(v);
  }
  // The side of a singular point (x = 0 of a divisor, log, sqrt, rsqrt or pow base).
  void note_sign(T x) { note(std::isnan(x) ? 2 : x > 0 ? 1 : x < 0 ? -1 : 0); }
  T sing(T x) {
    note_sign(x);
    return x;
  }

  Val<T> load(const NodeP& n) {
    const BufferSpec* b = nullptr;
    for (const BufferSpec& x : c.buffers)
      if (x.name == n->name) b = &x;
    if (!b) throw fa::Error("fuzz: unknown buffer " + n->name);
    int64_t flat = 0;
    for (size_t d = 0; d < n->kids.size(); ++d) {
      int32_t ix = run(n->kids[d]).i;
      if (ix < 0 || ix >= b->shape[d])
        throw fa::Error(fmt::format("fuzz: generated index {} out of range for {} dim {}", ix, b->name, d));
      flat = flat * b->shape[d] + ix;
    }
    Val<T> v;
    if (b->is_float) {
      v.f = static_cast<T>(b->f[flat]);
      if (perturb) {
        auto it = perturb->find({b->name, flat});
        if (it != perturb->end()) v.f = static_cast<T>(static_cast<double>(v.f) + it->second);
      }
    } else {
      v.i = b->i[flat];
    }
    return v;
  }

  // Whether n reads the score or a buffer `perturb` moves (the variable of a difference).
  bool varies(const NodeP& n) const {
    if (n->op == Op::kScoreArg) return true;
    if (n->op == Op::kLoadF && perturb)
      for (const auto& [key, t] : *perturb)
        if (key.first == n->name) return true;
    for (const NodeP& k : n->kids)
      if (varies(k)) return true;
    return false;
  }

  Val<T> run(const NodeP& n) {
    Val<T> v;
    if constexpr (!std::is_same_v<T, float>) {
      if (f32_invariants && n->ty == Ty::kScore && !varies(n)) {
        Evaluator<float> e{c, 0.0f, p, br, nullptr};
        v.f = static_cast<T>(e.run(n).f);
        return v;
      }
    }
    auto F = [&](size_t i) { return run(n->kids[i]).f; };
    auto I = [&](size_t i) { return run(n->kids[i]).i; };
    auto B = [&](size_t i) { return run(n->kids[i]).b; };
    switch (n->op) {
      case Op::kScoreArg: v.f = score; break;
      case Op::kB: v.i = p.b; break;
      case Op::kH: v.i = p.h; break;
      case Op::kQ: v.i = p.q; break;
      case Op::kKv: v.i = p.kv; break;
      case Op::kConstF: v.f = static_cast<T>(n->f); break;
      case Op::kConstI: v.i = n->i; break;
      case Op::kConstB: v.b = n->i != 0; break;
      case Op::kScalarF:
      case Op::kScalarI:
        for (const ScalarSpec& s : c.scalars)
          if (s.name == n->name) {
            v.f = static_cast<T>(static_cast<float>(s.value));
            v.i = static_cast<int32_t>(s.value);
          }
        break;
      case Op::kLoadF:
      case Op::kLoadI: v = load(n); break;
      case Op::kAddI: v.i = wrap(int64_t(I(0)) + I(1)); break;
      case Op::kSubI: v.i = wrap(int64_t(I(0)) - I(1)); break;
      case Op::kMulI: v.i = wrap(int64_t(I(0)) * I(1)); break;
      case Op::kDivI:
      case Op::kRemI: {
        int32_t x = I(0), y = I(1);
        if (y == 0 || y == -1) throw fa::Error("fuzz: generated divisor 0 or -1");
        v.i = n->op == Op::kDivI ? x / y : x % y;
        break;
      }
      case Op::kMinI: v.i = std::min(I(0), I(1)); break;
      case Op::kMaxI: v.i = std::max(I(0), I(1)); break;
      case Op::kAbsI: {
        int32_t x = I(0);
        v.i = x < 0 ? wrap(-int64_t(x)) : x;
        break;
      }
      case Op::kNegI: v.i = wrap(-int64_t(I(0))); break;
      case Op::kAddF: v.f = F(0) + F(1); break;
      case Op::kSubF: v.f = F(0) - F(1); break;
      case Op::kMulF: v.f = F(0) * F(1); break;
      case Op::kDivF: {
        T x = F(0), y = F(1);
        v.f = x / y;
        note_sign(y);  // a pole at y = 0
        break;
      }
      case Op::kRemF: {
        T x = F(0), y = F(1);
        v.f = std::fmod(x, y);
        note(static_cast<int64_t>(std::isfinite(x / y) ? std::trunc(x / y) : -7));
        break;
      }
      case Op::kMinF:
      case Op::kMaxF: {
        T x = F(0), y = F(1);
        v.f = n->op == Op::kMinF ? minimum(x, y) : maximum(x, y);
        note(std::isnan(x) || std::isnan(y) ? 3 + std::isnan(x) + 2 * std::isnan(y)
             : x < y                        ? 0
             : x == y                       ? 1
                                            : 2);
        break;
      }
      case Op::kPowF: {
        T x = F(0), y = F(1);
        v.f = dev(std::pow(x, y));
        note_sign(x);
        break;
      }
      case Op::kNegF: v.f = -F(0); break;
      case Op::kAbsF: {
        T x = F(0);
        v.f = std::fabs(x);
        note(x > 0 ? 1 : x < 0 ? -1 : 0);
        break;
      }
      case Op::kExp: v.f = dev(std::exp(F(0))); break;
      case Op::kExp2: v.f = dev(std::exp2(F(0))); break;
      case Op::kLog: v.f = dev(std::log(sing(F(0)))); break;
      case Op::kLog2: v.f = dev(std::log2(sing(F(0)))); break;
      case Op::kTanh: v.f = dev(std::tanh(F(0))); break;
      case Op::kSqrt: v.f = std::sqrt(sing(F(0))); break;  // correctly rounded on the device too
      case Op::kRsqrt: v.f = dev(T(1) / std::sqrt(sing(F(0)))); break;
      case Op::kSin: v.f = dev(std::sin(F(0))); break;
      case Op::kCos: v.f = dev(std::cos(F(0))); break;
      case Op::kFloor:
      case Op::kCeil: {
        v.f = n->op == Op::kFloor ? std::floor(F(0)) : std::ceil(F(0));
        note(static_cast<int64_t>(to_i32(v.f)));
        break;
      }
      case Op::kErf: v.f = dev(std::erf(F(0))); break;
      case Op::kSigmoid: v.f = dev(T(1) / (T(1) + std::exp(-F(0)))); break;
      case Op::kCmpI: {
        int32_t x = I(0), y = I(1);
        const bool r[] = {x<y, x <= y, x> y, x >= y, x == y, x != y};
        v.b = r[n->i];
        break;
      }
      case Op::kCmpF: {
        T x = F(0), y = F(1);
        const bool r[] = {x<y, x <= y, x> y, x >= y, x == y, x != y};
        v.b = r[n->i];
        note(v.b);
        break;
      }
      case Op::kCmpB: v.b = n->i == 4 ? B(0) == B(1) : B(0) != B(1); break;
      case Op::kAnd:
      case Op::kOr: {  // both sides evaluated, as the IR does (no short circuit)
        bool x = B(0), y = B(1);
        v.b = n->op == Op::kAnd ? x && y : x || y;
        break;
      }
      case Op::kNot: v.b = !B(0); break;
      case Op::kWhere: {
        bool cnd = B(0);
        note(cnd);
        // Both sides are evaluated (as the IR does), so loads stay checked.
        Val<T> x = run(n->kids[1]), y = run(n->kids[2]);
        v = cnd ? x : y;
        break;
      }
      case Op::kIToF: v.f = static_cast<T>(static_cast<float>(I(0))); break;
      case Op::kBToF: v.f = B(0) ? T(1) : T(0); break;
      case Op::kFToI: {
        T x = F(0);
        v.i = to_i32(x);
        note(v.i);
        break;
      }
      case Op::kBToI: v.i = B(0) ? 1 : 0; break;
      case Op::kDivUI:
      case Op::kRemUI:
      case Op::kFloorDivI:
      case Op::kCeilDivI: {
        int32_t x = I(0), y = I(1);
        if (y == 0 || y == -1) throw fa::Error("fuzz: generated divisor 0 or -1");
        uint32_t ux = uint32_t(x), uy = uint32_t(y);
        int32_t qt = x / y, r = x % y;
        if (n->op == Op::kDivUI)
          v.i = int32_t(ux / uy);
        else if (n->op == Op::kRemUI)
          v.i = int32_t(ux % uy);
        else if (n->op == Op::kFloorDivI)
          v.i = (r != 0 && ((r < 0) != (y < 0))) ? qt - 1 : qt;
        else
          v.i = (r != 0 && ((r < 0) == (y < 0))) ? qt + 1 : qt;
        break;
      }
      case Op::kMinUI: v.i = int32_t(std::min(uint32_t(I(0)), uint32_t(I(1)))); break;
      case Op::kMaxUI: v.i = int32_t(std::max(uint32_t(I(0)), uint32_t(I(1)))); break;
      case Op::kShlI:
      case Op::kShrSI:
      case Op::kShrUI: {
        int32_t x = I(0), a = I(1);
        if (a < 0 || a > 31) throw fa::Error("fuzz: generated shift amount out of range");
        v.i = n->op == Op::kShlI    ? int32_t(uint32_t(x) << a)
              : n->op == Op::kShrSI ? (x >> a)
                                    : int32_t(uint32_t(x) >> a);
        break;
      }
      case Op::kAndI: v.i = I(0) & I(1); break;
      case Op::kOrI: v.i = I(0) | I(1); break;
      case Op::kXorI: v.i = I(0) ^ I(1); break;
      case Op::kMaxNumF:
      case Op::kMinNumF: {
        T x = F(0), y = F(1);
        if (std::isnan(x))
          v.f = y;
        else if (std::isnan(y))
          v.f = x;
        else
          v.f = n->op == Op::kMinNumF ? minimum(x, y) : maximum(x, y);
        note(std::isnan(x) || std::isnan(y) ? 3 + std::isnan(x) + 2 * std::isnan(y)
             : x < y                        ? 0
             : x == y                       ? 1
                                            : 2);
        break;
      }
      case Op::kCmpFX: {
        T x = F(0), y = F(1);
        bool ord = !std::isnan(x) && !std::isnan(y);
        const bool rel[] = {x<y, x <= y, x> y, x >= y, x == y, x != y};
        int pr = n->i;
        v.b = pr < 6     ? ord && rel[pr]       // olt ole ogt oge oeq one
              : pr == 6  ? !ord || x == y       // ueq
              : pr < 11  ? !ord || rel[pr - 7]  // ult ule ugt uge
              : pr == 11 ? !ord || x != y       // une
              : pr == 12 ? ord
                         : !ord;  // ord, uno
        note(v.b);
        break;
      }
      case Op::kCmpIU: {
        uint32_t x = uint32_t(I(0)), y = uint32_t(I(1));
        const bool r[] = {x<y, x <= y, x> y, x >= y};
        v.b = r[n->i];
        break;
      }
      case Op::kFToUI: {
        T x = F(0);
        v.i = std::isnan(x) || x <= T(0) ? 0 : x >= T(4294967296.0) ? -1 : int32_t(uint32_t(std::trunc(x)));
        note(v.i);
        break;
      }
      case Op::kUIToF: v.f = static_cast<T>(static_cast<float>(uint32_t(I(0)))); break;
      case Op::kExtSI: v.i = B(0) ? -1 : 0; break;
      case Op::kTruncI: v.b = (I(0) & 1) != 0; break;
    }
    if (n->ty == Ty::kScore && std::isfinite(v.f)) magnitude = std::max(magnitude, std::fabs(double(v.f)));
    return v;
  }
};

}  // namespace

template <typename T>
T eval_score(const Case& c, const NodeP& n, T score, const Point& p, std::vector<int64_t>* branches,
             const std::map<std::pair<std::string, int64_t>, double>* perturb, double* magnitude,
             bool f32_invariants, int ulps) {
  Evaluator<T> e{c, score, p, branches, perturb, f32_invariants, ulps};
  T r = e.run(n).f;
  if (magnitude) *magnitude = e.magnitude;
  return r;
}
template float eval_score<float>(const Case&, const NodeP&, float, const Point&, std::vector<int64_t>*,
                                 const std::map<std::pair<std::string, int64_t>, double>*, double*, bool,
                                 int);
template double eval_score<double>(const Case&, const NodeP&, double, const Point&, std::vector<int64_t>*,
                                   const std::map<std::pair<std::string, int64_t>, double>*, double*, bool,
                                   int);

bool eval_mask(const Case& c, const Point& p) {
  Evaluator<float> e{c, 0.0f, p, nullptr, nullptr};
  return e.run(c.mask).b;
}

// ---- MLIR text -----------------------------------------------------------------------------
namespace {

const char* type_name(Ty t) { return t == Ty::kScore ? "f32" : t == Ty::kIndex ? "i32" : "i1"; }

struct Emitter {
  const Case& c;
  std::string body;
  std::vector<std::string> captures;  // buffer names, first-use order
  int next = 0;

  std::string line(const std::string& rhs) {
    std::string v = fmt::format("%v{}", next++);
    body += fmt::format("    {} = {}\n", v, rhs);
    return v;
  }
  std::string buffer_type(const std::string& name) {
    for (const BufferSpec& b : c.buffers)
      if (b.name == name)
        return fmt::format("!fa.buffer<{}, {}>", b.is_float ? "f32" : "i32", b.shape.size());
    throw fa::Error("fuzz: unknown buffer " + name);
  }

  std::string run(const NodeP& n) {
    auto k = [&](size_t i) { return run(n->kids[i]); };
    auto bin = [&](const char* op) {
      std::string a = k(0), b = k(1);
      return line(fmt::format("{} {}, {} : {}", op, a, b, type_name(n->kids[0]->ty)));
    };
    auto un = [&](const char* op) {
      std::string a = k(0);
      return line(fmt::format("{} {} : {}", op, a, type_name(n->kids[0]->ty)));
    };
    auto conv = [&](const char* op) {
      std::string a = k(0);
      return line(fmt::format("{} {} : {} to {}", op, a, type_name(n->kids[0]->ty), type_name(n->ty)));
    };
    static const char* const kCmpI[] = {"slt", "sle", "sgt", "sge", "eq", "ne"};
    static const char* const kCmpF[] = {"olt", "ole", "ogt", "oge", "oeq", "une"};
    switch (n->op) {
      case Op::kScoreArg: return "%score";
      case Op::kB: return "%b";
      case Op::kH: return "%h";
      case Op::kQ: return "%q";
      case Op::kKv: return "%kv";
      case Op::kConstF: {
        uint32_t bits;
        std::memcpy(&bits, &n->f, 4);
        return line(fmt::format("arith.constant 0x{:08X} : f32", bits));
      }
      case Op::kConstI: return line(fmt::format("arith.constant {} : i32", n->i));
      case Op::kConstB: return line(n->i ? "arith.constant true" : "arith.constant false");
      case Op::kScalarF:
      case Op::kScalarI: return line(fmt::format("fa.scalar \"{}\" : {}", n->name, type_name(n->ty)));
      case Op::kLoadF:
      case Op::kLoadI: {
        std::vector<std::string> idx;
        for (size_t i = 0; i < n->kids.size(); ++i) idx.push_back(k(i));
        if (std::find(captures.begin(), captures.end(), n->name) == captures.end())
          captures.push_back(n->name);
        return line(fmt::format("fa.load %{}[{}] : {}", n->name, fmt::join(idx, ", "), buffer_type(n->name)));
      }
      case Op::kAddI: return bin("arith.addi");
      case Op::kSubI: return bin("arith.subi");
      case Op::kMulI: return bin("arith.muli");
      case Op::kDivI: return bin("arith.divsi");
      case Op::kRemI: return bin("arith.remsi");
      case Op::kMinI: return bin("arith.minsi");
      case Op::kMaxI: return bin("arith.maxsi");
      case Op::kAbsI: return un("math.absi");
      case Op::kNegI: {
        std::string a = k(0), z = line("arith.constant 0 : i32");
        return line(fmt::format("arith.subi {}, {} : i32", z, a));
      }
      case Op::kAddF: return bin("arith.addf");
      case Op::kSubF: return bin("arith.subf");
      case Op::kMulF: return bin("arith.mulf");
      case Op::kDivF: return bin("arith.divf");
      case Op::kRemF: return bin("arith.remf");
      case Op::kMinF: return bin("arith.minimumf");
      case Op::kMaxF: return bin("arith.maximumf");
      case Op::kPowF: return bin("math.powf");
      case Op::kNegF: return un("arith.negf");
      case Op::kAbsF: return un("math.absf");
      case Op::kExp: return un("math.exp");
      case Op::kExp2: return un("math.exp2");
      case Op::kLog: return un("math.log");
      case Op::kLog2: return un("math.log2");
      case Op::kTanh: return un("math.tanh");
      case Op::kSqrt: return un("math.sqrt");
      case Op::kRsqrt: return un("math.rsqrt");
      case Op::kSin: return un("math.sin");
      case Op::kCos: return un("math.cos");
      case Op::kFloor: return un("math.floor");
      case Op::kCeil: return un("math.ceil");
      case Op::kErf: return un("math.erf");
      case Op::kSigmoid: {  // as the frontend spells it: 1 / (1 + exp(-x))
        std::string a = k(0), one = line("arith.constant 1.000000e+00 : f32");
        std::string e = line(fmt::format("math.exp {} : f32", line(fmt::format("arith.negf {} : f32", a))));
        return line(fmt::format("arith.divf {}, {} : f32", one,
                                line(fmt::format("arith.addf {}, {} : f32", one, e))));
      }
      case Op::kCmpI:
      case Op::kCmpB:
      case Op::kCmpF:
      case Op::kCmpFX:
      case Op::kCmpIU: {
        std::string a = k(0), b = k(1);
        static const char* const kIU[] = {"ult", "ule", "ugt", "uge"};
        static const char* const kFX[] = {"olt", "ole", "ogt", "oge", "oeq", "one", "ueq",
                                          "ult", "ule", "ugt", "uge", "une", "ord", "uno"};
        bool f = n->op == Op::kCmpF || n->op == Op::kCmpFX;
        const char* pred = n->op == Op::kCmpF    ? kCmpF[n->i]
                           : n->op == Op::kCmpFX ? kFX[n->i]
                           : n->op == Op::kCmpIU ? kIU[n->i]
                                                 : kCmpI[n->i];
        return line(fmt::format("arith.{} {}, {}, {} : {}", f ? "cmpf" : "cmpi", pred, a, b,
                                type_name(n->kids[0]->ty)));
      }
      case Op::kAnd: return bin("arith.andi");
      case Op::kOr: return bin("arith.ori");
      case Op::kNot: {
        std::string a = k(0), t = line("arith.constant true");
        return line(fmt::format("arith.xori {}, {} : i1", a, t));
      }
      case Op::kWhere: {
        std::string cnd = k(0), a = k(1), b = k(2);
        return line(fmt::format("arith.select {}, {}, {} : {}", cnd, a, b, type_name(n->ty)));
      }
      case Op::kIToF: return conv("arith.sitofp");
      case Op::kBToF: return conv("arith.uitofp");
      case Op::kFToI: return conv("arith.fptosi");
      case Op::kBToI: return conv("arith.extui");
      case Op::kDivUI: return bin("arith.divui");
      case Op::kRemUI: return bin("arith.remui");
      case Op::kFloorDivI: return bin("arith.floordivsi");
      case Op::kCeilDivI: return bin("arith.ceildivsi");
      case Op::kMinUI: return bin("arith.minui");
      case Op::kMaxUI: return bin("arith.maxui");
      case Op::kShlI: return bin("arith.shli");
      case Op::kShrSI: return bin("arith.shrsi");
      case Op::kShrUI: return bin("arith.shrui");
      case Op::kAndI: return bin("arith.andi");
      case Op::kOrI: return bin("arith.ori");
      case Op::kXorI: return bin("arith.xori");
      case Op::kMaxNumF: return bin("arith.maxnumf");
      case Op::kMinNumF: return bin("arith.minnumf");
      case Op::kFToUI: return conv("arith.fptoui");
      case Op::kUIToF: return conv("arith.uitofp");
      case Op::kExtSI: return conv("arith.extsi");
      case Op::kTruncI: return conv("arith.trunci");
    }
    throw fa::Error("fuzz: unknown node");
  }

  std::string function(const char* head, const char* args, const NodeP& root) {
    std::string r = run(root);
    std::string caps;
    for (const std::string& name : captures)
      caps += fmt::format("{}%{}: {}", caps.empty() ? "" : ", ", name, buffer_type(name));
    return fmt::format("  {}({}){} -> {} {{\n{}    fa.yield {} : {}\n  }}\n", head, args,
                       caps.empty() ? "" : " captures(" + caps + ")", type_name(root->ty), body, r,
                       type_name(root->ty));
  }
};

}  // namespace

std::string mlir_text(const Case& c) {
  Emitter s{c, "", {}, 0}, m{c, "", {}, 0};
  return "module {\n" +
         s.function("fa.score_mod @fuzz_score", "%score: f32, %b: i32, %h: i32, %q: i32, %kv: i32", c.score) +
         m.function("fa.mask_mod @fuzz_mask", "%b: i32, %h: i32, %q: i32, %kv: i32", c.mask) + "}\n";
}

fa::Program program_of(const Case& c) {
  if (c.text) return fa::Program::parse(mlir_text(c), fmt::format("fuzz case {}", c.index));
  return fa::trace(score_mod_of(c), mask_mod_of(c));
}

}  // namespace fa_fuzz
