// The C API (fajit/fajit_c.h) over fa::compile / fa::Kernel: exceptions become status codes
// plus a thread-local message.
#include "fajit/fajit_c.h"

#include <climits>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "llvm/Support/raw_ostream.h"

#include "fajit/detail/interp.h"
#include "fajit/detail/program_impl.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"

struct fajit_kernel {
  fa::Kernel kernel;
  std::string mlir;
  std::string ptx;
  std::string tune_text;  // fajit_kernel_autotune_report
};

struct fajit_block_mask {
  fa::BlockMask mask;
  std::string text;  // fajit_block_mask_to_string
};

// What fajit_program_block_mask builds a program's masks with, made on its first call for a set
// of options: a BlockMaskFactory over the replayed mask_mod, or a kernel where it cannot be
// replayed.
struct fajit_mask_source {
  std::optional<fa::BlockMaskFactory> factory;
  std::optional<fa::Kernel> kernel;
};

struct fajit_program {
  explicit fajit_program(fa::Program p) : program(std::move(p)) {}
  fa::Program program;
  std::string mlir;
  std::string grad_mlir;
  std::vector<std::string> gradient_buffers;
  // fajit_program_block_mask's sources, by dtype, head dims and arch (the options they read).
  mutable std::mutex mask_sources_mutex;
  mutable std::map<std::string, std::shared_ptr<const fajit_mask_source>> mask_sources;
};

namespace {

thread_local std::string t_last_error;

fajit_status fail(fajit_status s, const std::string& message) {
  t_last_error = message;
  return s;
}

template <typename F>
fajit_status guarded(F&& f) {
  try {
    f();
    return FAJIT_OK;
  } catch (const fa::Error& e) {
    return fail(static_cast<fajit_status>(static_cast<int>(e.code())), e.what());
  } catch (const std::bad_alloc&) {
    return fail(FAJIT_ERROR_INTERNAL, "out of host memory");
  } catch (const std::exception& e) {
    return fail(FAJIT_ERROR_INTERNAL, e.what());
  }
}

fa::Options to_options(const fajit_options* o) {
  fajit_options d = fajit_default_options();
  if (!o) o = &d;
  fa::Options r;
  if (o->dtype != FAJIT_BF16 && o->dtype != FAJIT_F16)
    throw fa::Error("options.dtype must be FAJIT_BF16 or FAJIT_F16");
  r.dtype = static_cast<fa::DType>(o->dtype);
  r.head_dim_qk = o->head_dim_qk;
  r.head_dim_v = o->head_dim_v;
  if (o->arch) r.arch = o->arch;
  return r;
}

fa::TensorView to_view(const fajit_tensor* t, const char* what) {
  if (!t) throw fa::Error(std::string(what) + ": tensor is NULL");
  if (t->rank < 1 || t->rank > 4)
    throw fa::Error(std::string(what) + ": rank must be 1 to 4, got " + std::to_string(t->rank));
  fa::TensorView v;
  v.data = t->data;
  v.dtype = static_cast<fa::DType>(t->dtype);
  v.rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    v.shape[i] = t->shape[i];
    v.stride[i] = t->stride[i];
  }
  return v;
}

fa::Captures to_captures(const fajit_captures* c) {
  fa::Captures r;
  if (!c) return r;
  if (c->num_buffers < 0 || c->num_scalars < 0)
    throw fa::Error(fmt::format("captures: num_buffers and num_scalars must be >= 0, got {} and {}",
                                c->num_buffers, c->num_scalars));
  if (c->num_buffers > 0 && !c->buffers)
    throw fa::Error(fmt::format("captures: buffers is NULL with num_buffers = {}", c->num_buffers));
  if (c->num_scalars > 0 && !c->scalars)
    throw fa::Error(fmt::format("captures: scalars is NULL with num_scalars = {}", c->num_scalars));
  for (int i = 0; i < c->num_buffers; ++i) {
    if (!c->buffers[i].name) throw fa::Error("captures: buffer " + std::to_string(i) + " has no name");
    r.buffer(c->buffers[i].name, to_view(&c->buffers[i].tensor, c->buffers[i].name));
  }
  for (int i = 0; i < c->num_scalars; ++i) {
    const fajit_scalar_capture& s = c->scalars[i];
    if (!s.name) throw fa::Error("captures: scalar " + std::to_string(i) + " has no name");
    if (s.is_float)
      r.scalar(s.name, s.f);
    else
      r.scalar(s.name, s.i);
  }
  return r;
}

template <typename T>
void require(T* p, const char* what) {
  if (!p) throw fa::Error(std::string(what) + " is NULL");
}

fa::BlockMaskOptions mask_options(int q_block, int kv_block) {
  fa::BlockMaskOptions o;
  if (q_block < 0 || kv_block < 0)
    throw fa::Error(fmt::format("block sizes must be positive (0 = {}), got {}x{}",
                                fa::BlockMask::kDefaultBlock, q_block, kv_block));
  if (q_block) o.q_block = q_block;
  if (kv_block) o.kv_block = kv_block;
  return o;
}

// The compute capability of the current context's device ("cc90"), or "none" without a GPU:
// what an empty Options::arch resolves by.
std::string current_arch() {
  if (!fa::rt::cuda_available()) return "none";
  fa::rt::ContextGuard guard;
  const fa::rt::DeviceInfo& d = fa::rt::current_device_info();
  return fmt::format("cc{}{}", d.cc_major, d.cc_minor);
}

fajit_program* new_program(fa::Program p) {
  auto* r = new fajit_program(p);
  r->mlir = p.to_mlir();
  r->gradient_buffers = fa::detail::gradient_buffers(p);
  return r;
}

// The mask_mod of `p` replayed through the tracing frontend, so fa::create_block_mask builds
// its mask without compiling a forward kernel. Every op the canonical IR of a traced mask
// holds is replayed; an op the frontend cannot express makes the replay throw `Unreplayable`
// and the caller falls back to a kernel.
struct Unreplayable {};

fa::MaskMod replay_mask(const fa::Program& p) {
  return {
      p.mask_mod_name(), [p](fa::Index b, fa::Index h, fa::Index q, fa::Index kv) {
        namespace arith = mlir::arith;
        namespace math = mlir::math;
        using fa::detail::BinOp;
        using fa::detail::Sym;
        using fa::detail::UnOp;
        using fa::detail::ValueKind;
        mlir::fa::MaskModOp mask = p.impl().mask;
        mlir::Block& entry = mask.getEntryBlock();
        llvm::DenseMap<mlir::Value, Sym> env;
        const Sym fixed[] = {b.sym(), h.sym(), q.sym(), kv.sym()};
        for (unsigned i = 0; i < 4; ++i) env[entry.getArgument(i)] = fixed[i];
        auto names = mask.getCaptureNamesAttr();
        auto kind = [](mlir::Type t) {
          return t.isF32() ? ValueKind::kFloat : t.isSignlessInteger(1) ? ValueKind::kBool : ValueKind::kInt;
        };
        auto in = [&](mlir::Value v) { return env.at(v); };
        auto bin = [&](mlir::Operation& op, BinOp k) {
          return fa::detail::binary(k, in(op.getOperand(0)), in(op.getOperand(1)));
        };
        auto un = [&](mlir::Operation& op, UnOp k) { return fa::detail::unary(k, in(op.getOperand(0))); };
        for (mlir::Operation& op : entry.getOperations()) {
          Sym r{};
          if (auto y = llvm::dyn_cast<mlir::fa::YieldOp>(op)) return fa::Bool(in(y.getValue()));
          if (auto c = llvm::dyn_cast<arith::ConstantOp>(op)) {
            mlir::Attribute a = c.getValue();
            if (auto f = llvm::dyn_cast<mlir::FloatAttr>(a))
              r = fa::detail::constant_float(static_cast<float>(f.getValueAsDouble()));
            else if (auto i = llvm::dyn_cast<mlir::IntegerAttr>(a))
              r = i.getType().isSignlessInteger(1)
                      ? fa::detail::constant_bool(i.getValue().getBoolValue())
                      : fa::detail::constant_int(static_cast<int32_t>(i.getValue().getSExtValue()));
            else
              throw Unreplayable{};
          } else if (auto s = llvm::dyn_cast<mlir::fa::ScalarOp>(op)) {
            r = fa::detail::scalar(s.getName().str(), kind(s.getType()));
          } else if (auto l = llvm::dyn_cast<mlir::fa::LoadOp>(op)) {
            auto arg = llvm::cast<mlir::BlockArgument>(l.getBuffer());
            std::string name = llvm::cast<mlir::StringAttr>(names[arg.getArgNumber() - 4]).str();
            std::vector<Sym> idx;
            for (mlir::Value i : l.getIndices()) idx.push_back(in(i));
            auto type = llvm::cast<mlir::fa::BufferType>(arg.getType());
            r = fa::detail::load(name, kind(type.getElementType()), static_cast<int>(type.getRank()),
                                 idx.data(), static_cast<int>(idx.size()));
          } else if (auto c = llvm::dyn_cast<arith::CmpIOp>(op)) {
            switch (c.getPredicate()) {
              case arith::CmpIPredicate::slt: r = bin(op, BinOp::kLt); break;
              case arith::CmpIPredicate::sle: r = bin(op, BinOp::kLe); break;
              case arith::CmpIPredicate::sgt: r = bin(op, BinOp::kGt); break;
              case arith::CmpIPredicate::sge: r = bin(op, BinOp::kGe); break;
              case arith::CmpIPredicate::eq: r = bin(op, BinOp::kEq); break;
              case arith::CmpIPredicate::ne: r = bin(op, BinOp::kNe); break;
              default: throw Unreplayable{};
            }
          } else if (auto c = llvm::dyn_cast<arith::CmpFOp>(op)) {
            switch (c.getPredicate()) {
              case arith::CmpFPredicate::OLT: r = bin(op, BinOp::kLt); break;
              case arith::CmpFPredicate::OLE: r = bin(op, BinOp::kLe); break;
              case arith::CmpFPredicate::OGT: r = bin(op, BinOp::kGt); break;
              case arith::CmpFPredicate::OGE: r = bin(op, BinOp::kGe); break;
              case arith::CmpFPredicate::OEQ: r = bin(op, BinOp::kEq); break;
              case arith::CmpFPredicate::UNE: r = bin(op, BinOp::kNe); break;
              default: throw Unreplayable{};
            }
          } else if (llvm::isa<arith::AddIOp, arith::AddFOp>(op)) {
            r = bin(op, BinOp::kAdd);
          } else if (llvm::isa<arith::SubIOp, arith::SubFOp>(op)) {
            r = bin(op, BinOp::kSub);
          } else if (llvm::isa<arith::MulIOp, arith::MulFOp>(op)) {
            r = bin(op, BinOp::kMul);
          } else if (llvm::isa<arith::DivSIOp, arith::DivFOp>(op)) {
            r = bin(op, BinOp::kDiv);
          } else if (llvm::isa<arith::RemSIOp, arith::RemFOp>(op)) {
            r = bin(op, BinOp::kRem);
          } else if (llvm::isa<arith::MinSIOp, arith::MinimumFOp>(op)) {
            r = bin(op, BinOp::kMin);
          } else if (llvm::isa<arith::MaxSIOp, arith::MaximumFOp>(op)) {
            r = bin(op, BinOp::kMax);
          } else if (llvm::isa<arith::AndIOp>(op) && op.getResult(0).getType().isSignlessInteger(1)) {
            r = bin(op, BinOp::kAnd);
          } else if (llvm::isa<arith::OrIOp>(op) && op.getResult(0).getType().isSignlessInteger(1)) {
            r = bin(op, BinOp::kOr);
          } else if (llvm::isa<arith::XOrIOp>(op) && op.getResult(0).getType().isSignlessInteger(1)) {
            r = bin(op, BinOp::kNe);  // xor of two i1 is !=
          } else if (llvm::isa<arith::FloorDivSIOp>(op)) {
            // floor(a / b) = a / b - (a % b != 0 && (a % b < 0) != (b < 0))
            Sym a = in(op.getOperand(0)), d = in(op.getOperand(1));
            Sym zero = fa::detail::constant_int(0), one = fa::detail::constant_int(1);
            Sym rem = fa::detail::binary(BinOp::kRem, a, d);
            Sym fix =
                fa::detail::binary(BinOp::kAnd, fa::detail::binary(BinOp::kNe, rem, zero),
                                   fa::detail::binary(BinOp::kNe, fa::detail::binary(BinOp::kLt, rem, zero),
                                                      fa::detail::binary(BinOp::kLt, d, zero)));
            r = fa::detail::binary(BinOp::kSub, fa::detail::binary(BinOp::kDiv, a, d),
                                   fa::detail::select(fix, one, zero));
          } else if (auto s = llvm::dyn_cast<arith::SelectOp>(op)) {
            r = fa::detail::select(in(s.getCondition()), in(s.getTrueValue()), in(s.getFalseValue()));
          } else if (llvm::isa<arith::SIToFPOp, arith::UIToFPOp>(op)) {
            r = fa::detail::convert(in(op.getOperand(0)), ValueKind::kFloat);
          } else if (llvm::isa<arith::FPToSIOp>(op) ||
                     (llvm::isa<arith::ExtUIOp>(op) && op.getOperand(0).getType().isSignlessInteger(1))) {
            r = fa::detail::convert(in(op.getOperand(0)), ValueKind::kInt);
          } else if (llvm::isa<arith::NegFOp>(op)) {
            r = un(op, UnOp::kNeg);
          } else if (llvm::isa<math::AbsIOp, math::AbsFOp>(op)) {
            r = un(op, UnOp::kAbs);
          } else if (llvm::isa<math::PowFOp>(op)) {
            r = bin(op, BinOp::kPow);
          } else {
            const std::pair<mlir::TypeID, UnOp> unary[] = {{mlir::TypeID::get<math::ExpOp>(), UnOp::kExp},
                                                           {mlir::TypeID::get<math::Exp2Op>(), UnOp::kExp2},
                                                           {mlir::TypeID::get<math::LogOp>(), UnOp::kLog},
                                                           {mlir::TypeID::get<math::Log2Op>(), UnOp::kLog2},
                                                           {mlir::TypeID::get<math::TanhOp>(), UnOp::kTanh},
                                                           {mlir::TypeID::get<math::SqrtOp>(), UnOp::kSqrt},
                                                           {mlir::TypeID::get<math::RsqrtOp>(), UnOp::kRsqrt},
                                                           {mlir::TypeID::get<math::SinOp>(), UnOp::kSin},
                                                           {mlir::TypeID::get<math::CosOp>(), UnOp::kCos},
                                                           {mlir::TypeID::get<math::FloorOp>(), UnOp::kFloor},
                                                           {mlir::TypeID::get<math::CeilOp>(), UnOp::kCeil},
                                                           {mlir::TypeID::get<math::ErfOp>(), UnOp::kErf}};
            bool found = false;
            for (auto& [id, k] : unary)
              if (op.getName().getTypeID() == id) {
                r = un(op, k);
                found = true;
              }
            if (!found) throw Unreplayable{};
          }
          env[op.getResult(0)] = r;
        }
        throw Unreplayable{};
      }};
}

// The kv-table arguments of fajit_block_mask_from_(device_)kv_blocks, checked; their block sizes.
fa::BlockMaskOptions kv_table_args(int q_block, int kv_block, const int32_t* kv_num_blocks,
                                   const int32_t* kv_indices, const int32_t* full_kv_num_blocks,
                                   const int32_t* full_kv_indices, fajit_block_mask** out) {
  require(kv_num_blocks, "kv_num_blocks");
  require(kv_indices, "kv_indices");
  require(out, "out");
  fa::BlockMaskOptions bo = mask_options(q_block, kv_block);
  if ((full_kv_num_blocks == nullptr) != (full_kv_indices == nullptr))
    throw fa::Error("full_kv_num_blocks and full_kv_indices must both be given or both be NULL");
  return bo;
}

}  // namespace

extern "C" {

const char* fajit_last_error(void) { return t_last_error.c_str(); }

fajit_options fajit_default_options(void) { return fajit_options{FAJIT_BF16, 128, 128, nullptr}; }

fajit_status fajit_compile_mlir(const char* mlir_text, const fajit_options* options, fajit_kernel** out) {
  return guarded([&] {
    require(mlir_text, "mlir_text");
    require(out, "out");
    fa::Program p = fa::Program::parse(mlir_text, "<fajit_compile_mlir>");
    *out = new fajit_kernel{fa::compile(p, to_options(options)), p.to_mlir(), {}, {}};
  });
}

fajit_status fajit_compile_preset(const char* mask_preset, const char* score_preset,
                                  const fajit_options* options, fajit_kernel** out) {
  return guarded([&] {
    require(out, "out");
    fa::MaskMod m = mask_preset && *mask_preset ? fa::mods::mask_preset(mask_preset).mod : fa::noop_mask();
    fa::ScoreMod s =
        score_preset && *score_preset ? fa::mods::score_preset(score_preset).mod : fa::identity_score();
    fa::Program p = fa::trace(s, m);
    *out = new fajit_kernel{fa::compile(p, to_options(options)), p.to_mlir(), {}, {}};
  });
}

fajit_status fajit_program_parse(const char* mlir_text, fajit_program** out) {
  return guarded([&] {
    require(mlir_text, "mlir_text");
    require(out, "out");
    *out = new_program(fa::Program::parse(mlir_text, "<fajit_program_parse>"));
  });
}

fajit_status fajit_program_preset(const char* mask_preset, const char* score_preset, fajit_program** out) {
  return guarded([&] {
    require(out, "out");
    fa::MaskMod m = mask_preset && *mask_preset ? fa::mods::mask_preset(mask_preset).mod : fa::noop_mask();
    fa::ScoreMod s =
        score_preset && *score_preset ? fa::mods::score_preset(score_preset).mod : fa::identity_score();
    *out = new_program(fa::trace(s, m));
  });
}

void fajit_program_destroy(fajit_program* program) { delete program; }

const char* fajit_program_mlir(const fajit_program* p) { return p ? p->mlir.c_str() : ""; }

fajit_status fajit_program_score_grad_mlir(fajit_program* p, const char** text) {
  return guarded([&] {
    require(p, "program");
    require(text, "text");
    if (p->grad_mlir.empty()) p->grad_mlir = p->program.score_grad_mlir();
    *text = p->grad_mlir.c_str();
  });
}

int fajit_program_num_captures(const fajit_program* p) {
  return p ? static_cast<int>(p->program.captures().size()) : 0;
}

fajit_status fajit_program_capture(const fajit_program* p, int index, fajit_capture_info* out) {
  return guarded([&] {
    require(p, "program");
    require(out, "out");
    const auto& caps = p->program.captures();
    if (index < 0 || index >= static_cast<int>(caps.size()))
      throw fa::Error(fmt::format("capture index {} is outside [0, {})", index, caps.size()));
    const fa::Program::Capture& c = caps[index];
    bool grad = false;
    for (const std::string& g : p->gradient_buffers) grad = grad || (c.is_buffer && g == c.name);
    *out = fajit_capture_info{c.name.c_str(),  c.is_buffer,    c.is_float, c.rank,
                              c.used_by_score, c.used_by_mask, grad};
  });
}

namespace {

// Host captures as the interpreter binds them: f32 / i32 buffers (host memory, strides in
// elements) and scalars, by name.
fa::Bindings host_bindings(const fajit_captures* c) {
  fa::Bindings env;
  const fa::Captures cap = to_captures(c);  // the same checks as a launch's (counts, names, ranks)
  for (const auto& [name, t] : cap.buffers()) {
    if (t.dtype != fa::DType::f32 && t.dtype != fa::DType::i32)
      throw fa::Error(fmt::format("capture '{}': a buffer must be FAJIT_F32 or FAJIT_I32", name));
    if (!t.data) throw fa::Error(fmt::format("capture '{}': data is NULL", name));
    std::vector<int64_t> shape(t.shape, t.shape + t.rank), strides(t.stride, t.stride + t.rank);
    env.buffer(name, t.dtype == fa::DType::f32
                         ? fa::HostBuffer::f32(static_cast<const float*>(t.data), shape, strides)
                         : fa::HostBuffer::i32(static_cast<const int32_t*>(t.data), shape, strides));
  }
  for (const auto& [name, v] : cap.scalars()) {
    if (v.is_float)
      env.scalar_f32(name, v.f);
    else
      env.scalar_i32(name, v.i);
  }
  return env;
}

}  // namespace

fajit_status fajit_program_evaluate(const fajit_program* p, int64_t n, const int32_t* b, const int32_t* h,
                                    const int32_t* q, const int32_t* kv, const float* score,
                                    const fajit_captures* captures, float* score_out, uint8_t* mask_out) {
  return guarded([&] {
    require(p, "program");
    if (n < 0) throw fa::Error(fmt::format("evaluate: n must be >= 0, got {}", n));
    if (!score_out && !mask_out) throw fa::Error("evaluate: score_out and mask_out are both NULL");
    if (n == 0) return;
    require(b, "b");
    require(h, "h");
    require(q, "q");
    require(kv, "kv");
    if (score_out && !score) throw fa::Error("evaluate: score_out needs the scores; score is NULL");
    const fa::Bindings env = host_bindings(captures);
    if (score_out) {
      const fa::BoundMod m = fa::ModProgram::score_of(p->program).bind(env);
      for (int64_t i = 0; i < n; ++i) score_out[i] = m.score(score[i], b[i], h[i], q[i], kv[i]);
    }
    if (mask_out) {
      const fa::BoundMod m = fa::ModProgram::mask_of(p->program).bind(env);
      for (int64_t i = 0; i < n; ++i) mask_out[i] = m.mask(b[i], h[i], q[i], kv[i]) ? 1 : 0;
    }
  });
}

fajit_status fajit_compile_program(const fajit_program* p, const fajit_options* options, fajit_kernel** out) {
  return guarded([&] {
    require(p, "program");
    require(out, "out");
    *out = new fajit_kernel{fa::compile(p->program, to_options(options)), p->mlir, {}, {}};
  });
}

fajit_status fajit_compile_program_background(const fajit_program* p, const fajit_options* options,
                                              unsigned background, fajit_kernel** out) {
  return guarded([&] {
    require(p, "program");
    require(out, "out");
    if (background & ~static_cast<unsigned>(FAJIT_WARM_BACKWARD))
      throw fa::Error(
          fmt::format("background: flags {:#x} name kernels that do not compile in the background "
                      "(only FAJIT_WARM_BACKWARD does)",
                      background & ~static_cast<unsigned>(FAJIT_WARM_BACKWARD)));
    fa::Options o = to_options(options);
    o.backward_in_background = (background & FAJIT_WARM_BACKWARD) != 0;
    *out = new fajit_kernel{fa::compile(p->program, o), p->mlir, {}, {}};
  });
}

fajit_status fajit_program_block_mask(const fajit_program* p, int batch, int heads, int64_t len_q,
                                      int64_t len_kv, int q_block, int kv_block,
                                      const fajit_captures* captures, const fajit_options* options,
                                      void* cu_stream, fajit_block_mask** out) {
  return guarded([&] {
    require(p, "program");
    require(out, "out");
    fa::BlockMaskOptions bo = mask_options(q_block, kv_block);
    fa::Options o = to_options(options);
    fa::Captures cap = to_captures(captures);
    auto stream = static_cast<fa::Stream>(cu_stream);
    // The mask_mod is traced and its builder compiled once per program and options, not at every
    // call (a training loop builds a new document mask each step). The key holds what the source
    // depends on: the options and, where they leave the arch to the GPU, the current device's.
    const std::string key = fmt::format("{}/{}/{}/{}", static_cast<int>(o.dtype), o.head_dim_qk, o.head_dim_v,
                                        o.arch.empty() ? current_arch() : o.arch);
    std::shared_ptr<const fajit_mask_source> source;
    {
      std::lock_guard<std::mutex> lock(p->mask_sources_mutex);
      auto it = p->mask_sources.find(key);
      if (it != p->mask_sources.end()) source = it->second;
    }
    if (!source) {  // made outside the lock (a kernel compile takes seconds); the first one made stays
      auto made = std::make_shared<fajit_mask_source>();
      try {
        made->factory.emplace(replay_mask(p->program), o);
      } catch (const Unreplayable&) {
        // The frontend cannot express an op of this mask_mod: build it beside a kernel instead.
        made->kernel.emplace(fa::compile(p->program, o));
      }
      std::lock_guard<std::mutex> lock(p->mask_sources_mutex);
      source = p->mask_sources.emplace(key, std::move(made)).first->second;
    }
    fa::BlockMask m = source->factory
                          ? source->factory->build(batch, heads, len_q, len_kv, cap, bo, stream)
                          : source->kernel->block_mask(batch, heads, len_q, len_kv, cap, bo, stream);
    *out = new fajit_block_mask{std::move(m), {}};
  });
}

void fajit_kernel_destroy(fajit_kernel* kernel) { delete kernel; }

const char* fajit_kernel_cuda_source(const fajit_kernel* k) {
  return k ? k->kernel.cuda_source().c_str() : "";
}
const char* fajit_kernel_mlir(const fajit_kernel* k) { return k ? k->mlir.c_str() : ""; }
const char* fajit_kernel_cache_key(const fajit_kernel* k) { return k ? k->kernel.cache_key().c_str() : ""; }
const char* fajit_kernel_origin(const fajit_kernel* k) { return k ? fa::to_string(k->kernel.origin()) : ""; }

const char* fajit_kernel_autotune_report(fajit_kernel* k) {
  if (!k) return "";
  k->tune_text.clear();
  for (const fa::TuneRecord& r : k->kernel.tune_records()) k->tune_text += fa::to_string(r) + "\n";
  return k->tune_text.c_str();
}

const void* fajit_kernel_cubin(const fajit_kernel* k, size_t* size) {
  if (!k) return nullptr;
  if (size) *size = k->kernel.cubin().size();
  return k->kernel.cubin().data();
}

fajit_status fajit_kernel_ptx(fajit_kernel* k, const char** ptx) {
  return guarded([&] {
    require(k, "kernel");
    require(ptx, "ptx");
    if (k->ptx.empty()) k->ptx = k->kernel.ptx();
    *ptx = k->ptx.c_str();
  });
}

fajit_status fajit_kernel_warm(const fajit_kernel* k, unsigned flags, int* kernels) {
  return guarded([&] {
    require(k, "kernel");
    constexpr unsigned kAll = FAJIT_WARM_BLOCK_MASK | FAJIT_WARM_BACKWARD | FAJIT_WARM_DETERMINISTIC |
                              FAJIT_WARM_DECODE | FAJIT_WARM_RAGGED | FAJIT_WARM_PAGED | FAJIT_WARM_ROW_MAX |
                              FAJIT_WARM_CANDIDATES;
    if (flags & ~kAll)
      throw fa::Error(
          fmt::format("flags: unknown bits {:#x} (known: fajit_warm_flag, {:#x})", flags & ~kAll, kAll));
    fa::WarmOptions w;
    w.block_mask = flags & FAJIT_WARM_BLOCK_MASK;
    w.backward = flags & FAJIT_WARM_BACKWARD;
    w.deterministic = flags & FAJIT_WARM_DETERMINISTIC;
    w.decode = flags & FAJIT_WARM_DECODE;
    w.ragged = flags & FAJIT_WARM_RAGGED;
    w.paged = flags & FAJIT_WARM_PAGED;
    w.row_max = flags & FAJIT_WARM_ROW_MAX;
    w.candidates = flags & FAJIT_WARM_CANDIDATES;
    const fa::WarmReport r = k->kernel.warm(w);
    if (kernels) *kernels = r.kernels;
  });
}

fajit_status fajit_kernel_block_mask(const fajit_kernel* k, int batch, int heads, int64_t len_q,
                                     int64_t len_kv, const fajit_captures* captures, void* cu_stream,
                                     fajit_block_mask** out) {
  return guarded([&] {
    require(k, "kernel");
    require(out, "out");
    fa::BlockMask m = k->kernel.block_mask(batch, heads, len_q, len_kv, to_captures(captures), {},
                                           static_cast<fa::Stream>(cu_stream));
    *out = new fajit_block_mask{std::move(m), {}};
  });
}

fajit_status fajit_kernel_block_mask_sized(const fajit_kernel* k, int batch, int heads, int64_t len_q,
                                           int64_t len_kv, int q_block, int kv_block,
                                           const fajit_captures* captures, void* cu_stream,
                                           fajit_block_mask** out) {
  return guarded([&] {
    require(k, "kernel");
    require(out, "out");
    fa::BlockMask m =
        k->kernel.block_mask(batch, heads, len_q, len_kv, to_captures(captures),
                             mask_options(q_block, kv_block), static_cast<fa::Stream>(cu_stream));
    *out = new fajit_block_mask{std::move(m), {}};
  });
}

fajit_status fajit_block_mask_from_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                                             int kv_block, const int32_t* kv_num_blocks,
                                             const int32_t* kv_indices, const int32_t* full_kv_num_blocks,
                                             const int32_t* full_kv_indices, fajit_block_mask** out) {
  return guarded([&] {
    const fa::BlockMaskOptions bo =
        kv_table_args(q_block, kv_block, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, out);
    if (batch < 1 || heads < 1 || len_q < 1 || len_kv < 1)
      throw fa::Error(fmt::format("block mask needs positive sizes, got B={} H={} Lq={} Lkv={}", batch, heads,
                                  len_q, len_kv));
    if (len_q > INT32_MAX || len_kv > INT32_MAX)  // before the tables are read (as BlockMask checks)
      throw fa::Error(
          fmt::format("block mask: lengths exceed the int32 range, got Lq={}, Lkv={}", len_q, len_kv));
    const size_t nq = static_cast<size_t>((len_q + bo.q_block - 1) / bo.q_block);
    const size_t nkv = static_cast<size_t>((len_kv + bo.kv_block - 1) / bo.kv_block);
    const size_t rows = static_cast<size_t>(batch) * heads * nq;
    if (rows * nkv > size_t(INT32_MAX))
      throw fa::Error(fmt::format("block mask: {} tiles exceed the int32 range", rows * nkv));
    std::vector<int32_t> num(kv_num_blocks, kv_num_blocks + rows), idx(kv_indices, kv_indices + rows * nkv);
    std::vector<int32_t> fnum, fidx;
    if (full_kv_num_blocks) {
      fnum.assign(full_kv_num_blocks, full_kv_num_blocks + rows);
      fidx.assign(full_kv_indices, full_kv_indices + rows * nkv);
    }
    fa::BlockMask m = fa::BlockMask::from_kv_blocks(batch, heads, len_q, len_kv, num, idx, fnum, fidx,
                                                    bo.q_block, bo.kv_block);
    *out = new fajit_block_mask{std::move(m), {}};
  });
}

fajit_status fajit_block_mask_from_device_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                                    int q_block, int kv_block, const int32_t* kv_num_blocks,
                                                    const int32_t* kv_indices,
                                                    const int32_t* full_kv_num_blocks,
                                                    const int32_t* full_kv_indices, fajit_block_mask** out) {
  return guarded([&] {
    const fa::BlockMaskOptions bo =
        kv_table_args(q_block, kv_block, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, out);
    fa::BlockMask m =
        fa::BlockMask::from_device_kv_blocks(batch, heads, len_q, len_kv, kv_num_blocks, kv_indices,
                                             full_kv_num_blocks, full_kv_indices, bo.q_block, bo.kv_block);
    *out = new fajit_block_mask{std::move(m), {}};
  });
}

fajit_status fajit_block_mask_all_full(int batch, int heads, int64_t len_q, int64_t len_kv, int q_block,
                                       int kv_block, fajit_block_mask** out) {
  return guarded([&] {
    require(out, "out");
    fa::BlockMaskOptions bo = mask_options(q_block, kv_block);
    if (batch < 1 || heads < 1 || len_q < 1 || len_kv < 1)
      throw fa::Error(fmt::format("block mask needs positive sizes, got B={} H={} Lq={} Lkv={}", batch, heads,
                                  len_q, len_kv));
    *out = new fajit_block_mask{fa::BlockMask::all_full(batch, heads, len_q, len_kv, bo.q_block, bo.kv_block),
                                {}};
  });
}

void fajit_block_mask_destroy(fajit_block_mask* mask) { delete mask; }

fajit_status fajit_block_mask_get_info(const fajit_block_mask* m, fajit_block_mask_info* out) {
  return guarded([&] {
    require(m, "mask");
    require(out, "out");
    const fa::BlockMask& b = m->mask;
    *out = fajit_block_mask_info{b.batch(),   b.heads(),    b.len_q(),        b.len_kv(),
                                 b.q_block(), b.kv_block(), b.num_q_blocks(), b.num_kv_blocks()};
  });
}

// The number of entries of table `which` (fajit_block_table's order), from the mask's sizes.
size_t table_entries(const fa::BlockMask& b, int which) {
  const size_t groups = size_t(b.batch()) * b.heads();
  const size_t rows = groups * size_t(which < FAJIT_Q_NUM_BLOCKS ? b.num_q_blocks() : b.num_kv_blocks());
  return which % 2 == 0 ? rows : groups * b.num_q_blocks() * b.num_kv_blocks();
}

fajit_status fajit_block_mask_table(const fajit_block_mask* m, fajit_block_table which, int32_t* out,
                                    size_t count, size_t* size) {
  return guarded([&] {
    require(m, "mask");
    const fa::BlockMask& b = m->mask;
    if (which >= FAJIT_KV_NUM_BLOCKS && which <= FAJIT_FULL_Q_INDICES && !out && count == 0) {
      if (size) *size = table_entries(b, which);  // a size alone: no table is built (or copied back)
      return;
    }
    const std::vector<int32_t>* t = nullptr;
    switch (which) {
      case FAJIT_KV_NUM_BLOCKS: t = &b.kv_num_blocks(); break;
      case FAJIT_KV_INDICES: t = &b.kv_indices(); break;
      case FAJIT_FULL_KV_NUM_BLOCKS: t = &b.full_kv_num_blocks(); break;
      case FAJIT_FULL_KV_INDICES: t = &b.full_kv_indices(); break;
      case FAJIT_Q_NUM_BLOCKS: t = &b.q_num_blocks(); break;
      case FAJIT_Q_INDICES: t = &b.q_indices(); break;
      case FAJIT_FULL_Q_NUM_BLOCKS: t = &b.full_q_num_blocks(); break;
      case FAJIT_FULL_Q_INDICES: t = &b.full_q_indices(); break;
      default: throw fa::Error(fmt::format("which: no block table {}", static_cast<int>(which)));
    }
    if (size) *size = t->size();
    if (!out && count == 0) return;
    require(out, "out");
    if (count != t->size())
      throw fa::Error(fmt::format("count: the table holds {} entries, got {}", t->size(), count));
    std::memcpy(out, t->data(), t->size() * sizeof(int32_t));
  });
}

fajit_status fajit_block_mask_copy_tables(const fajit_block_mask* m, int32_t* out, size_t count,
                                          void* cu_stream) {
  return guarded([&] {
    require(m, "mask");
    const fa::BlockMask& b = m->mask;
    size_t total = 0;
    for (int i = FAJIT_KV_NUM_BLOCKS; i <= FAJIT_FULL_Q_INDICES; ++i) total += table_entries(b, i);
    if (count != total)
      throw fa::Error(fmt::format("count: the eight tables hold {} entries, got {}", total, count));
    require(out, "out");
    auto stream = static_cast<CUstream>(cu_stream);
    fa::rt::ContextGuard guard;
    const auto dst = reinterpret_cast<CUdeviceptr>(out);
    if (b.built_on_device()) {
      const fa::BlockMaskDeviceTables d = b.device_tables();
      const int* src[] = {d.kv_num_blocks, d.kv_indices, d.full_kv_num_blocks, d.full_kv_indices,
                          d.q_num_blocks,  d.q_indices,  d.full_q_num_blocks,  d.full_q_indices};
      // One copy where the mask's tables lie back to back already (each table's size a multiple
      // of 4 entries, so no alignment padding between them: the usual case), else one a table.
      bool adjacent = true;
      for (int i = 1; i < 8; ++i) adjacent = adjacent && src[i] == src[i - 1] + table_entries(b, i - 1);
      if (adjacent) {
        FA_CU(cuMemcpyDtoDAsync, dst, reinterpret_cast<CUdeviceptr>(src[0]), total * sizeof(int32_t), stream);
        return;
      }
      size_t at = 0;
      for (int i = 0; i < 8; ++i) {
        const size_t bytes = table_entries(b, i) * sizeof(int32_t);
        if (bytes) FA_CU(cuMemcpyDtoDAsync, dst + at, reinterpret_cast<CUdeviceptr>(src[i]), bytes, stream);
        at += bytes;
      }
      return;
    }
    const std::vector<int32_t>* src[] = {&b.kv_num_blocks(),     &b.kv_indices(),    &b.full_kv_num_blocks(),
                                         &b.full_kv_indices(),   &b.q_num_blocks(),  &b.q_indices(),
                                         &b.full_q_num_blocks(), &b.full_q_indices()};
    std::vector<int32_t> all;
    all.reserve(total);
    for (const std::vector<int32_t>* t : src) all.insert(all.end(), t->begin(), t->end());
    fa::rt::upload_staged(dst, all.data(), all.size() * sizeof(int32_t), stream);
  });
}

fajit_status fajit_block_mask_built_on_device(const fajit_block_mask* m, int* out) {
  return guarded([&] {
    require(m, "mask");
    require(out, "out");
    *out = m->mask.built_on_device() ? 1 : 0;
  });
}

const char* fajit_block_mask_to_string(fajit_block_mask* m, int b, int h) {
  if (!m) return "";
  try {
    m->text = m->mask.to_string(b, h);
  } catch (const std::exception& e) {
    t_last_error = e.what();
    m->text.clear();
  }
  return m->text.c_str();
}

fajit_status fajit_block_mask_density(const fajit_block_mask* m, double* fraction, int64_t* full,
                                      int64_t* partial, int64_t* empty) {
  return guarded([&] {
    require(m, "mask");
    auto d = m->mask.density();
    if (fraction) *fraction = d.fraction;
    if (full) *full = d.full;
    if (partial) *partial = d.partial;
    if (empty) *empty = d.empty;
  });
}

fajit_status fajit_kernel_forward(const fajit_kernel* k, const fajit_tensor* q, const fajit_tensor* kk,
                                  const fajit_tensor* v, const fajit_tensor* o, const fajit_tensor* lse,
                                  float scale, const fajit_block_mask* mask, const fajit_captures* captures,
                                  void* cu_stream) {
  return guarded([&] {
    require(k, "kernel");
    require(mask, "mask");
    fa::TensorView lse_view;
    fa::ForwardOptions fo;
    fo.scale = scale;
    if (lse) {
      lse_view = to_view(lse, "lse");
      fo.lse = &lse_view;
    }
    k->kernel.forward(to_view(q, "q"), to_view(kk, "k"), to_view(v, "v"), to_view(o, "o"), mask->mask,
                      to_captures(captures), fo, static_cast<fa::Stream>(cu_stream));
  });
}

// The layouts of fajit_forward_options this library knows: the whole struct, and the one before
// max_scores was appended.
constexpr size_t kForwardOptionsV1 = offsetof(fajit_forward_options, max_scores);

void fajit_forward_options_init_sized(fajit_forward_options* o, size_t size) {
  if (o == nullptr || size < sizeof o->struct_size) return;
  if (size == sizeof *o || size == kForwardOptionsV1) std::memset(o, 0, size);
  o->struct_size = size;
}

// Parenthesized: the header's macro of the same name is not expanded here.
void(fajit_forward_options_init)(fajit_forward_options* o) {
  fajit_forward_options_init_sized(o, kForwardOptionsV1);
}

fajit_status fajit_kernel_forward_ex(const fajit_kernel* k, const fajit_tensor* q, const fajit_tensor* kk,
                                     const fajit_tensor* v, const fajit_tensor* o, const fajit_tensor* lse,
                                     const fajit_forward_options* options, const fajit_block_mask* mask,
                                     const fajit_captures* captures, void* cu_stream) {
  return guarded([&] {
    require(k, "kernel");
    require(mask, "mask");
    fajit_forward_options opt;
    fajit_forward_options_init(&opt);
    if (options) {
      // the layouts this library knows (a later, larger one will be accepted field by field,
      // never cut inside a field)
      if (options->struct_size != sizeof opt && options->struct_size != kForwardOptionsV1)
        throw fa::Error(
            fmt::format("options: struct_size {} is not a fajit_forward_options size (this library's "
                        "is {}, or {} without max_scores); call fajit_forward_options_init",
                        options->struct_size, sizeof opt, kForwardOptionsV1));
      std::memcpy(&opt, options, options->struct_size);
    }
    if (opt.path < FAJIT_PATH_AUTO || opt.path > FAJIT_PATH_DECODE)
      throw fa::Error(fmt::format("options: path must be FAJIT_PATH_AUTO, _PREFILL or _DECODE, got {}",
                                  static_cast<int>(opt.path)));
    fa::TensorView lse_view, max_view, cq, ck, nk, pt;
    fa::ForwardOptions fo;
    fo.scale = opt.scale;
    fo.path = static_cast<fa::ForwardPath>(opt.path);
    fo.decode_splits = opt.decode_splits;
    if (lse) {
      lse_view = to_view(lse, "lse");
      fo.lse = &lse_view;
    }
    if (opt.max_scores) max_view = to_view(opt.max_scores, "max_scores"), fo.max_scores = &max_view;
    fa::Sequences& s = fo.sequences;
    if (opt.cu_seqlens_q) cq = to_view(opt.cu_seqlens_q, "cu_seqlens_q"), s.cu_seqlens_q = &cq;
    if (opt.cu_seqlens_k) ck = to_view(opt.cu_seqlens_k, "cu_seqlens_k"), s.cu_seqlens_k = &ck;
    if (opt.seqlens_k) nk = to_view(opt.seqlens_k, "seqlens_k"), s.seqlens_k = &nk;
    if (opt.page_table) pt = to_view(opt.page_table, "page_table"), s.page_table = &pt;
    s.max_seqlen_q = opt.max_seqlen_q;
    s.max_seqlen_k = opt.max_seqlen_k;
    s.check_tables = opt.check_tables != 0;
    k->kernel.forward(to_view(q, "q"), to_view(kk, "k"), to_view(v, "v"), to_view(o, "o"), mask->mask,
                      to_captures(captures), fo, static_cast<fa::Stream>(cu_stream));
  });
}

fajit_status fajit_kernel_backward(const fajit_kernel* k, const fajit_tensor* q, const fajit_tensor* kk,
                                   const fajit_tensor* v, const fajit_tensor* o, const fajit_tensor* lse,
                                   const fajit_tensor* dout, const fajit_tensor* dq, const fajit_tensor* dk,
                                   const fajit_tensor* dv, const fajit_tensor* dlse, float scale,
                                   const fajit_block_mask* mask, const fajit_captures* captures,
                                   const fajit_captures* buffer_grads, int deterministic, void* cu_stream) {
  fajit_backward_options opt;
  fajit_backward_options_init(&opt);
  opt.scale = scale, opt.dlse = dlse, opt.deterministic = deterministic;
  return fajit_kernel_backward_ex(k, q, kk, v, o, lse, dout, dq, dk, dv, &opt, mask, captures, buffer_grads,
                                  cu_stream);
}

void fajit_backward_options_init(fajit_backward_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
}

fajit_status fajit_kernel_backward_ex(const fajit_kernel* k, const fajit_tensor* q, const fajit_tensor* kk,
                                      const fajit_tensor* v, const fajit_tensor* o, const fajit_tensor* lse,
                                      const fajit_tensor* dout, const fajit_tensor* dq,
                                      const fajit_tensor* dk, const fajit_tensor* dv,
                                      const fajit_backward_options* options, const fajit_block_mask* mask,
                                      const fajit_captures* captures, const fajit_captures* buffer_grads,
                                      void* cu_stream) {
  return guarded([&] {
    require(k, "kernel");
    require(mask, "mask");
    fajit_backward_options opt;
    fajit_backward_options_init(&opt);
    if (options) {
      if (options->struct_size != sizeof opt)
        throw fa::Error(
            fmt::format("options: struct_size {} is not a fajit_backward_options size (this library's "
                        "is {}); call fajit_backward_options_init",
                        options->struct_size, sizeof opt));
      std::memcpy(&opt, options, options->struct_size);
    }
    fa::TensorView dlse_view, cq, ck;
    fa::BackwardOptions bo;
    bo.scale = opt.scale;
    if (opt.dlse) {
      dlse_view = to_view(opt.dlse, "dlse");
      bo.dlse = &dlse_view;
    }
    if (buffer_grads) bo.buffer_grads = to_captures(buffer_grads).buffers();
    bo.deterministic = opt.deterministic != 0;
    fa::Sequences& s = bo.sequences;
    if (opt.cu_seqlens_q) cq = to_view(opt.cu_seqlens_q, "cu_seqlens_q"), s.cu_seqlens_q = &cq;
    if (opt.cu_seqlens_k) ck = to_view(opt.cu_seqlens_k, "cu_seqlens_k"), s.cu_seqlens_k = &ck;
    s.max_seqlen_q = opt.max_seqlen_q;
    s.max_seqlen_k = opt.max_seqlen_k;
    s.check_tables = opt.check_tables != 0;
    k->kernel.backward(to_view(q, "q"), to_view(kk, "k"), to_view(v, "v"), to_view(o, "o"),
                       to_view(lse, "lse"), to_view(dout, "dout"), to_view(dq, "dq"), to_view(dk, "dk"),
                       to_view(dv, "dv"), mask->mask, to_captures(captures), bo,
                       static_cast<fa::Stream>(cu_stream));
  });
}

}  // extern "C"
