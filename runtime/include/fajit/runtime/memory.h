// DeviceBuffer: a move-only owner of cuMemAlloc'ed memory in one context.
//
//   fa::rt::DeviceBuffer buf(n * sizeof(int));        // in the current (or primary) context
//   buf.upload(host.data(), n * sizeof(int));
//   buf.download(host.data(), n * sizeof(int));
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fa::rt {

// Throws the out-of-memory error of DeviceBuffer and of stream-ordered allocations unless
// `result` (of the allocation of `bytes` for `what`) is CUDA_SUCCESS.
void check_allocation(CUresult result, size_t bytes, std::string_view what);

// Stream-ordered scratch (a call's work counter, the backward's fp32 dQ accumulator): `bytes`
// on `stream` from fajit's own memory pool of the current context's device, freed with
// cuMemFreeAsync on a stream once the work that uses it is queued. The driver's default pool
// returns freed memory to the system at every synchronization (release threshold 0), so a loop
// that synchronizes after each call mapped its scratch again each time: ~0.1 ms a call (H200,
// H100). fajit's pool keeps what it freed for the next call, up to FAJIT_SCRATCH_KEEP_MB
// megabytes (default: all of it, as a caching allocator does). Devices without memory pools use
// cuMemAllocAsync. Out of memory throws check_allocation's error.
CUdeviceptr stream_alloc(size_t bytes, CUstream stream, std::string_view what);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (0 allocates nothing) in the context ContextGuard selects. Out of
  // memory throws fa::Error (kCuda) "cannot allocate N bytes of device memory for <what>: ...".
  explicit DeviceBuffer(size_t bytes, std::string_view what = "a device buffer");
  ~DeviceBuffer();  // frees in its own context; failures are reported, never thrown
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(ptr_));
  }
  size_t size() const { return size_; }
  CUcontext context() const { return ctx_; }
  explicit operator bool() const { return ptr_ != 0; }

  // Copies; with a stream they are asynchronous (host memory must stay alive until the
  // stream reaches them), without one they are synchronous. Throw on out-of-range bytes.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void upload_async(const void* host, size_t bytes, CUstream stream, size_t offset = 0);
  void download_async(void* host, size_t bytes, CUstream stream, size_t offset = 0) const;
  void memset8(unsigned char value);
  void memset32(unsigned value);  // size() must be a multiple of 4

  void reset() noexcept;  // frees now

 private:
  void check_range(size_t bytes, size_t offset, const char* what) const;

  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
  CUcontext ctx_ = nullptr;
};

}  // namespace fa::rt
