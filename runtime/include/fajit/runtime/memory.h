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

// A move-only owner of stream_alloc'ed memory: allocated on `stream` in the current (or primary)
// context, freed on the same stream (after the work queued there) in that context. The stream
// must outlive the buffer.
class StreamBuffer {
 public:
  StreamBuffer() = default;
  StreamBuffer(size_t bytes, CUstream stream, std::string_view what);
  ~StreamBuffer();  // failures are not reported: the memory goes back to the pool or is lost
  StreamBuffer(StreamBuffer&& other) noexcept;
  StreamBuffer& operator=(StreamBuffer&& other) noexcept;
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;

  CUdeviceptr ptr() const { return ptr_; }
  template <typename T>
  T* as(size_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(ptr_ + offset));
  }
  size_t size() const { return size_; }
  CUstream stream() const { return stream_; }
  CUcontext context() const { return ctx_; }
  explicit operator bool() const { return ptr_ != 0; }

  void reset() noexcept;  // frees now (on its stream)

 private:
  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
  CUstream stream_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// Copies `bytes` of pageable host memory to device address `dst` on `stream` without waiting for
// the stream: through a page-locked staging buffer of the current context, reused once the copy
// from it is done (an event per buffer). An asynchronous copy straight from pageable memory may
// wait for the work queued on the stream first.
void upload_staged(CUdeviceptr dst, const void* host, size_t bytes, CUstream stream);

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
