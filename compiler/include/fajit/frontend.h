// The C++ tracing frontend: write score_mod / mask_mod as ordinary C++ over symbolic
// values; calling them inside fa::trace records fa-dialect IR.
//
//   fa::MaskMod sliding{"sliding", [](fa::Index b, fa::Index h, fa::Index q, fa::Index kv) {
//     auto w = fa::scalar<int32_t>("window");            // runtime value: never recompiles
//     return q >= kv && q - kv <= w;
//   }};
//   fa::ScoreMod alibi{"alibi", [](fa::Score s, fa::Index b, fa::Index h, fa::Index q,
//                                  fa::Index kv) {
//     auto slopes = fa::buffer<float>("slopes", 1);      // captured device buffer
//     return s + slopes[h] * (kv - q);                   // Index promotes to Score
//   }};
//   fa::Program p = fa::trace(alibi, sliding);
//   std::cout << p.to_mlir();
//
// Symbolic values never convert to bool: use fa::where instead of `if`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fajit/error.h"
#include "fajit/export.h"

namespace fa {

namespace detail {
// A handle to a value in the active trace: the MLIR value (opaque) and the trace's id, so
// a value carried from one trace into another is caught.
struct Sym {
  const void* value = nullptr;
  unsigned long long trace = 0;
};
enum class ValueKind { kInt, kFloat, kBool };
enum class BinOp { kAdd, kSub, kMul, kDiv, kRem, kMin, kMax, kLt, kLe, kGt, kGe, kEq, kNe, kAnd, kOr, kPow };
enum class UnOp {
  kNeg,
  kNot,
  kAbs,
  kExp,
  kExp2,
  kLog,
  kLog2,
  kTanh,
  kSqrt,
  kRsqrt,
  kSin,
  kCos,
  kFloor,
  kCeil,
  kErf,
  kSigmoid
};
FA_API Sym constant_int(int32_t v);
FA_API Sym constant_float(float v);
FA_API Sym constant_bool(bool v);
FA_API Sym binary(BinOp op, Sym a, Sym b);  // operands already of one kind
FA_API Sym unary(UnOp op, Sym a);
FA_API Sym select(Sym cond, Sym a, Sym b);
FA_API Sym convert(Sym a, ValueKind to);
FA_API Sym load(const std::string& buffer, ValueKind dtype, int rank, const Sym* idx, int n);
FA_API Sym scalar(const std::string& name, ValueKind dtype);
}  // namespace detail

class Score;

// A symbolic i32: b, h, q, kv and integer arithmetic on them.
class FA_API Index {
 public:
  Index(int32_t v) : sym_(detail::constant_int(v)) {}  // NOLINT: literals mix freely
  explicit Index(detail::Sym s) : sym_(s) {}
  detail::Sym sym() const { return sym_; }
  explicit operator bool() const = delete;  // trace with fa::where, not `if`

 private:
  detail::Sym sym_;
};

// A symbolic f32: the score and float arithmetic. An Index promotes to a Score.
class FA_API Score {
 public:
  Score(float v) : sym_(detail::constant_float(v)) {}                                   // NOLINT
  Score(int32_t v) : sym_(detail::constant_float(static_cast<float>(v))) {}             // NOLINT
  Score(double v) : sym_(detail::constant_float(static_cast<float>(v))) {}              // NOLINT
  Score(const Index& i) : sym_(detail::convert(i.sym(), detail::ValueKind::kFloat)) {}  // NOLINT
  explicit Score(detail::Sym s) : sym_(s) {}
  detail::Sym sym() const { return sym_; }
  explicit operator bool() const = delete;

 private:
  detail::Sym sym_;
};

// A symbolic i1: comparisons and mask results.
class FA_API Bool {
 public:
  Bool(bool v) : sym_(detail::constant_bool(v)) {}  // NOLINT
  explicit Bool(detail::Sym s) : sym_(s) {}
  detail::Sym sym() const { return sym_; }
  explicit operator bool() const = delete;

 private:
  detail::Sym sym_;
};

#define FA_BINARY(RET, T, OPSYM, KIND)                                 \
  inline RET operator OPSYM(const T& a, const T& b) {                  \
    return RET(detail::binary(detail::BinOp::KIND, a.sym(), b.sym())); \
  }
FA_BINARY(Index, Index, +, kAdd)
FA_BINARY(Index, Index, -, kSub)
FA_BINARY(Index, Index, *, kMul)
FA_BINARY(Index, Index, /, kDiv)  // C++ semantics: truncates toward zero
FA_BINARY(Index, Index, %, kRem)  // C++ semantics: sign of the dividend
FA_BINARY(Bool, Index, <, kLt)
FA_BINARY(Bool, Index, <=, kLe)
FA_BINARY(Bool, Index, >, kGt)
FA_BINARY(Bool, Index, >=, kGe)
FA_BINARY(Bool, Index, ==, kEq)
FA_BINARY(Bool, Index, !=, kNe)
FA_BINARY(Score, Score, +, kAdd)
FA_BINARY(Score, Score, -, kSub)
FA_BINARY(Score, Score, *, kMul)
FA_BINARY(Score, Score, /, kDiv)
FA_BINARY(Bool, Score, <, kLt)
FA_BINARY(Bool, Score, <=, kLe)
FA_BINARY(Bool, Score, >, kGt)
FA_BINARY(Bool, Score, >=, kGe)
FA_BINARY(Bool, Score, ==, kEq)
FA_BINARY(Bool, Score, !=, kNe)
FA_BINARY(Bool, Bool, &&, kAnd)  // both sides are always traced (no short circuit)
FA_BINARY(Bool, Bool, ||, kOr)
FA_BINARY(Bool, Bool, ==, kEq)
FA_BINARY(Bool, Bool, !=, kNe)
#undef FA_BINARY

inline Index operator-(const Index& a) { return Index(detail::unary(detail::UnOp::kNeg, a.sym())); }
inline Score operator-(const Score& a) { return Score(detail::unary(detail::UnOp::kNeg, a.sym())); }
inline Bool operator!(const Bool& a) { return Bool(detail::unary(detail::UnOp::kNot, a.sym())); }

// where(cond, a, b): a where cond holds, else b (arith.select).
inline Index where(const Bool& c, const Index& a, const Index& b) {
  return Index(detail::select(c.sym(), a.sym(), b.sym()));
}
inline Score where(const Bool& c, const Score& a, const Score& b) {
  return Score(detail::select(c.sym(), a.sym(), b.sym()));
}
inline Bool where(const Bool& c, const Bool& a, const Bool& b) {
  return Bool(detail::select(c.sym(), a.sym(), b.sym()));
}

inline Index min(const Index& a, const Index& b) {
  return Index(detail::binary(detail::BinOp::kMin, a.sym(), b.sym()));
}
inline Index max(const Index& a, const Index& b) {
  return Index(detail::binary(detail::BinOp::kMax, a.sym(), b.sym()));
}
inline Score min(const Score& a, const Score& b) {
  return Score(detail::binary(detail::BinOp::kMin, a.sym(), b.sym()));
}
inline Score max(const Score& a, const Score& b) {
  return Score(detail::binary(detail::BinOp::kMax, a.sym(), b.sym()));
}
inline Index abs(const Index& a) { return Index(detail::unary(detail::UnOp::kAbs, a.sym())); }
inline Score abs(const Score& a) { return Score(detail::unary(detail::UnOp::kAbs, a.sym())); }
inline Score pow(const Score& a, const Score& b) {
  return Score(detail::binary(detail::BinOp::kPow, a.sym(), b.sym()));
}

#define FA_UNARY(NAME, KIND) \
  inline Score NAME(const Score& a) { return Score(detail::unary(detail::UnOp::KIND, a.sym())); }
FA_UNARY(exp, kExp)
FA_UNARY(exp2, kExp2)
FA_UNARY(log, kLog)
FA_UNARY(log2, kLog2)
FA_UNARY(tanh, kTanh)
FA_UNARY(sqrt, kSqrt)
FA_UNARY(rsqrt, kRsqrt)
FA_UNARY(sin, kSin)
FA_UNARY(cos, kCos)
FA_UNARY(floor, kFloor)
FA_UNARY(ceil, kCeil)
FA_UNARY(erf, kErf)
FA_UNARY(sigmoid, kSigmoid)  // 1 / (1 + exp(-x))
#undef FA_UNARY

// Casts: to_float(i) is exact for |i| < 2^24; to_int truncates toward zero.
inline Score to_float(const Index& a) { return Score(a); }
inline Score to_float(const Bool& a) { return Score(detail::convert(a.sym(), detail::ValueKind::kFloat)); }
inline Index to_int(const Score& a) { return Index(detail::convert(a.sym(), detail::ValueKind::kInt)); }
inline Index to_int(const Bool& a) { return Index(detail::convert(a.sym(), detail::ValueKind::kInt)); }

namespace detail {
template <typename T>
constexpr ValueKind kind_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t>,
                "fa::buffer/fa::scalar element type must be float or int32_t");
  return std::is_same_v<T, float> ? ValueKind::kFloat : ValueKind::kInt;
}
template <typename T>
using SymbolicOf = std::conditional_t<std::is_same_v<T, float>, Score, Index>;
}  // namespace detail

// A named runtime scalar (fa.scalar): its value is a kernel argument bound at launch, so
// changing it never recompiles. Converts to Index (int32_t) or Score (float) where used.
template <typename T>
class Scalar {
 public:
  explicit Scalar(std::string name) : name_(std::move(name)) {}
  operator detail::SymbolicOf<T>() const {  // NOLINT: used like a value
    return detail::SymbolicOf<T>(detail::scalar(name_, detail::kind_of<T>()));
  }
  detail::SymbolicOf<T> value() const { return *this; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};
template <typename T>
Scalar<T> scalar(std::string name) {
  return Scalar<T>(std::move(name));
}

// A named captured buffer (fa.load): read-only device data such as ALiBi slopes or
// document ids, bound at launch. `buf[i]` for rank 1, `buf(i, j, ...)` for any rank.
template <typename T>
class Buffer {
 public:
  Buffer(std::string name, int rank) : name_(std::move(name)), rank_(rank) {}
  detail::SymbolicOf<T> operator[](const Index& i) const { return (*this)(i); }
  template <typename... I>
  detail::SymbolicOf<T> operator()(const I&... idx) const {
    const detail::Sym syms[] = {Index(idx).sym()...};
    return detail::SymbolicOf<T>(detail::load(name_, detail::kind_of<T>(), rank_, syms, sizeof...(I)));
  }
  const std::string& name() const { return name_; }
  int rank() const { return rank_; }

 private:
  std::string name_;
  int rank_;
};
template <typename T>
Buffer<T> buffer(std::string name, int rank) {
  return Buffer<T>(std::move(name), rank);
}

// ---- mods ------------------------------------------------------------------------------
using ScoreModFn = std::function<Score(Score score, Index b, Index h, Index q, Index kv)>;
using MaskModFn = std::function<Bool(Index b, Index h, Index q, Index kv)>;

// A named score_mod; the name becomes the IR symbol (@name).
struct ScoreMod {
  std::string name;
  ScoreModFn fn;
};
// A named mask_mod; the name becomes the IR symbol (@name).
struct MaskMod {
  std::string name;
  MaskModFn fn;
};

FA_API ScoreMod identity_score();                      // returns the score unchanged
FA_API MaskMod noop_mask();                            // keeps every (q, kv)
FA_API MaskMod and_masks(std::vector<MaskMod> masks);  // all must hold (noop if empty)
FA_API MaskMod or_masks(std::vector<MaskMod> masks);   // any may hold (masks all if empty)

class Program;

// Traces `score` and `mask` into one verified, simplified fa module. Throws fa::Error
// naming the mod and the problem (misuse of symbolic values, buffers used with two ranks,
// IR that fails verification).
FA_API Program trace(const ScoreMod& score, const MaskMod& mask);

// The fa IR of one attention variant: a score_mod and a mask_mod (either may be trivial),
// verified, canonicalized and CSE'd. Immutable; cheap to copy (shared).
class FA_API Program {
 public:
  // Parses fa-dialect MLIR text holding at most one fa.score_mod and one fa.mask_mod (a
  // missing one is the identity / noop). `source_name` appears in diagnostics.
  static Program parse(std::string_view mlir_text, std::string_view source_name = "<input>");

  std::string to_mlir() const;  // pretty-printed module
  // The score_mod's derivative (fa.score_grad, made by the fa-differentiate pass), printed;
  // throws fa::Error with the pass's diagnostic when the score_mod has none.
  std::string score_grad_mlir() const;
  std::string score_mod_name() const;
  std::string mask_mod_name() const;
  bool score_is_identity() const;  // the score_mod returns its score unchanged
  // The score_mod's derivative passes dT through (dS = dT, no buffer gradient: a bias such as
  // ALiBi); false where it has none.
  bool score_grad_is_identity() const;
  bool mask_is_noop() const;       // the mask_mod is constant true

  struct Capture {
    std::string name;
    bool is_buffer;  // else a runtime scalar
    bool is_float;   // f32, else i32
    int rank;        // buffers only
    bool used_by_score;
    bool used_by_mask;
  };
  // Captured buffers (in first-use order) then scalars (sorted by name).
  const std::vector<Capture>& captures() const;

  struct Impl;
  explicit Program(std::shared_ptr<const Impl> impl);
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace fa
