#include "fajit/jit/compile.h"

#include "fajit/jit/arch.h"
#include "fajit/jit/key.h"

namespace fa::jit {

std::string request_key(const KernelRequest& req, const Nvrtc& nvrtc) {
  // Everything that changes the binary besides the source: the spec and the NVRTC flags.
  std::string spec = req.spec;
  spec += "\n--nvrtc-options:";
  if (req.options.line_info) spec += " -lineinfo";
  for (const std::string& o : req.options.extra) spec += " " + o;
  return kernel_key(req.source, templates_version(), spec, validate_arch(req.options.arch), nvrtc.version());
}

Lookup compile_cached(const KernelRequest& req, Cache& cache, const Nvrtc* nvrtc) {
  const Nvrtc& nv = nvrtc ? *nvrtc : Nvrtc::get();
  CompileOptions opt = req.options;
  opt.want_ptx = false;  // the cache holds cubins only
  return cache.get_or_compile(
      request_key(req, nv), [&] { return nv.compile(req.source, req.name, opt).cubin; }, req.meta);
}

std::function<void()> claim_compile(const KernelRequest& req, Cache& cache, const Nvrtc* nvrtc) {
  const Nvrtc* nv = nvrtc ? nvrtc : &Nvrtc::get();
  CompileOptions opt = req.options;
  opt.want_ptx = false;
  return cache.claim(
      request_key(req, *nv),
      [nv, source = req.source, name = req.name, opt] { return nv->compile(source, name, opt).cubin; },
      req.meta);
}

}  // namespace fa::jit
