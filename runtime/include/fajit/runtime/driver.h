// The CUDA driver, loaded at run time: libfajit never links libcuda, it dlopen()s
// "libcuda.so.1" on first use (or the file named by $FAJIT_CUDA_LIBRARY) and resolves the
// cu* entry points it needs into one table.
//
//   if (!fa::rt::cuda_available()) return;           // no driver or no GPU: no throw
//   CUdeviceptr p;
//   FA_CU(cuMemAlloc, &p, 256);                       // throws fa::Error on failure:
//   // "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
#pragma once

#include <cuda.h>  // types and enums only; the functions come from the table below

#include <string>

#include "fajit/error.h"

namespace fa::rt {

// Every driver function fajit calls. The names go through cuda.h's #defines, so
// `cuMemAlloc` means the `cuMemAlloc_v2` symbol exactly as a linked program would get.
#define FA_CUDA_DRIVER_FUNCTIONS(X) \
  X(cuInit)                         \
  X(cuDriverGetVersion)             \
  X(cuGetErrorName)                 \
  X(cuGetErrorString)               \
  X(cuDeviceGet)                    \
  X(cuDeviceGetCount)               \
  X(cuDeviceGetName)                \
  X(cuDeviceGetAttribute)           \
  X(cuDevicePrimaryCtxRetain)       \
  X(cuDevicePrimaryCtxRelease)      \
  X(cuCtxGetCurrent)                \
  X(cuCtxSetCurrent)                \
  X(cuCtxGetDevice)                 \
  X(cuCtxPushCurrent)               \
  X(cuCtxPopCurrent)                \
  X(cuCtxSynchronize)               \
  X(cuModuleLoadData)               \
  X(cuModuleUnload)                 \
  X(cuModuleGetFunction)            \
  X(cuFuncSetAttribute)             \
  X(cuFuncGetAttribute)             \
  X(cuLaunchKernel)                 \
  X(cuLaunchKernelEx)               \
  X(cuMemAlloc)                     \
  X(cuMemFree)                      \
  X(cuMemAllocAsync)                \
  X(cuMemFreeAsync)                 \
  X(cuMemPoolCreate)                \
  X(cuMemPoolSetAttribute)          \
  X(cuMemAllocFromPoolAsync)        \
  X(cuMemcpyHtoD)                   \
  X(cuMemcpyDtoH)                   \
  X(cuMemcpyHtoDAsync)              \
  X(cuMemcpyDtoHAsync)              \
  X(cuMemcpyDtoDAsync)              \
  X(cuMemHostAlloc)                 \
  X(cuMemFreeHost)                  \
  X(cuMemsetD8)                     \
  X(cuMemsetD32)                    \
  X(cuMemsetD8Async)                \
  X(cuMemsetD32Async)               \
  X(cuStreamCreate)                 \
  X(cuStreamDestroy)                \
  X(cuStreamSynchronize)            \
  X(cuStreamIsCapturing)            \
  X(cuStreamBeginCapture)           \
  X(cuStreamEndCapture)             \
  X(cuGraphDestroy)                 \
  X(cuGraphInstantiateWithFlags)    \
  X(cuGraphLaunch)                  \
  X(cuGraphExecDestroy)             \
  X(cuEventCreate)                  \
  X(cuEventDestroy)                 \
  X(cuEventRecord)                  \
  X(cuEventSynchronize)             \
  X(cuEventQuery)                   \
  X(cuEventElapsedTime)             \
  X(cuTensorMapEncodeTiled)

// Resolved entry points. Member names expand through cuda.h's macros too, so
// `driver().cuMemAlloc(...)` calls cuMemAlloc_v2.
struct DriverApi {
#define FA_CUDA_DECLARE_MEMBER(fn) decltype(&::fn) fn = nullptr;
  FA_CUDA_DRIVER_FUNCTIONS(FA_CUDA_DECLARE_MEMBER)
#undef FA_CUDA_DECLARE_MEMBER
  int version = 0;      // cuDriverGetVersion, e.g. 13000
  std::string library;  // the file that was dlopen()ed
};

// The driver table, loaded and initialised (cuInit) once per process, thread-safe.
// Throws fa::Error (kCuda) when the library is missing ("no CUDA driver: cannot load
// libcuda.so.1 (...)"), a symbol is missing, or there is no device ("no CUDA device
// found"); the same error is thrown again on every later call.
const DriverApi& driver();

// True when driver() succeeds. Never throws.
bool cuda_available() noexcept;

// The reason cuda_available() is false ("" when it is true). Never throws.
std::string cuda_unavailable_reason() noexcept;

// Throws fa::Error(kCuda) "<call> failed: <CUDA_ERROR_NAME> (<description>)" unless
// result is CUDA_SUCCESS. `call` is the API name as written in source ("cuMemAlloc").
void check(CUresult result, const char* call);

// "<CUDA_ERROR_NAME> (<description>)" for a result, without throwing.
std::string describe(CUresult result) noexcept;

namespace detail {

// Loads and initialises a driver table from `library` without caching (driver() caches
// the result for "$FAJIT_CUDA_LIBRARY" or "libcuda.so.1"). Tests use it to pin the
// messages of the failure paths. Throws fa::Error(kCuda).
DriverApi load_driver(const std::string& library);

// The library driver() loads: $FAJIT_CUDA_LIBRARY if set and non-empty, else libcuda.so.1.
std::string driver_library_name();

}  // namespace detail
}  // namespace fa::rt

// Calls a driver function through the table and checks its result:
//   FA_CU(cuModuleGetFunction, &fn, module, "name");
#define FA_CU(fn, ...) ::fa::rt::check(::fa::rt::driver().fn(__VA_ARGS__), #fn)
