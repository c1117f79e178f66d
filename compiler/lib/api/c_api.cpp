// The C API (fajit/fajit_c.h) over fa::compile / fa::Kernel: exceptions become status codes
// plus a thread-local message.
#include "fajit/fajit_c.h"

#include <memory>
#include <string>

#include "fajit/kernel.h"
#include "fajit/mods.h"

struct fajit_kernel {
  fa::Kernel kernel;
  std::string mlir;
  std::string ptx;
};

struct fajit_block_mask {
  fa::BlockMask mask;
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

}  // namespace

extern "C" {

const char* fajit_last_error(void) { return t_last_error.c_str(); }

fajit_options fajit_default_options(void) { return fajit_options{FAJIT_BF16, 128, 128, nullptr}; }

fajit_status fajit_compile_mlir(const char* mlir_text, const fajit_options* options, fajit_kernel** out) {
  return guarded([&] {
    require(mlir_text, "mlir_text");
    require(out, "out");
    fa::Program p = fa::Program::parse(mlir_text, "<fajit_compile_mlir>");
    *out = new fajit_kernel{fa::compile(p, to_options(options)), p.to_mlir(), {}};
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
    *out = new fajit_kernel{fa::compile(p, to_options(options)), p.to_mlir(), {}};
  });
}

void fajit_kernel_destroy(fajit_kernel* kernel) { delete kernel; }

const char* fajit_kernel_cuda_source(const fajit_kernel* k) {
  return k ? k->kernel.cuda_source().c_str() : "";
}
const char* fajit_kernel_mlir(const fajit_kernel* k) { return k ? k->mlir.c_str() : ""; }
const char* fajit_kernel_cache_key(const fajit_kernel* k) { return k ? k->kernel.cache_key().c_str() : ""; }
const char* fajit_kernel_origin(const fajit_kernel* k) { return k ? fa::to_string(k->kernel.origin()) : ""; }

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

fajit_status fajit_kernel_block_mask(const fajit_kernel* k, int batch, int heads, int64_t len_q,
                                     int64_t len_kv, const fajit_captures* captures, void* cu_stream,
                                     fajit_block_mask** out) {
  return guarded([&] {
    require(k, "kernel");
    require(out, "out");
    fa::BlockMask m = k->kernel.block_mask(batch, heads, len_q, len_kv, to_captures(captures), {},
                                           static_cast<fa::Stream>(cu_stream));
    *out = new fajit_block_mask{std::move(m)};
  });
}

void fajit_block_mask_destroy(fajit_block_mask* mask) { delete mask; }

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

fajit_status fajit_kernel_backward(const fajit_kernel* k, const fajit_tensor* q, const fajit_tensor* kk,
                                   const fajit_tensor* v, const fajit_tensor* o, const fajit_tensor* lse,
                                   const fajit_tensor* dout, const fajit_tensor* dq, const fajit_tensor* dk,
                                   const fajit_tensor* dv, const fajit_tensor* dlse, float scale,
                                   const fajit_block_mask* mask, const fajit_captures* captures,
                                   const fajit_captures* buffer_grads, int deterministic, void* cu_stream) {
  return guarded([&] {
    require(k, "kernel");
    require(mask, "mask");
    fa::TensorView dlse_view;
    fa::BackwardOptions bo;
    bo.scale = scale;
    if (dlse) {
      dlse_view = to_view(dlse, "dlse");
      bo.dlse = &dlse_view;
    }
    if (buffer_grads) bo.buffer_grads = to_captures(buffer_grads).buffers();
    bo.deterministic = deterministic != 0;
    k->kernel.backward(to_view(q, "q"), to_view(kk, "k"), to_view(v, "v"), to_view(o, "o"),
                       to_view(lse, "lse"), to_view(dout, "dout"), to_view(dq, "dq"), to_view(dk, "dk"),
                       to_view(dv, "dv"), mask->mask, to_captures(captures), bo,
                       static_cast<fa::Stream>(cu_stream));
  });
}

}  // extern "C"
