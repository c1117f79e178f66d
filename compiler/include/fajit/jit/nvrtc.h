// NVRTC, loaded at run time with dlopen: libfajit neither links nor needs libnvrtc until the
// first compile, and then takes it from (in order)
//   1. $FAJIT_NVRTC_LIBRARY, if set (then it is the only place tried);
//   2. a libnvrtc already loaded in this process (e.g. PyTorch's copy);
//   3. libnvrtc.so.13, libnvrtc.so.12 by soname (the loader path);
//   4. /usr/local/cuda/lib64/ and /usr/local/cuda/targets/x86_64-linux/lib/.
//
//   fa::jit::CompileOptions opt;
//   opt.arch = fa::jit::arch_for_device(9, 0);                  // "sm_90a"
//   fa::jit::CompileResult r = fa::jit::Nvrtc::get().compile(src, "fa_fwd.cu", opt);
//   // r.cubin: the binary for cuModuleLoadData; r.log; r.wall_ms
//
// Every header of fa::detail::embedded_headers() is handed to NVRTC by name, so generated
// source can `#include "fajit/forward.cuh"` with no file on disk. Compiling is thread-safe:
// each call creates its own NVRTC program.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fa::jit {

struct CompileOptions {
  std::string arch = "sm_80";      // validated with validate_arch()
  bool want_ptx = false;           // also return PTX (a second compile for compute_XX
                                   // when NVRTC does not hand out PTX with the cubin)
  bool line_info = false;          // -lineinfo
  std::vector<std::string> extra;  // appended after the defaults
};

struct CompileResult {
  std::string cubin;                 // ELF bytes for cuModuleLoadData
  std::string ptx;                   // empty unless want_ptx
  std::string log;                   // NVRTC's log (warnings), may be empty
  std::vector<std::string> options;  // the options NVRTC was given for the cubin
  double wall_ms = 0;                // wall time of the whole call
};

// One place NVRTC may be loaded from: a path or soname and why it is on the list.
struct NvrtcPlace {
  std::string path;
  std::string why;  // "$FAJIT_NVRTC_LIBRARY", "loaded in this process", "soname", "toolkit"
};

class Nvrtc {
 public:
  // The process-wide instance, loaded from default_places() on first use. Throws fa::Error
  // (kCompile) listing every place tried when none works; a later call tries again.
  static const Nvrtc& get();

  // The oldest NVRTC major version the templates compile with (CUDA 12: wgmma, setmaxnreg).
  static constexpr int kMinMajor = 12;

  // Loads NVRTC from the first of `places` that dlopen accepts, that has every function fajit
  // uses and whose major version is at least kMinMajor. Throws fa::Error (kCompile) listing
  // each place and why it failed.
  static std::shared_ptr<const Nvrtc> load(const std::vector<NvrtcPlace>& places);

  // The search list described at the top of this file, for this process as it is now.
  static std::vector<NvrtcPlace> default_places();

  ~Nvrtc();
  Nvrtc(const Nvrtc&) = delete;
  Nvrtc& operator=(const Nvrtc&) = delete;

  // Compiles one translation unit to a cubin for opt.arch. `name` is the program name NVRTC
  // uses in its log ("fa_fwd.cu(12): error: ..."). A rejected program throws fa::Error
  // (kCompile) whose message holds the log and, for every error line of the log, the
  // offending source line quoted as "  12 | text" (codegen's "// fa: <op>" comments come
  // along with it).
  CompileResult compile(std::string_view source, std::string_view name, const CompileOptions& opt) const;

  int version_major() const { return major_; }
  int version_minor() const { return minor_; }
  std::string version() const;                             // "13.0"
  const std::string& library() const { return library_; }  // where it was loaded from

  struct Api;  // the resolved nvrtc* function table (internal)

 private:
  Nvrtc() = default;
  void* handle_ = nullptr;  // never dlclose'd: NVRTC may keep state past our use
  std::unique_ptr<Api> api_;
  std::string library_;
  int major_ = 0, minor_ = 0;
};

}  // namespace fa::jit
