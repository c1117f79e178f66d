// Contexts, devices, modules and launches on top of the loaded driver (driver.h).
//
//   fa::rt::ContextGuard ctx;                          // caller's context, or device 0's primary
//   CUfunction fn = fa::rt::load_function(key, cubin, "fa_fwd");   // cached per context
//   void* args[] = {&params};
//   fa::rt::launch(fn, {grid_x, grid_y}, {128}, smem_bytes, stream, args);
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace fa::rt {

// Makes a usable context current for its scope: the calling thread's current context when
// one is set (nothing is pushed), else the primary context of `device` (retained once per
// process and never released), pushed here and popped by the destructor.
class ContextGuard {
 public:
  explicit ContextGuard(int device = 0);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

  CUcontext context() const { return ctx_; }
  CUdevice device() const { return device_; }

 private:
  CUcontext ctx_ = nullptr;
  CUdevice device_ = 0;
  bool pushed_ = false;
};

// What code generation and launch configuration need to know about a device.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;                // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sm_count = 0;
  int max_smem_per_block_optin = 0;  // bytes of dynamic shared memory a kernel may opt into
  int max_smem_per_sm = 0;

  // "sm_90" (no arch-specific suffix; the compiler appends "a" where it wants one).
  std::string arch() const;
};

// The device of the context ContextGuard selects (queried once per device, then cached).
const DeviceInfo& current_device_info();
const DeviceInfo& device_info(int ordinal);

// A kernel function from a cubin, loaded once per (current context, key): the first call
// in a context loads `image` with cuModuleLoadData, later calls with the same key return
// the cached module without reading `image`. Function lookups are cached too. Modules live
// until the process ends.
CUfunction load_function(const std::string& key, std::string_view image, const std::string& kernel_name);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  Dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// cuLaunchKernel in the current (or primary) context. Raises the function's dynamic shared
// memory limit first when smem_bytes exceeds the default 48 KB (once per function and
// size), with a clear error when the device cannot provide it.
void launch(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void** args);

// launch, for a kernel that consumes what the previous kernel on `stream` writes and calls
// wait_for_prior_grids() (templates/fajit/prelude.cuh) before it reads it: on sm_90+ it is
// launched with programmatic stream serialization, so its CTAs start (and their launch cost
// is paid) while the previous grid drains, once that grid's CTAs have all called
// allow_dependent_launch(); before sm_90 a plain launch.
void launch_dependent(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
                      void** args);

// Blocks until `stream` (nullptr: the legacy default stream) has finished its work.
void synchronize(CUstream stream);

// Whether work queued on `stream` is being captured into a CUDA graph (then nothing may
// synchronize it).
bool stream_is_capturing(CUstream stream);

}  // namespace fa::rt
