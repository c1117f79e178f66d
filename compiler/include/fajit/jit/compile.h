// The JIT path in one call: key the generated source, look it up in the cache, compile with
// NVRTC on a miss.
//
//   fa::jit::KernelRequest req;
//   req.source = generated_cuda;          // from codegen
//   req.name = "fa_fwd.cu";
//   req.spec = spec.to_string();          // KernelSpec text: variant, analyses, options
//   req.meta = "fajit_fwd bf16 hd128 causal";
//   req.options.arch = fa::jit::arch_for_device(9, 0);
//   fa::jit::Lookup l = fa::jit::compile_cached(req);   // l.entry->cubin, l.origin
#pragma once

#include <functional>
#include <string>

#include "fajit/jit/cache.h"
#include "fajit/jit/nvrtc.h"

namespace fa::jit {

struct KernelRequest {
  std::string source;                 // the generated translation unit
  std::string name = "fa_kernel.cu";  // NVRTC program name (appears in error messages)
  std::string spec;                   // KernelSpec text; part of the key
  std::string meta;                   // stored beside the cubin, shown by `fajit cache ls`
  CompileOptions options;             // arch, -lineinfo, extra flags; all part of the key
};

// The cache key of `req` when compiled by `nvrtc`: kernel_key() over the source, the
// embedded templates' version, the spec plus the NVRTC options, the arch and NVRTC's
// version.
std::string request_key(const KernelRequest& req, const Nvrtc& nvrtc);

// Looks `req` up in `cache` (memory, then disk) and compiles it on a miss. `nvrtc` null
// means Nvrtc::get(). Compile errors throw fa::Error (kCompile) and cache nothing.
Lookup compile_cached(const KernelRequest& req, Cache& cache = Cache::global(), const Nvrtc* nvrtc = nullptr);

// compile_cached for another thread: the key is computed and the cache's flight claimed here,
// on the calling thread (Cache::claim), and the returned job (empty: in memory or in flight
// already) does the lookup and the compile wherever it runs, so a compile_cached of the same
// request meanwhile waits for it. The job never throws; `nvrtc` must outlive it.
std::function<void()> claim_compile(const KernelRequest& req, Cache& cache = Cache::global(),
                                    const Nvrtc* nvrtc = nullptr);

}  // namespace fa::jit
