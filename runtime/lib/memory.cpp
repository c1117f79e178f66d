#include "fajit/runtime/memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"

namespace fa::rt {
namespace {

// Makes `ctx` current for a scope when it is not already.
class ScopedCurrent {
 public:
  explicit ScopedCurrent(CUcontext ctx) {
    CUcontext cur = nullptr;
    FA_CU(cuCtxGetCurrent, &cur);
    if (cur != ctx) {
      FA_CU(cuCtxPushCurrent, ctx);
      pushed_ = true;
    }
  }
  ~ScopedCurrent() {
    CUcontext popped = nullptr;
    if (pushed_) driver().cuCtxPopCurrent(&popped);
  }

 private:
  bool pushed_ = false;
};

// Runs `free` (a driver call) with `ctx` current, pushed when another one is: for destructors,
// so nothing throws (a missing driver gives CUDA_ERROR_DEINITIALIZED).
template <typename F>
CUresult free_in_context(CUcontext ctx, F&& free) noexcept {
  try {
    const DriverApi& d = driver();
    CUcontext cur = nullptr;
    bool pushed = false;
    if (d.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != ctx)
      pushed = d.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
    const CUresult r = free(d);
    if (pushed) d.cuCtxPopCurrent(&cur);
    return r;
  } catch (...) {
    return CUDA_ERROR_DEINITIALIZED;
  }
}

// fajit's scratch pool of `dev` (nullptr where the device has no memory pools), created once.
CUmemoryPool scratch_pool(CUdevice dev) {
  static std::mutex mu;
  static std::map<CUdevice, CUmemoryPool> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools.find(dev);
  if (it != pools.end()) return it->second;
  CUmemoryPool pool = nullptr;
  int supported = 0;
  if (driver().cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev) ==
          CUDA_SUCCESS &&
      supported) {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    if (driver().cuMemPoolCreate(&pool, &props) != CUDA_SUCCESS) pool = nullptr;
  }
  if (pool) {
    cuuint64_t keep = ~cuuint64_t(0);
    if (const char* e = std::getenv("FAJIT_SCRATCH_KEEP_MB"); e && *e)
      keep = cuuint64_t(std::strtoull(e, nullptr, 10)) << 20;
    driver().cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  }
  pools.emplace(dev, pool);  // never destroyed: scratch freed at exit may still be queued
  return pool;
}

}  // namespace

CUdeviceptr stream_alloc(size_t bytes, CUstream stream, std::string_view what) {
  CUdevice dev = 0;
  FA_CU(cuCtxGetDevice, &dev);
  CUdeviceptr ptr = 0;
  if (CUmemoryPool pool = scratch_pool(dev))
    check_allocation(driver().cuMemAllocFromPoolAsync(&ptr, bytes, pool, stream), bytes, what);
  else
    check_allocation(driver().cuMemAllocAsync(&ptr, bytes, stream), bytes, what);
  return ptr;
}

StreamBuffer::StreamBuffer(size_t bytes, CUstream stream, std::string_view what) : stream_(stream) {
  if (bytes == 0) return;
  ContextGuard guard;
  ptr_ = stream_alloc(bytes, stream, what);
  size_ = bytes;
  ctx_ = guard.context();
}

StreamBuffer::~StreamBuffer() { reset(); }

StreamBuffer::StreamBuffer(StreamBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)),
      size_(std::exchange(other.size_, 0)),
      stream_(std::exchange(other.stream_, nullptr)),
      ctx_(std::exchange(other.ctx_, nullptr)) {}

StreamBuffer& StreamBuffer::operator=(StreamBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, 0);
    size_ = std::exchange(other.size_, 0);
    stream_ = std::exchange(other.stream_, nullptr);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void StreamBuffer::reset() noexcept {
  if (!ptr_) return;
  free_in_context(ctx_, [&](const DriverApi& d) { return d.cuMemFreeAsync(ptr_, stream_); });
  ptr_ = 0;
  size_ = 0;
  ctx_ = nullptr;
}

namespace {

// Page-locked staging buffers of one context, each with the event of its last copy.
struct Staging {
  void* host = nullptr;
  size_t size = 0;
  CUevent done = nullptr;
};

}  // namespace

void upload_staged(CUdeviceptr dst, const void* host, size_t bytes, CUstream stream) {
  if (bytes == 0) return;
  static std::mutex mu;
  static std::map<CUcontext, std::vector<Staging>> staging;  // never freed: copies may be queued at exit
  ContextGuard guard;
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Staging>& list = staging[guard.context()];
  Staging* use = nullptr;  // the smallest free one that holds the copy
  for (Staging& s : list)
    if (s.size >= bytes && (!use || s.size < use->size) && driver().cuEventQuery(s.done) == CUDA_SUCCESS)
      use = &s;
  if (!use) {
    Staging s;
    s.size = std::max<size_t>(bytes, size_t(64) << 10);
    FA_CU(cuMemHostAlloc, &s.host, s.size, 0);
    if (CUresult r = driver().cuEventCreate(&s.done, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS) {
      driver().cuMemFreeHost(s.host);
      check(r, "cuEventCreate");
    }
    list.push_back(s);
    use = &list.back();
  }
  std::memcpy(use->host, host, bytes);
  FA_CU(cuMemcpyHtoDAsync, dst, use->host, bytes, stream);
  if (const CUresult r = driver().cuEventRecord(use->done, stream); r != CUDA_SUCCESS) {
    use->size = 0;  // the copy may still be queued: the buffer is never handed out again
    check(r, "cuEventRecord");
  }
}

void check_allocation(CUresult result, size_t bytes, std::string_view what) {
  if (result != CUDA_SUCCESS)
    throw Error(
        fmt::format("cannot allocate {} bytes of device memory for {}: {}", bytes, what, describe(result)),
        ErrorCode::kCuda);
}

DeviceBuffer::DeviceBuffer(size_t bytes, std::string_view what) {
  if (bytes == 0) return;
  ContextGuard guard;
  check_allocation(driver().cuMemAlloc(&ptr_, bytes), bytes, what);
  size_ = bytes;
  ctx_ = guard.context();
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)),
      size_(std::exchange(other.size_, 0)),
      ctx_(std::exchange(other.ctx_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, 0);
    size_ = std::exchange(other.size_, 0);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (!ptr_) return;
  const CUresult r = free_in_context(ctx_, [&](const DriverApi& d) { return d.cuMemFree(ptr_); });
  // At process exit the driver may already be torn down; that is not worth a message.
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED && r != CUDA_ERROR_CONTEXT_IS_DESTROYED)
    std::fprintf(stderr, "fajit: cuMemFree failed: %s\n", describe(r).c_str());
  ptr_ = 0;
  size_ = 0;
  ctx_ = nullptr;
}

void DeviceBuffer::check_range(size_t bytes, size_t offset, const char* what) const {
  if (offset > size_ || bytes > size_ - offset)
    throw Error(fmt::format("device buffer {}: {} bytes at offset {} exceed its {} bytes", what, bytes,
                            offset, size_));
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  check_range(bytes, offset, "upload");
  if (bytes == 0) return;
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemcpyHtoD, ptr_ + offset, host, bytes);
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  check_range(bytes, offset, "download");
  if (bytes == 0) return;
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemcpyDtoH, host, ptr_ + offset, bytes);
}

void DeviceBuffer::upload_async(const void* host, size_t bytes, CUstream stream, size_t offset) {
  check_range(bytes, offset, "upload");
  if (bytes == 0) return;
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemcpyHtoDAsync, ptr_ + offset, host, bytes, stream);
}

void DeviceBuffer::download_async(void* host, size_t bytes, CUstream stream, size_t offset) const {
  check_range(bytes, offset, "download");
  if (bytes == 0) return;
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemcpyDtoHAsync, host, ptr_ + offset, bytes, stream);
}

void DeviceBuffer::memset8(unsigned char value) {
  if (!ptr_) return;
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemsetD8, ptr_, value, size_);
}

void DeviceBuffer::memset32(unsigned value) {
  if (!ptr_) return;
  if (size_ % 4 != 0)
    throw Error(fmt::format("device buffer memset32: size {} is not a multiple of 4", size_));
  ScopedCurrent scope(ctx_);
  FA_CU(cuMemsetD32, ptr_, value, size_ / 4);
}

}  // namespace fa::rt
