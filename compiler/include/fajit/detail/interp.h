// fa::ModProgram: a score_mod / mask_mod compiled once into a flat, MLIR-free program that the
// host evaluates exactly as the generated CUDA does. It is the oracle of every test that checks
// a kernel's mods, and what fa::reference_attention calls for every (b, h, q, kv).
//
//   fa::ModProgram alibi = fa::ModProgram::compile(scoreModOp);   // a verified fa.score_mod
//   fa::Bindings env;
//   env.buffer("slopes", fa::HostBuffer::f32(slopes.data(), {16}));
//   float s = alibi.eval_score(0.5f, /*b=*/0, /*h=*/3, /*q=*/7, /*kv=*/2, env);
//
//   fa::BoundMod fast = alibi.bind(env);         // checks the bindings once, for hot loops
//   for (...) acc += fast.score(s, b, h, q, kv);
//
//   // The derivative (fa.score_grad, from fa-differentiate): dS and the buffer gradients.
//   fa::ModProgram grad = fa::ModProgram::grad_of(program);
//   float ds = grad.bind(env).score_grad(s, b, h, q, kv, /*dt=*/1.0f, [&](const fa::GradAdd& g) {
//     slopes_grad[g.index[0]] += g.value;       // g.capture: "slopes"
//   });
//
// Semantics (what codegen must reproduce; pinned by tests/unit/interp_test.cpp):
//  - i32 (and i1) integer ops wrap around in two's complement; nsw/nuw flags are ignored.
//    i1 values are 0/1; signed i1 ops read true as -1, as arith does.
//  - divsi/divui/remsi/remui/ceildivsi/floordivsi by zero, and the signed overflow
//    INT_MIN / -1 (also INT_MIN % -1), are undefined behaviour on the GPU: evaluating one
//    throws fa::Error ("division by zero in arith.divsi", "signed division overflow
//    (-2147483648 / -1) in arith.divsi"). divsi/remsi truncate toward zero (C semantics);
//    floordivsi rounds toward -inf, ceildivsi toward +inf.
//  - shli/shrsi/shrui by an amount >= the bit width (amount read unsigned) is poison in arith:
//    throws fa::Error ("shift amount 32 is out of range for i32 in arith.shli").
//  - f32 arithmetic is done in float, one rounding per op (no fused multiply-add), as
//    __fadd_rn / __fmul_rn / IEEE division do. remf is fmodf.
//  - maximumf/minimumf propagate NaN; maxnumf/minnumf return the non-NaN operand. All four
//    order -0 below +0.
//  - cmpf: all 16 predicates, o* false and u* true when an operand is NaN.
//  - fptosi/fptoui truncate toward zero and saturate to the result type's range; NaN gives 0
//    (CUDA's cvt.rzi.{s32,u32}.f32, i.e. __float2int_rz / __float2uint_rz). sitofp/uitofp
//    round to nearest even (__int2float_rn / __uint2float_rn).
//  - math ops call the host's float libm (expf, exp2f, logf, log2f, tanhf, sqrtf, 1/sqrtf,
//    fabsf, sinf, cosf, powf, floorf, ceilf, erff): exact for sqrt/abs/floor/ceil, within a
//    few ulp of CUDA's for the transcendental ones, except math.tanh, which the kernels
//    compute as fa::mod::tanh (templates/fajit/modlib.cuh: absolute error ~2^-22, relative
//    < 1e-6). math.absi of INT_MIN is INT_MIN.
//  - fa.load checks every index against its dimension and throws fa::Error when it is out
//    of bounds ("capture 'slopes' index 16 is out of bounds for dimension 0 of size 16"), and
//    so does fa.grad_add (a score_grad's), before it calls the sink.
// Evaluation allocates nothing and never touches MLIR; a ModProgram and a BoundMod may be
// used from many threads at once. A ModProgram is immutable and cheap to copy.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mlir {
class Operation;
}

namespace fa {

class Program;

// The value types of a mod body: i1, i32, f32 (buffers and scalars are i32 or f32).
enum class ScalarType : uint8_t { kI1, kI32, kF32 };
const char* scalar_type_name(ScalarType t);  // "i1", "i32", "f32"

enum class ModKind : uint8_t { kScore, kMask, kScoreGrad };

// A host buffer bound to a capture: element type, sizes and element strides (empty strides =
// contiguous row-major). Not owned.
struct HostBuffer {
  ScalarType dtype = ScalarType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty = contiguous
  const void* data = nullptr;

  static HostBuffer f32(const float* data, std::vector<int64_t> shape, std::vector<int64_t> strides = {});
  static HostBuffer i32(const int32_t* data, std::vector<int64_t> shape, std::vector<int64_t> strides = {});
};

// A named runtime scalar's value.
struct ScalarValue {
  ScalarType type = ScalarType::kF32;
  union {
    float f;
    int32_t i;
  };
  ScalarValue() : f(0) {}
};

// What a mod's captures and runtime scalars are bound to, by name. Names are shared by the
// score_mod and mask_mod of one module, so one Bindings serves both.
class Bindings {
 public:
  Bindings& buffer(std::string name, HostBuffer buf);
  Bindings& scalar_f32(std::string name, float value);
  Bindings& scalar_i32(std::string name, int32_t value);

  const HostBuffer* find_buffer(std::string_view name) const;  // nullptr when unbound
  const ScalarValue* find_scalar(std::string_view name) const;

 private:
  std::map<std::string, HostBuffer, std::less<>> buffers_;
  std::map<std::string, ScalarValue, std::less<>> scalars_;
};

struct CaptureInfo {
  std::string name;
  ScalarType dtype;
  int rank;
};

struct ScalarInfo {
  std::string name;
  ScalarType type;
};

// One fa.grad_add of a score_grad, as evaluated: `value` (dt * d score_mod / d element) is to
// be added to the gradient of element `index[0..rank)` of the captured buffer `capture`
// (slot `slot` of ModProgram::captures()).
struct GradAdd {
  const std::string& capture;
  int slot;
  int rank;
  int32_t index[4];
  float value;
};
// Called once per fa.grad_add, in program order. A null sink drops them.
using GradSink = std::function<void(const GradAdd&)>;

namespace detail {

union Reg {
  int32_t i;
  uint32_t u;
  float f;
};

// Inst::op of an fa.grad_add (not a body op of the table: only score_grads hold it).
inline constexpr uint8_t kGradAddOp = 0xff;

struct Inst {
  uint8_t op;       // mlir::fa::BodyOp (fajit/Dialect/FA/BodyOps.h), or kGradAddOp
  uint8_t width;    // integer bit width (1 or 32) of the op / its source / its result; a
                    // load's or grad_add's rank
  uint16_t aux;     // cmp predicate, or capture slot of a load / grad_add
  uint32_t dst;     // register written (grad_add: the register of the value it adds)
  uint32_t src[4];  // registers read (load, grad_add: the indices)
};

struct BoundBuffer {
  const char* data;
  int64_t shape[4];
  int64_t stride[4];  // in bytes
};

// What ModProgram::compile produces.
struct ModFields {
  ModKind kind = ModKind::kScore;
  std::string name;
  std::vector<CaptureInfo> captures;
  std::vector<ScalarInfo> scalars;
  std::vector<uint32_t> scalar_regs;  // register of scalars[i]
  std::vector<Reg> init;              // initial register file: args, constants, scalars
  std::vector<Inst> code;
  uint32_t result = 0;  // register yielded
};

}  // namespace detail

class BoundMod;

class ModProgram {
 public:
  // Compiles a verified fa.score_mod / fa.mask_mod / fa.score_grad. Throws fa::Error naming the op when the
  // body holds something the interpreter does not implement.
  // Takes MLIR: for the compiler itself; tools use score_of / mask_of.
  static ModProgram compile(mlir::Operation* mod);
  // The score_mod / mask_mod of a traced or parsed program.
  static ModProgram score_of(const Program& program);
  static ModProgram mask_of(const Program& program);
  // The derivative of the program's score_mod (its fa.score_grad). Throws fa::Error with the
  // differentiation pass's diagnostic when the score_mod has none.
  static ModProgram grad_of(const Program& program);

  ModKind kind() const { return f_->kind; }
  const std::string& name() const { return f_->name; }  // symbol name, without '@'
  const std::vector<CaptureInfo>& captures() const { return f_->captures; }
  const std::vector<ScalarInfo>& scalars() const { return f_->scalars; }  // unique, in first-use order
  size_t num_instructions() const { return f_->code.size(); }
  size_t num_registers() const { return f_->init.size(); }

  // Checks `env` against the captures and scalars and resolves them (throws fa::Error:
  // "missing capture 'slopes' (a f32 buffer of rank 1)", "capture 'slopes' must be a f32
  // buffer, got i32", "capture 'slopes' must have rank 1, got 2", "missing scalar 'cap'
  // (f32)", "scalar 'cap' must be f32, got i32"). The result refers to this program and to
  // the buffers' data, which must outlive it (the program is shared, so it may not).
  BoundMod bind(const Bindings& env) const;

  // One-off evaluation (binds `env` on every call: use bind() in loops). eval_score needs a
  // score_mod, eval_mask a mask_mod (fa::Error otherwise).
  float eval_score(float score, int b, int h, int q, int kv, const Bindings& env) const;
  bool eval_mask(int b, int h, int q, int kv, const Bindings& env) const;
  // A score_grad's dS = dt * d score_mod / d score, each grad_add passed to `sink`.
  float eval_score_grad(float score, int b, int h, int q, int kv, float dt, const Bindings& env,
                        const GradSink& sink = {}) const;

 private:
  friend class BoundMod;
  explicit ModProgram(std::shared_ptr<const detail::ModFields> f) : f_(std::move(f)) {}
  std::shared_ptr<const detail::ModFields> f_;  // immutable once compiled; copies share it
};

// A ModProgram with its bindings checked and resolved: evaluation is a straight run over the
// instructions.
class BoundMod {
 public:
  float score(float score, int b, int h, int q, int kv) const;  // a score_mod's result
  bool mask(int b, int h, int q, int kv) const;                 // a mask_mod's result
  // A score_grad's dS; its grad_adds go to `sink` (dropped when null).
  float score_grad(float score, int b, int h, int q, int kv, float dt, const GradSink& sink = {}) const;
  const ModProgram& program() const { return prog_; }

 private:
  friend class ModProgram;
  explicit BoundMod(ModProgram prog) : prog_(std::move(prog)) {}
  detail::Reg run(const int32_t* args, float score, float dt = 0.0f, const GradSink* sink = nullptr) const;

  ModProgram prog_;
  std::vector<detail::BoundBuffer> buffers_;
  std::vector<detail::Reg> scalar_values_;
};

}  // namespace fa
