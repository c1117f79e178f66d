// fa IR -> CUDA C++ for NVRTC. One SSA value per line, each tagged with its originating op.
#include "fajit/detail/codegen.h"

#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinOps.h"

#include "fajit/Dialect/FA/BodyOps.h"
#include "fajit/Dialect/FA/Passes.h"
#include "fajit/detail/program_impl.h"
#include "fajit/params.h"

namespace fa {
namespace {

namespace arith = mlir::arith;
namespace math = mlir::math;
using mlir::Operation;
using mlir::Value;

const char* c_type(mlir::Type t) {
  if (t.isF32()) return "float";
  if (t.isSignlessInteger(1)) return "bool";
  return "int";
}

std::string float_literal(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return fmt::format("__int_as_float(0x{:08x}) /* {} */", bits, f);
}

class ModEmitter {
 public:
  ModEmitter(mlir::AsmState& state, const std::vector<CaptureSlot>& slots) : state_(state), slots_(slots) {}

  // Emits `static __device__ ... name(args) { ... }` for a score_grad op, and for a score_mod or
  // mask_mod its split form (split_mod) with the plain signature on top of it.
  std::string emit(Operation* mod) {
    if (!llvm::isa<mlir::fa::ScoreGradOp>(mod)) return split_mod(mod);
    bind_arguments(mod);
    std::ostringstream os;
    os << "  static __device__ __forceinline__ float score_grad(float score, int b, int h, int q, int kv, "
          "float dt,\n"
          "                                                   const FaCaptures& cap, const FaGradBuffers& "
          "grads) {\n"
          "    (void)score; (void)b; (void)h; (void)q; (void)kv; (void)dt; (void)cap; (void)grads;\n";
    // (Unused fixed arguments would warn; the signature stays fixed and they are silenced.)
    for (Operation& op : mod->getRegion(0).front()) emit_op(os, op);
    os << "  }\n";
    return os.str();
  }

 private:
  // Where a mod's value is computed in the split form: once per row (a load that reads b, h,
  // q, captures and constants only, and what follows from it by b, h, q alone: a document id
  // by q), once per column (likewise by b and kv alone: a document id by kv), or per element
  // (the rest, the constants wherever they are used). Arithmetic with no load behind it stays
  // per element: measured on the wgmma forward (H200, 2026-11-28), hoisting ALiBi's slope and
  // converted q out of the tile loop too made d64 ALiBi causal 6% slower (fewer instructions,
  // the same registers, scheduled worse), while the loads gathered ahead of the scores made
  // document 1.17-1.18x faster at d64 and d128. (A kv-linear score_mod's rate is the exception,
  // emit_kv_rate: the kernels gather it with the rows, for a bias of one FMA an element.)
  enum class Place { kArgument, kConst, kRow, kCol, kElement };
  static constexpr unsigned kDepScore = 1, kDepQ = 2, kDepKv = 4, kDepH = 8;

  // A score_mod or mask_mod as three functions and the plain one over them:
  //   struct ScoreRow { ... };  score_row(b, h, q, cap)    -> the row values the elements read
  //   struct ScoreCol { ... };  score_col(b, kv, cap)      -> the column values (loads by kv)
  //   score_mod(score, b, h, q, kv, row, col, cap)         -> the element's value
  //   score_mod(score, b, h, q, kv, cap)                   =  the above on score_row / score_col
  // (Mask*, mask_row, mask_col and mask_mod alike.) A kernel that holds the row values over
  // its tiles and loads the column values before it waits for the scores calls the split form;
  // the others call the plain one, which inlines to the same code as a single body.
  std::string split_mod(Operation* mod) {
    const bool is_score = llvm::isa<mlir::fa::ScoreModOp>(mod);
    const std::string Cap = is_score ? "Score" : "Mask", low = is_score ? "score" : "mask";
    auto body = llvm::cast<mlir::fa::ModBody>(mod);
    mlir::Block& entry = body.getEntryBlock();
    bind_arguments(mod);
    // Dependencies of every value on the fixed arguments (b is one per work unit in every
    // kernel, like a capture), and whether a load is among its inputs.
    llvm::DenseMap<Value, unsigned> deps;
    llvm::DenseMap<Value, bool> loads;
    for (unsigned i = 0; i < body.getNumFixedArgs(); ++i) {
      const llvm::StringRef n = body.getFixedArgName(i);
      deps[entry.getArgument(i)] = n == "score" ? kDepScore
                                   : n == "h"   ? kDepH
                                   : n == "q"   ? kDepQ
                                   : n == "kv"  ? kDepKv
                                                : 0;
    }
    std::map<Operation*, Place> place;
    for (Operation& op : entry) {
      if (llvm::isa<mlir::fa::YieldOp>(op)) continue;
      unsigned d = 0;
      bool l = llvm::isa<mlir::fa::LoadOp>(op);
      for (Value v : op.getOperands()) d |= deps.lookup(v), l |= loads.lookup(v);
      deps[op.getResult(0)] = d;
      loads[op.getResult(0)] = l;
      place[&op] = llvm::isa<arith::ConstantOp>(op)                          ? Place::kConst
                   : !(d & (kDepScore | kDepKv)) && l                        ? Place::kRow
                   : !(d & (kDepScore | kDepQ | kDepH)) && (d & kDepKv) && l ? Place::kCol
                                                                             : Place::kElement;
    }
    auto place_of = [&](Value v) {
      Operation* def = v.getDefiningOp();
      return def ? place[def] : Place::kArgument;
    };
    // The ops `roots` read, back through the operands `follow` accepts, in block order.
    auto closure = [&](std::vector<Operation*> work, auto&& follow) {
      std::set<Operation*> need;
      while (!work.empty()) {
        Operation* op = work.back();
        work.pop_back();
        if (!need.insert(op).second) continue;
        for (Value v : op->getOperands())
          if (Operation* def = v.getDefiningOp(); def && follow(def)) work.push_back(def);
      }
      std::vector<Operation*> ordered;
      for (Operation& op : entry)
        if (need.count(&op)) ordered.push_back(&op);
      return ordered;
    };
    // What the row and column functions compute: their own ops and everything those read (it
    // depends on no more than they do: `q + offset` under `ids[q + offset]`).
    auto ops_of = [&](Place which) {
      std::vector<Operation*> own;
      for (Operation& op : entry)
        if (place.count(&op) && place[&op] == which) own.push_back(&op);
      return closure(own, [](Operation*) { return true; });
    };
    // The element function: what the yield needs, back to the row and column values (an
    // element-placed op that only a row or column function reads is not emitted here: NVRTC
    // would warn of an unused variable).
    const std::vector<Operation*> element_ops = closure({entry.getTerminator()}, [&](Operation* def) {
      return place[def] == Place::kElement || place[def] == Place::kConst;
    });
    // What crosses from the row and column functions into the element function.
    std::vector<Value> crossing[2];
    for (Operation* op : element_ops)
      for (Value v : op->getOperands()) {
        const Place p = place_of(v);
        if (p != Place::kRow && p != Place::kCol) continue;
        std::vector<Value>& c = crossing[p == Place::kRow ? 0 : 1];
        if (std::find(c.begin(), c.end(), v) == c.end()) c.push_back(v);
      }
    std::ostringstream os;
    auto part = [&](Place which, const char* kind, const char* fn, const char* args, const char* silence) {
      const std::vector<Value>& c = crossing[which == Place::kRow ? 0 : 1];
      // Row and column values also come from another lane (from_lane: a kernel spreads a tile's
      // columns over a warp's lanes, the forward's keys or the backward's queries, and shuffles
      // them to the lanes that need them).
      const std::string from_lane = "    __device__ __forceinline__ " + Cap + kind + " from_lane(int";
      if (c.empty()) {  // nothing to gather
        os << "  struct " << Cap << kind << " {\n"
           << from_lane << ") const { return {}; }\n  };\n  static __device__ __forceinline__ " << Cap << kind
           << " " << low << fn << "(" << args << ", const FaCaptures& cap) {\n    " << silence
           << "\n    return {};\n  }\n";
        return;
      }
      os << "  struct " << Cap << kind << " {";
      for (Value v : c) os << " " << c_type(v.getType()) << " " << fresh_name(v) << ";";
      os << "\n" << from_lane << " lane) const {\n      return {";
      for (size_t i = 0; i < c.size(); ++i) {
        const std::string n = name(c[i]);
        const bool is_bool = c[i].getType().isSignlessInteger(1);
        os << (i ? ", " : "")
           << (is_bool ? fmt::format("(bool)__shfl_sync(0xffffffffu, (int){}, lane)", n)
                       : fmt::format("__shfl_sync(0xffffffffu, {}, lane)", n));
      }
      os << "};\n    }\n  };\n";
      os << "  static __device__ __forceinline__ " << Cap << kind << " " << low << fn << "(" << args
         << ", const FaCaptures& cap) {\n    " << silence << "\n";
      for (Operation* op : ops_of(which)) emit_op(os, *op);
      os << "    return {";
      for (size_t i = 0; i < c.size(); ++i) os << (i ? ", " : "") << name(c[i]);
      os << "};\n  }\n";
    };
    part(Place::kRow, "Row", "_row", "int b, int h, int q", "(void)b; (void)h; (void)q; (void)cap;");
    part(Place::kCol, "Col", "_col", "int b, int kv", "(void)b; (void)kv; (void)cap;");
    const char* ret = is_score ? "float" : "bool";
    const std::string sig =
        is_score ? "float score, int b, int h, int q, int kv" : "int b, int h, int q, int kv";
    const std::string call = is_score ? "score, b, h, q, kv" : "b, h, q, kv";
    const std::string head = fmt::format("  static __device__ __forceinline__ {} {}_mod(", ret, low);
    const std::string indent(head.size(), ' ');
    os << head << sig << ",\n"
       << indent << "const " << Cap << "Row& row, const " << Cap << "Col& col, const FaCaptures& cap) {\n"
       << "    " << (is_score ? "(void)score; " : "") << "(void)b; (void)h; (void)q; (void)kv; (void)row; "
       << "(void)col; (void)cap;\n";
    for (int k = 0; k < 2; ++k)
      for (Value v : crossing[k])
        os << "    const " << c_type(v.getType()) << " " << name(v) << " = " << (k ? "col." : "row.")
           << name(v) << ";\n";
    for (Operation* op : element_ops) emit_op(os, *op);
    os << "  }\n";
    os << head << sig << ",\n"
       << indent << "const FaCaptures& cap) {\n"
       << "    return " << low << "_mod(" << call << ", " << low << "_row(b, h, q, cap), " << low
       << "_col(b, kv, cap), cap);\n  }\n";
    // A row value the element function reads is a member of the row struct (crossing[0]); one
    // that only the column function reads (a load by b under a mask of b and kv alone) is not.
    auto in_row = [&](Value v) {
      return place_of(v) == Place::kRow &&
             std::find(crossing[0].begin(), crossing[0].end(), v) != crossing[0].end();
    };
    if (is_score)
      emit_kv_rate(os, body, deps, in_row, closure);
    else
      emit_kv_range(os, body, deps, in_row, closure);
    return os.str();
  }

  // Whether v depends on any of `what` (kDep* bits); a value without an entry counts as it does.
  static bool reads(const llvm::DenseMap<Value, unsigned>& deps, Value v, unsigned what) {
    auto it = deps.find(v);
    return it == deps.end() || (it->second & what) != 0;
  }

  // A score_mod `score ± rate · (kv − q)` (either operand order, q − kv too) whose rate reads
  // neither the score nor kv: ALiBi's, a relative slope's. The value of the rate and whether it
  // enters negated, if the mod has that form. deps: split_mod's dependencies of each value.
  static std::optional<std::pair<Value, bool>> kv_linear_rate(mlir::fa::ModBody body,
                                                              const llvm::DenseMap<Value, unsigned>& deps) {
    mlir::Block& entry = body.getEntryBlock();
    auto arg = [&](llvm::StringRef n) -> Value {
      for (unsigned i = 0; i < body.getNumFixedArgs(); ++i)
        if (body.getFixedArgName(i) == n) return entry.getArgument(i);
      return {};
    };
    const Value score = arg("score"), q = arg("q"), kv = arg("kv");
    auto y = llvm::cast<mlir::fa::YieldOp>(entry.getTerminator());
    Operation* top = y.getValue().getDefiningOp();
    if (!top || !llvm::isa<arith::AddFOp, arith::SubFOp>(top)) return std::nullopt;
    const bool add = llvm::isa<arith::AddFOp>(top);
    Value term;
    if (top->getOperand(0) == score)
      term = top->getOperand(1);
    else if (add && top->getOperand(1) == score)
      term = top->getOperand(0);
    else
      return std::nullopt;
    auto mul = term.getDefiningOp<arith::MulFOp>();
    if (!mul) return std::nullopt;
    // d = sitofp(a) − sitofp(c): +1 for kv − q, −1 for q − kv, 0 otherwise.
    auto direction = [&](Value d) {
      auto sub = d.getDefiningOp<arith::SubFOp>();
      if (!sub) return 0;
      auto l = sub.getLhs().getDefiningOp<arith::SIToFPOp>(),
           r = sub.getRhs().getDefiningOp<arith::SIToFPOp>();
      if (!l || !r) return 0;
      if (l.getIn() == kv && r.getIn() == q) return 1;
      if (l.getIn() == q && r.getIn() == kv) return -1;
      return 0;
    };
    for (int k = 0; k < 2; ++k) {
      const int dir = direction(mul->getOperand(1 - k));
      const Value rate = mul->getOperand(k);
      if (dir == 0 || reads(deps, rate, kDepScore | kDepKv) || !rate.getDefiningOp()) continue;
      return std::make_pair(rate, (dir < 0) == add);
    }
    return std::nullopt;
  }

  // For a kv-linear score_mod (above), its rate as a function of the row (kernels that walk a
  // row's keys then add rate·(kv − q) as one FMA from a per-tile base instead of converting kv
  // and subtracting per element: attention_tile.cuh, KvLinear):
  //   kScoreKvLinear = true;
  //   kScoreKvRateByQ                    whether the rate reads q (if not, a transposed tile,
  //                                      the dK/dV kernel's, adds the bias by FMA too)
  //   score_kv_rate(b, h, q, row, cap)   the rate, from the row values score_row gathered
  //   score_kv_rate(b, h, q, cap)        the same from score_row's own
  template <typename InRow, typename Closure>
  void emit_kv_rate(std::ostringstream& os, mlir::fa::ModBody body,
                    const llvm::DenseMap<Value, unsigned>& deps, InRow&& in_row, Closure&& closure) {
    const std::optional<std::pair<Value, bool>> linear = kv_linear_rate(body, deps);
    if (!linear) return;
    const auto [rate, negate] = *linear;
    os << "  // score_mod(score, b, h, q, kv) = score + score_kv_rate(b, h, q) * (kv - q)\n"
          "  static constexpr bool kScoreKvLinear = true;\n"
       << "  static constexpr bool kScoreKvRateByQ = " << (reads(deps, rate, kDepQ) ? "true" : "false")
       << ";\n"
          "  static __device__ __forceinline__ float score_kv_rate(int b, int h, int q, const ScoreRow& "
          "row,\n"
          "                                                        const FaCaptures& cap) {\n"
          "    (void)b; (void)h; (void)q; (void)row; (void)cap;\n";
    emit_from_row(os, {rate}, in_row, closure);
    os << "    return " << (negate ? "-" : "") << name(rate) << ";\n  }\n"
       << "  static __device__ __forceinline__ float score_kv_rate(int b, int h, int q, const FaCaptures& "
          "cap) {\n"
          "    return score_kv_rate(b, h, q, score_row(b, h, q, cap), cap);\n  }\n";
  }

  // The body of a function of the row (score_kv_rate, mask_kv_range) up to `roots`, computed as
  // the mod computes them: the values the row struct holds (`in_row`: split_mod's gathered
  // ScoreRow / MaskRow members) read from `row`, everything between them and the roots re-emitted
  // (arithmetic, constants, captured scalars: what split_mod leaves per element; and a load by
  // row that only the column function reads, which the row struct does not hold).
  template <typename InRow, typename Closure>
  void emit_from_row(std::ostringstream& os, const std::vector<Value>& roots, InRow&& in_row,
                     Closure&& closure) {
    std::vector<Operation*> work;
    for (Value r : roots)
      if (!in_row(r) && r.getDefiningOp()) work.push_back(r.getDefiningOp());
    std::vector<Operation*> ops;
    if (!work.empty()) ops = closure(work, [&](Operation* def) { return !in_row(def->getResult(0)); });
    std::vector<Value> from_row;
    auto note_row = [&](Value v) {
      if (in_row(v) && std::find(from_row.begin(), from_row.end(), v) == from_row.end())
        from_row.push_back(v);
    };
    for (Value r : roots) note_row(r);
    for (Operation* op : ops)
      for (Value v : op->getOperands()) note_row(v);
    for (Value v : from_row)
      os << "    const " << c_type(v.getType()) << " " << name(v) << " = row." << name(v) << ";\n";
    for (Operation* op : ops) emit_op(os, *op);
  }

  // A mask_mod that keeps, for each query row, one interval of keys: an and/or tree over
  // compares of kv, kv − q or q − kv with values that do not read kv (causal, sliding windows,
  // prefix-LM, padding, causal with an offset), and over booleans that do not read kv. Each node
  // is an interval [lo, hi] of kv in 64 bits (where kv ± a row value cannot wrap: the compares
  // themselves are exact in 32 bits, since kv − q of two indices cannot wrap either); `and`
  // intersects, `or` unites two half-lines open on the same side (a union of anything else need
  // not be one interval); a negation (`!x`, traced as x ^ true) is pushed down to the compares
  // (De Morgan, each predicate inverted: `!(kv != q)` is kv == q). Emits the C++ of each node
  // into `os` as it goes, and notes in `roots` the values it reads that do not read kv (a compare's
  // other side, a boolean of the row), for the caller to compute ahead of it.
  struct KvInterval {
    bool lo_open = true, hi_open = true;  // unbounded below / above, whatever the row
    std::string lo = "fa::mod::kKvOpenLo", hi = "fa::mod::kKvOpenHi";
  };
  std::optional<KvInterval> kv_interval(std::ostringstream& os, std::vector<Value>& roots, Value v, Value q,
                                        Value kv, const llvm::DenseMap<Value, unsigned>& deps, int& fresh,
                                        bool negate = false) {
    using P = arith::CmpIPredicate;
    auto local = [&](const std::string& e) {
      const std::string n = fmt::format("k_{}", fresh++);
      os << "    const long long " << n << " = " << e << ";\n";
      return n;
    };
    if (!reads(deps, v, kDepKv)) {  // a boolean of the row: every key, or none
      KvInterval r;
      r.lo_open = r.hi_open = false;
      roots.push_back(v);
      const std::string c = (negate ? "!" : "") + name(v);
      r.lo = local(fmt::format("{} ? fa::mod::kKvOpenLo : fa::mod::kKvOpenHi", c));
      r.hi = local(fmt::format("{} ? fa::mod::kKvOpenHi : fa::mod::kKvOpenLo", c));
      return r;
    }
    Operation* def = v.getDefiningOp();
    if (!def) return std::nullopt;
    if (std::optional<Value> x = negated(def))  // !x: the negation pushed down to the compares
      return kv_interval(os, roots, *x, q, kv, deps, fresh, !negate);
    if (llvm::isa<arith::AndIOp, arith::OrIOp>(def)) {
      const bool is_and = llvm::isa<arith::AndIOp>(def) != negate;  // De Morgan under a negation
      std::optional<KvInterval> a = kv_interval(os, roots, def->getOperand(0), q, kv, deps, fresh, negate);
      if (!a) return std::nullopt;
      std::optional<KvInterval> b = kv_interval(os, roots, def->getOperand(1), q, kv, deps, fresh, negate);
      if (!b) return std::nullopt;
      KvInterval r;
      if (is_and) {
        r.lo_open = a->lo_open && b->lo_open;
        r.hi_open = a->hi_open && b->hi_open;
        r.lo = a->lo_open   ? b->lo
               : b->lo_open ? a->lo
                            : local(fmt::format("fa::mod::max64({}, {})", a->lo, b->lo));
        r.hi = a->hi_open   ? b->hi
               : b->hi_open ? a->hi
                            : local(fmt::format("fa::mod::min64({}, {})", a->hi, b->hi));
      } else if (a->lo_open && b->lo_open) {  // (−inf, a.hi] ∪ (−inf, b.hi]
        r.hi_open = a->hi_open || b->hi_open;
        if (!r.hi_open) r.hi = local(fmt::format("fa::mod::max64({}, {})", a->hi, b->hi));
      } else if (a->hi_open && b->hi_open) {  // [a.lo, inf) ∪ [b.lo, inf)
        r.lo_open = a->lo_open || b->lo_open;
        if (!r.lo_open) r.lo = local(fmt::format("fa::mod::min64({}, {})", a->lo, b->lo));
      } else {
        return std::nullopt;
      }
      return r;
    }
    auto cmp = llvm::dyn_cast<arith::CmpIOp>(def);
    if (!cmp || !cmp.getLhs().getType().isSignlessInteger(32)) return std::nullopt;
    // Which side is kv, kv − q or q − kv; the other must not read kv.
    enum Form { kNone, kKv, kKvMinusQ, kQMinusKv };
    auto form = [&](Value x) {
      if (x == kv) return kKv;
      if (auto s = x.getDefiningOp<arith::SubIOp>()) {
        if (s.getLhs() == kv && s.getRhs() == q) return kKvMinusQ;
        if (s.getLhs() == q && s.getRhs() == kv) return kQMinusKv;
      }
      return kNone;
    };
    P pred = negate ? arith::invertPredicate(cmp.getPredicate()) : cmp.getPredicate();
    Value side = cmp.getLhs(), other = cmp.getRhs();
    Form f = form(side);
    if (f == kNone || reads(deps, other, kDepKv)) {
      std::swap(side, other);
      f = form(side);
      if (f == kNone || reads(deps, other, kDepKv)) return std::nullopt;
      pred = swapped(pred);
    }
    // side P other, as kv P y.
    roots.push_back(other);
    std::string y;
    switch (f) {
      case kKv: y = fmt::format("(long long){}", name(other)); break;
      case kKvMinusQ: y = fmt::format("(long long){} + {}", name(other), name(q)); break;
      default:  // q − kv P x  <=>  kv P' q − x
        y = fmt::format("(long long){} - {}", name(q), name(other));
        pred = swapped(pred);
    }
    KvInterval r;
    switch (pred) {
      case P::slt: r.hi_open = false, r.hi = local(y + " - 1"); break;
      case P::sle: r.hi_open = false, r.hi = local(y); break;
      case P::sgt: r.lo_open = false, r.lo = local(y + " + 1"); break;
      case P::sge: r.lo_open = false, r.lo = local(y); break;
      case P::eq: r.lo_open = r.hi_open = false, r.lo = r.hi = local(y); break;
      default: return std::nullopt;  // ne, unsigned compares
    }
    return r;
  }
  // x for an i1 `x ^ true` (either order: `!x` as traced), else nothing.
  static std::optional<Value> negated(Operation* def) {
    auto x = llvm::dyn_cast<arith::XOrIOp>(def);
    if (!x || !x.getType().isSignlessInteger(1)) return std::nullopt;
    for (int k = 0; k < 2; ++k)
      if (auto c = x->getOperand(k).getDefiningOp<arith::ConstantOp>())
        if (auto a = llvm::dyn_cast<mlir::IntegerAttr>(c.getValue()); a && a.getValue().isAllOnes())
          return x->getOperand(1 - k);
    return std::nullopt;
  }
  // The predicate of `b P a` for `a P b`.
  static arith::CmpIPredicate swapped(arith::CmpIPredicate p) {
    using P = arith::CmpIPredicate;
    switch (p) {
      case P::slt: return P::sgt;
      case P::sle: return P::sge;
      case P::sgt: return P::slt;
      case P::sge: return P::sle;
      case P::ult: return P::ugt;
      case P::ule: return P::uge;
      case P::ugt: return P::ult;
      case P::uge: return P::ule;
      default: return p;  // eq, ne
    }
  }

  // For a mask_mod that keeps an interval of keys per row (kv_interval), the interval as a
  // function of the row (kernels that walk a row's keys then mask a partial tile by comparing
  // each column's offset in the tile with two per-row bounds, and only on the side the bound
  // falls in the tile: attention_tile.cuh, KvRange):
  //   kMaskKvRange = true;
  //   mask_kv_range(b, h, q, row, cap, lo, hi)   mask_mod keeps exactly the keys lo <= kv <= hi
  //                                              (kv in [0, 2^31 − 1); lo, hi in [−1, 2^31 − 1])
  //   mask_kv_range(b, h, q, cap, lo, hi)        the same from mask_row's own values
  template <typename InRow, typename Closure>
  void emit_kv_range(std::ostringstream& os, mlir::fa::ModBody body,
                     const llvm::DenseMap<Value, unsigned>& deps, InRow&& in_row, Closure&& closure) {
    mlir::Block& entry = body.getEntryBlock();
    Value q, kv;
    for (unsigned i = 0; i < body.getNumFixedArgs(); ++i) {
      if (body.getFixedArgName(i) == "q") q = entry.getArgument(i);
      if (body.getFixedArgName(i) == "kv") kv = entry.getArgument(i);
    }
    const Value top = llvm::cast<mlir::fa::YieldOp>(entry.getTerminator()).getValue();
    if (top.getDefiningOp<arith::ConstantOp>()) return;  // no mask
    // The tree; the values its leaves read that do not read kv are computed ahead of it as
    // mask_mod computes them (emit_from_row: the row's gathered values, the rest re-emitted).
    std::ostringstream tree;
    std::vector<Value> roots;
    int fresh = 0;
    const std::optional<KvInterval> range = kv_interval(tree, roots, top, q, kv, deps, fresh);
    if (!range) return;
    os << "  // mask_mod(b, h, q, kv) = lo <= kv && kv <= hi, mask_kv_range(b, h, q, lo, hi)\n"
          "  static constexpr bool kMaskKvRange = true;\n"
          "  static __device__ __forceinline__ void mask_kv_range(int b, int h, int q, const MaskRow& row,\n"
          "                                                       const FaCaptures& cap, int& lo, int& hi) "
          "{\n"
          "    (void)b; (void)h; (void)q; (void)row; (void)cap;\n";
    emit_from_row(os, roots, in_row, closure);
    os << tree.str() << "    lo = fa::mod::kv_bound(" << range->lo << ");\n"
       << "    hi = fa::mod::kv_bound(" << range->hi << ");\n  }\n"
       << "  static __device__ __forceinline__ void mask_kv_range(int b, int h, int q, const FaCaptures& "
          "cap,\n"
          "                                                       int& lo, int& hi) {\n"
          "    mask_kv_range(b, h, q, mask_row(b, h, q, cap), cap, lo, hi);\n  }\n";
  }

  // Names the mod's fixed arguments and its captures.
  void bind_arguments(Operation* mod) {
    auto body = llvm::cast<mlir::fa::ModBody>(mod);
    mlir::Block& entry = body.getEntryBlock();
    const unsigned fixed = body.getNumFixedArgs();
    names_.clear();
    for (unsigned i = 0; i < fixed; ++i)
      names_[entry.getArgument(i).getAsOpaquePointer()] = body.getFixedArgName(i).str();
    for (unsigned i = fixed; i < entry.getNumArguments(); ++i)
      captures_[entry.getArgument(i).getAsOpaquePointer()] = body.getCaptureName(i - fixed).str();
  }

  // One op as a line of C++ (a yield as the return, fa.grad_add as its reduction), tagged with
  // the op it comes from.
  void emit_op(std::ostringstream& os, Operation& op) {
    std::string origin;
    llvm::raw_string_ostream ros(origin);
    op.print(ros, state_);
    for (char& c : origin)
      if (c == '\n') c = ' ';
    if (auto y = llvm::dyn_cast<mlir::fa::YieldOp>(op)) {
      os << "    return " << name(y.getValue()) << ";  // fa: " << origin << "\n";
      return;
    }
    if (auto g = llvm::dyn_cast<mlir::fa::GradAddOp>(op)) {
      const CaptureSlot& s = slot_of(g.getBuffer());
      os << "    fa::mod::grad_add_f32(grads.buffers[" << s.slot << "], " << name(g.getValue());
      for (Value i : g.getIndices()) os << ", " << name(i);
      os << ");  // fa: " << origin << "\n";
      return;
    }
    Value r = op.getResult(0);
    std::string n = names_.count(r.getAsOpaquePointer()) ? name(r) : fresh_name(r);
    os << "    const " << c_type(r.getType()) << " " << n << " = " << expr(op) << ";  // fa: " << origin
       << "\n";
  }

  std::string name(Value v) {
    auto it = names_.find(v.getAsOpaquePointer());
    if (it == names_.end()) throw Error("codegen: value used before its definition");
    return it->second;
  }

  std::string fresh_name(Value v) {
    std::string printed;
    llvm::raw_string_ostream os(printed);
    v.printAsOperand(os, state_);
    std::string n = "v_";
    for (char c : printed.substr(1)) n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    names_[v.getAsOpaquePointer()] = n;
    return n;
  }

  const CaptureSlot& slot_of(Value buffer) {
    const std::string& cap = captures_.at(buffer.getAsOpaquePointer());
    for (const CaptureSlot& s : slots_)
      if (s.is_buffer && s.name == cap) return s;
    throw Error(fmt::format("codegen: capture '{}' has no slot", cap));
  }

  int scalar_slot(const std::string& n) {
    for (const CaptureSlot& s : slots_)
      if (!s.is_buffer && s.name == n) return s.slot;
    throw Error(fmt::format("codegen: scalar '{}' has no slot", n));
  }

  // An i1 operand read as a signed integer: true is -1 in arith.
  std::string as_signed(Value v) {
    return v.getType().isSignlessInteger(1) ? fmt::format("({} ? -1 : 0)", name(v)) : name(v);
  }

  // Whether `op` is the one use of the `score` argument of its fa.score_mod / fa.score_grad
  // (`score + score` is two): then no other op sees the score, so nothing can tell a rounded
  // q·k · scale from the unrounded one the compiler may fuse into `op`.
  static bool reads_score(Operation& op) {
    for (Value v : op.getOperands()) {
      auto arg = llvm::dyn_cast<mlir::BlockArgument>(v);
      if (arg && arg.getArgNumber() == 0 &&
          llvm::isa<mlir::fa::ScoreModOp, mlir::fa::ScoreGradOp>(arg.getOwner()->getParentOp()))
        return arg.hasOneUse();
    }
    return false;
  }

  std::string bin(Operation& op, const char* fmt_str) {
    return fmt::format(fmt::runtime(fmt_str), name(op.getOperand(0)), name(op.getOperand(1)));
  }

  // Integer ops on i1 are done in 32 bits then truncated to the low bit.
  std::string int_bin(Operation& op, const char* fn) {
    if (op.getResult(0).getType().isSignlessInteger(1))
      return fmt::format("(bool)(fa::mod::{}((int){}, (int){}) & 1)", fn, name(op.getOperand(0)),
                         name(op.getOperand(1)));
    return fmt::format("fa::mod::{}({}, {})", fn, name(op.getOperand(0)), name(op.getOperand(1)));
  }

  // maxsi/minsi read i1 true as -1, like the signed compares.
  std::string signed_minmax(Operation& op, const char* fn) {
    std::string e =
        fmt::format("fa::mod::{}({}, {})", fn, as_signed(op.getOperand(0)), as_signed(op.getOperand(1)));
    return op.getResult(0).getType().isSignlessInteger(1) ? fmt::format("(bool)({} & 1)", e) : e;
  }

  std::string expr(Operation& op) {
    using P = arith::CmpIPredicate;
    using F = arith::CmpFPredicate;
    using B = mlir::fa::BodyOp;
    if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
      mlir::Attribute a = c.getValue();
      if (auto f = llvm::dyn_cast<mlir::FloatAttr>(a)) return float_literal(f.getValue().convertToFloat());
      auto i = llvm::cast<mlir::IntegerAttr>(a);
      if (i.getType().isSignlessInteger(1)) return i.getValue().isZero() ? "false" : "true";
      int32_t v = static_cast<int32_t>(i.getValue().getSExtValue());
      return v == INT32_MIN ? "(-2147483647 - 1)" : std::to_string(v);
    }
    if (auto s = llvm::dyn_cast<mlir::fa::ScalarOp>(op))
      return fmt::format("cap.scalars[{}].{}", scalar_slot(s.getName().str()),
                         s.getType().isF32() ? "f" : "i");
    std::optional<B> code = mlir::fa::getBodyOp(&op);
    if (!code) throw Error(fmt::format("codegen: unsupported op '{}'", op.getName().getStringRef().str()));
    switch (*code) {
      case B::AddI: return int_bin(op, "add");
      case B::SubI: return int_bin(op, "sub");
      case B::MulI: return int_bin(op, "mul");
      case B::DivSI: return bin(op, "({} / {})");
      case B::RemSI: return bin(op, "({} % {})");
      case B::DivUI: return bin(op, "fa::mod::divu({}, {})");
      case B::RemUI: return bin(op, "fa::mod::remu({}, {})");
      case B::FloorDivSI: return bin(op, "fa::mod::floordiv({}, {})");
      case B::CeilDivSI: return bin(op, "fa::mod::ceildiv({}, {})");
      case B::MaxSI: return signed_minmax(op, "smax");
      case B::MinSI: return signed_minmax(op, "smin");
      case B::MaxUI: return bin(op, "fa::mod::umax({}, {})");
      case B::MinUI: return bin(op, "fa::mod::umin({}, {})");
      case B::AndI: return bin(op, "({} & {})");
      case B::OrI: return bin(op, "({} | {})");
      case B::XOrI: return bin(op, "({} ^ {})");
      case B::ShLI: return bin(op, "fa::mod::shl({}, {})");
      case B::ShRSI: return bin(op, "fa::mod::shrs({}, {})");
      case B::ShRUI: return bin(op, "fa::mod::shru({}, {})");
      case B::CmpI: {
        auto c = llvm::cast<arith::CmpIOp>(op);
        Value a = c.getLhs(), b = c.getRhs();
        auto s = [&](const char* o) { return fmt::format("({} {} {})", as_signed(a), o, as_signed(b)); };
        auto u = [&](const char* o) {
          return fmt::format("((unsigned){} {} (unsigned){})", name(a), o, name(b));
        };
        switch (c.getPredicate()) {
          case P::eq: return fmt::format("({} == {})", name(a), name(b));
          case P::ne: return fmt::format("({} != {})", name(a), name(b));
          case P::slt: return s("<");
          case P::sle: return s("<=");
          case P::sgt: return s(">");
          case P::sge: return s(">=");
          case P::ult: return u("<");
          case P::ule: return u("<=");
          case P::ugt: return u(">");
          case P::uge: return u(">=");
        }
        return "false";
      }
      // The score's one + or - is plain: the kernel passes the score as q·k · scale, and the
      // compiler may fuse that product into it (ALiBi's, a bias's add: one FFMA) where the
      // kernel has no other use for the product (the forward; the backward keeps q·k · scale
      // for score_grad, so its product is rounded: the two scores may differ by an ulp).
      case B::AddF: return bin(op, reads_score(op) ? "({} + {})" : "__fadd_rn({}, {})");
      case B::SubF: return bin(op, reads_score(op) ? "({} - {})" : "__fsub_rn({}, {})");
      case B::MulF: return bin(op, "__fmul_rn({}, {})");
      case B::DivF: return bin(op, "fa::mod::divf({}, {})");
      case B::RemF: return bin(op, "fmodf({}, {})");
      case B::NegF: return fmt::format("(-{})", name(op.getOperand(0)));
      case B::MaximumF: return bin(op, "fa::mod::maximumf({}, {})");
      case B::MinimumF: return bin(op, "fa::mod::minimumf({}, {})");
      case B::MaxNumF: return bin(op, "fmaxf({}, {})");
      case B::MinNumF: return bin(op, "fminf({}, {})");
      case B::CmpF: {
        auto c = llvm::cast<arith::CmpFOp>(op);
        std::string a = name(c.getLhs()), b = name(c.getRhs());
        auto f = [&](const char* s) { return fmt::format(fmt::runtime(s), a, b); };
        switch (c.getPredicate()) {
          case F::AlwaysFalse: return "false";
          case F::OEQ: return f("({0} == {1})");
          case F::OGT: return f("({0} > {1})");
          case F::OGE: return f("({0} >= {1})");
          case F::OLT: return f("({0} < {1})");
          case F::OLE: return f("({0} <= {1})");
          case F::ONE: return f("({0} < {1} || {0} > {1})");
          case F::ORD: return f("({0} == {0} && {1} == {1})");
          case F::UEQ: return f("!({0} < {1} || {0} > {1})");
          case F::UGT: return f("!({0} <= {1})");
          case F::UGE: return f("!({0} < {1})");
          case F::ULT: return f("!({0} >= {1})");
          case F::ULE: return f("!({0} > {1})");
          case F::UNE: return f("({0} != {1})");
          case F::UNO: return f("({0} != {0} || {1} != {1})");
          case F::AlwaysTrue: return "true";
        }
        return "false";
      }
      case B::Select: {
        auto s = llvm::cast<arith::SelectOp>(op);
        return fmt::format("({} ? {} : {})", name(s.getCondition()), name(s.getTrueValue()),
                           name(s.getFalseValue()));
      }
      case B::SIToFP: {
        Value a = op.getOperand(0);
        if (a.getType().isSignlessInteger(1)) return fmt::format("({} ? -1.0f : 0.0f)", name(a));
        return fmt::format("__int2float_rn({})", name(a));
      }
      case B::UIToFP: {
        Value a = op.getOperand(0);
        if (a.getType().isSignlessInteger(1)) return fmt::format("({} ? 1.0f : 0.0f)", name(a));
        return fmt::format("__uint2float_rn((unsigned){})", name(a));
      }
      case B::FPToSI:
        if (op.getResult(0).getType().isSignlessInteger(1))
          throw Error("codegen: arith.fptosi to i1 is not supported");
        return fmt::format("fa::mod::f2i({})", name(op.getOperand(0)));
      case B::FPToUI:
        if (op.getResult(0).getType().isSignlessInteger(1))
          throw Error("codegen: arith.fptoui to i1 is not supported");
        return fmt::format("fa::mod::f2u({})", name(op.getOperand(0)));
      case B::ExtUI: return fmt::format("((int){})", name(op.getOperand(0)));
      case B::ExtSI: return fmt::format("({} ? -1 : 0)", name(op.getOperand(0)));
      case B::TruncI: return fmt::format("(bool)({} & 1)", name(op.getOperand(0)));
      case B::Exp: return fmt::format("expf({})", name(op.getOperand(0)));
      case B::Exp2: return fmt::format("exp2f({})", name(op.getOperand(0)));
      case B::Log: return fmt::format("logf({})", name(op.getOperand(0)));
      case B::Log2: return fmt::format("log2f({})", name(op.getOperand(0)));
      case B::Tanh: return fmt::format("fa::mod::tanh({})", name(op.getOperand(0)));
      case B::Sqrt: return fmt::format("__fsqrt_rn({})", name(op.getOperand(0)));
      case B::Rsqrt: return fmt::format("rsqrtf({})", name(op.getOperand(0)));
      case B::AbsF: return fmt::format("fabsf({})", name(op.getOperand(0)));
      case B::AbsI: return fmt::format("fa::mod::iabs({})", name(op.getOperand(0)));
      case B::Sin: return fmt::format("sinf({})", name(op.getOperand(0)));
      case B::Cos: return fmt::format("cosf({})", name(op.getOperand(0)));
      case B::PowF: return bin(op, "powf({}, {})");
      case B::Floor: return fmt::format("floorf({})", name(op.getOperand(0)));
      case B::Ceil: return fmt::format("ceilf({})", name(op.getOperand(0)));
      case B::Erf: return fmt::format("erff({})", name(op.getOperand(0)));
      case B::Load: {
        auto l = llvm::cast<mlir::fa::LoadOp>(op);
        const CaptureSlot& s = slot_of(l.getBuffer());
        std::string args = fmt::format("cap.buffers[{}]", s.slot);
        for (Value i : l.getIndices()) args += ", " + name(i);
        return fmt::format("fa::mod::load_{}({})", s.is_float ? "f32" : "i32", args);
      }
    }
    // No default above, so -Wswitch names a table op this switch lacks; at run time:
    throw Error(fmt::format("codegen: unsupported op '{}'", op.getName().getStringRef().str()));
  }

  mlir::AsmState& state_;
  const std::vector<CaptureSlot>& slots_;
  std::map<const void*, std::string> names_;
  std::map<const void*, std::string> captures_;
};

const char* element_type(DType t) { return t == DType::f16 ? "fa::f16_t" : "fa::bf16_t"; }

}  // namespace

std::vector<CaptureSlot> capture_slots(const Program& program) {
  std::vector<CaptureSlot> slots;
  int buffers = 0, scalars = 0;
  for (const Program::Capture& c : program.captures()) {
    CaptureSlot s{c.name, c.is_buffer, c.is_float, c.rank, c.is_buffer ? buffers++ : scalars++};
    slots.push_back(s);
  }
  if (buffers > FA_MAX_BUFFERS)
    throw Error(
        fmt::format("the mods capture {} buffers; at most {} are supported", buffers, FA_MAX_BUFFERS));
  if (scalars > FA_MAX_SCALARS)
    throw Error(
        fmt::format("the mods use {} runtime scalars; at most {} are supported", scalars, FA_MAX_SCALARS));
  return slots;
}

std::string emit_mods(const Program& program, bool with_backward) {
  const Program::Impl& impl = program.impl();
  std::vector<CaptureSlot> slots = capture_slots(program);
  mlir::AsmState state(impl.module.get());
  ModEmitter emitter(state, slots);
  std::ostringstream os;
  os << "// score_mod @" << program.score_mod_name() << ", mask_mod @" << program.mask_mod_name() << "\n";
  for (const CaptureSlot& s : slots)
    os << "// capture '" << s.name << "': " << (s.is_buffer ? "buffers[" : "scalars[") << s.slot << "] ("
       << (s.is_float ? "f32" : "i32") << (s.is_buffer ? fmt::format(", rank {})", s.rank) : ")") << "\n";
  os << "struct FaMods {\n";
  os << "  static constexpr bool kHasScoreMod = " << (program.score_is_identity() ? "false" : "true")
     << ";\n";
  os << "  static constexpr bool kHasMaskMod = " << (program.mask_is_noop() ? "false" : "true") << ";\n";
  os << emitter.emit(mlir::fa::ScoreModOp(impl.score).getOperation());
  os << emitter.emit(mlir::fa::MaskModOp(impl.mask).getOperation());
  // The backward's hook (templates/fajit/backward.cuh), from fa-differentiate's fa.score_grad
  // (fa::Error with the pass's diagnostic when the score_mod has none): dS = dT when the
  // derivative is `yield %dt` with no buffer gradient, else the generated score_grad.
  if (with_backward) {
    // Whether mask_mod reads a captured buffer (a document mask's ids; the dialect's
    // computeUses): the Hopper dK/dV kernel's consumers then take their tiles from the producer
    // (TileInfo) at BLOCK_M 128.
    const bool mask_reads_buffers = !mlir::fa::computeUses(impl.mask.getOperation()).buffers.empty();
    os << "  static constexpr bool kMaskReadsBuffers = " << (mask_reads_buffers ? "true" : "false") << ";\n";
    mlir::fa::ScoreGradOp grad = detail::score_grad_of(program);
    if (program.score_grad_is_identity()) {
      os << "  static constexpr bool kScoreGrad = false;\n"
            "  static __device__ __forceinline__ float score_grad(float, int, int, int, int, float dt,\n"
            "                                                     const FaCaptures&, const FaGradBuffers&) "
            "{\n"
            "    return dt;\n  }\n";
    } else {
      mlir::AsmState grad_state(impl.grad_module.get());
      ModEmitter grad_emitter(grad_state, slots);
      os << "  static constexpr bool kScoreGrad = true;\n";
      os << grad_emitter.emit(grad.getOperation());
    }
  }
  os << "};\n";
  return os.str();
}

// A kernel config for the spec's sequence layout (templates: fa::WithLayout).
static std::string with_layout(const std::string& config, SequenceLayout layout) {
  if (layout == SequenceLayout::kDense) return config;
  return fmt::format("fa::WithLayout<{}, {}>", config,
                     layout == SequenceLayout::kRagged ? "fa::kRaggedLayout" : "fa::kPagedLayout");
}

bool score_mod_weighs(const Program& program, KernelKind kind) {
  if (kind == KernelKind::kBackward) return !program.score_grad_is_identity();
  return !program.score_is_identity();
}

GeneratedKernel generate(const Program& program, const KernelSpec& spec_in) {
  GeneratedKernel g;
  g.spec = spec_in.resolved(score_mod_weighs(program, spec_in.kind), !program.mask_is_noop());
  g.slots = capture_slots(program);
  std::ostringstream os;
  os << "// fajit generated: " << g.spec.to_string() << "\n";
  if (g.spec.wide_captures) os << "#define FAJIT_WIDE_CAPTURES 1  // 64-bit capture offsets, any strides\n";
  if (g.spec.row_max) os << "#define FAJIT_ROW_MAX 1  // the kernels also write each row's largest score\n";
  os << "#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n#include \"fajit/modlib.cuh\"\n\n";
  os << emit_mods(program, g.spec.kind == KernelKind::kBackward) << "\n";
  if (g.spec.kind == KernelKind::kForward) {
    const TileConfig& t = g.spec.tile;
    g.kernel_name = "fajit_forward";
    if (g.spec.family == KernelFamily::kWgmma) {
      os << "#include \"fajit/forward_sm90.cuh\"\n";
      os << "using FaConfig = "
         << with_layout(fmt::format("fa::Sm90FwdConfig<{}, {}, {}, {}, {}, true, true, {}, {}{}>",
                                    element_type(g.spec.dtype), g.spec.head_dim_qk, g.spec.head_dim_v,
                                    t.block_n, t.stages, sm90_forward_early_k(t), t.block_m / 64,
                                    g.spec.cp_async_kv                ? ", true"
                                    : sm90_forward_persistent(g.spec) ? ", false, true"
                                                                      : ""),
                        g.spec.layout)
         << ";\n";
      os << "FAJIT_DEFINE_FORWARD_SM90(" << g.kernel_name << ", FaConfig, FaMods)\n";
    } else {
      os << "#include \"fajit/forward.cuh\"\n";
      os << "using FaConfig = "
         << with_layout(
                fmt::format("fa::FwdConfig<{}, {}, {}, {}, {}, {}, {}>", element_type(g.spec.dtype),
                            g.spec.head_dim_qk, g.spec.head_dim_v, t.block_m, t.block_n, t.warps, t.stages),
                g.spec.layout)
         << ";\n";
      os << "FAJIT_DEFINE_FORWARD(" << g.kernel_name << ", FaConfig, FaMods)\n";
    }
    // The host launches with KernelSpec::threads()/smem_bytes(); these keep it honest.
    os << fmt::format(
        "static_assert(FaConfig::kThreads == {}, \"host and template disagree on the block size\");\n",
        g.spec.threads());
    os << fmt::format(
        "static_assert(FaConfig::kSmemBytes == {}, \"host and template disagree on shared memory\");\n",
        g.spec.smem_bytes());
  } else if (g.spec.kind == KernelKind::kDecode) {
    const TileConfig& t = g.spec.tile;
    g.kernel_name = "fajit_decode";  // fajit_decode, fajit_decode_combine
    os << "#include \"fajit/decode.cuh\"\n";
    os << "using FaDecCfg = "
       << with_layout(fmt::format("fa::DecodeConfig<{}, {}, {}, {}, {}>", element_type(g.spec.dtype),
                                  g.spec.head_dim_qk, g.spec.head_dim_v, t.block_n, t.stages),
                      g.spec.layout)
       << ";\n";
    os << "FAJIT_DEFINE_DECODE(" << g.kernel_name << ", FaDecCfg, FaMods, " << g.spec.decode_ctas_per_sm()
       << ")\n";
    os << fmt::format(
        "static_assert(FaDecCfg::kThreads == {} && FaDecCfg::kBlockM == {} && FaDecCfg::kCombineWarps == {},"
        " \"host and template disagree on the decode launch\");\n",
        g.spec.threads(), t.block_m, kDecodeCombineWarps);
    os << fmt::format(
        "static_assert(FaDecCfg::kSmemBytes == {}, \"host and template disagree on shared memory\");\n",
        g.spec.smem_bytes());
  } else if (g.spec.kind == KernelKind::kBackward) {
    const TileConfig& t = g.spec.tile;
    g.kernel_name = "fajit_bwd";  // fajit_bwd_pre, fajit_bwd_dkdv, fajit_bwd_dq
    const char* det = g.spec.deterministic ? "true" : "false";
    if (g.spec.family == KernelFamily::kWgmma) {
      os << "#include \"fajit/backward_sm90.cuh\"\n";
      const std::string cfg =
          sm90_backward_wide(g.spec.head_dim_qk, g.spec.head_dim_v)
              ? fmt::format("fa::Sm90WideBwdConfig<{}, {}, {}, {}, {}>", element_type(g.spec.dtype),
                            g.spec.head_dim_qk, g.spec.head_dim_v, t.stages, det)
              : fmt::format("fa::Sm90BwdConfig<{}, {}, {}, {}, {}, {}>", element_type(g.spec.dtype),
                            g.spec.head_dim_qk, g.spec.head_dim_v, t.block_m, t.stages, det);
      os << "using FaBwdCfg = " << with_layout(cfg, g.spec.layout) << ";\n";
      os << "FAJIT_DEFINE_BACKWARD_SM90(" << g.kernel_name << ", FaBwdCfg, FaMods)\n";
    } else {
      os << "#include \"fajit/backward.cuh\"\n";
      os << "using FaBwdCfg = "
         << with_layout(fmt::format("fa::BwdConfig<{}, {}, {}, {}, {}, {}, {}>", element_type(g.spec.dtype),
                                    g.spec.head_dim_qk, g.spec.head_dim_v, t.block_m, t.warps, t.stages, det),
                        g.spec.layout)
         << ";\n";
      os << "FAJIT_DEFINE_BACKWARD(" << g.kernel_name << ", FaBwdCfg, FaMods)\n";
    }
    os << fmt::format(
        "static_assert(FaBwdCfg::kDetThreads == {} && FaBwdCfg::kDetSmemBytes == {},"
        " \"host and template disagree on the deterministic dQ kernel\");\n",
        bwd_det_threads(g.spec), bwd_det_smem_bytes(g.spec));
    os << fmt::format(
        "static_assert(FaBwdCfg::kThreads == {}, \"host and template disagree on the block size\");\n",
        g.spec.threads());
    os << fmt::format(
        "static_assert(FaBwdCfg::kSmemBytes == {}, \"host and template disagree on shared memory\");\n",
        g.spec.smem_bytes());
    os << fmt::format(
        "static_assert(FaBwdCfg::kBlockN == {} && FaBwdCfg::kPreThreads == {} && FaBwdCfg::kDkDvParts == {},"
        " \"host and template disagree on the tiles\");\n",
        t.block_n, kBwdAuxThreads, bwd_dkdv_parts(g.spec));
    os << fmt::format(
        "static_assert(FaBwdCfg::kPreRows == {} && FaBwdCfg::kDqRows == {},"
        " \"host and template disagree on the preprocess / dQ rows\");\n",
        bwd_aux_rows(g.spec.head_dim_v), bwd_aux_rows(g.spec.head_dim_qk));
  } else {
    g.kernel_name = "fajit_block_mask";
    os << "#include \"fajit/block_mask.cuh\"\n";
    os << "FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER(" << g.kernel_name << ", FaMods)\n";
  }
  g.source = os.str();
  return g;
}

GeneratedKernel generate_block_tables(const std::string& arch) {
  GeneratedKernel g;
  g.spec.kind = KernelKind::kBlockMask;
  g.spec.arch = arch;
  g.spec = g.spec.resolved(false, false);
  g.kernel_name = "fajit_block_mask";
  g.source =
      "// fajit block-mask tables: the builder's kernels that read no mods, one module for every mask_mod\n"
      "#include \"fajit/params.h\"\n"
      "#include \"fajit/block_mask.cuh\"\n"
      "FAJIT_DEFINE_BLOCK_TABLES(" +
      g.kernel_name + ")\n";
  return g;
}

}  // namespace fa
