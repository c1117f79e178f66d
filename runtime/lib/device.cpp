#include "fajit/runtime/device.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/runtime/driver.h"

namespace fa::rt {
namespace {

constexpr unsigned kDefaultSmemLimit = 48 * 1024;

std::mutex& primary_mutex() {
  static std::mutex m;
  return m;
}

CUcontext primary_context(CUdevice device) {
  static std::map<CUdevice, CUcontext>* retained = new std::map<CUdevice, CUcontext>();
  std::lock_guard<std::mutex> lock(primary_mutex());
  auto it = retained->find(device);
  if (it != retained->end()) return it->second;
  CUcontext ctx = nullptr;
  FA_CU(cuDevicePrimaryCtxRetain, &ctx, device);
  (*retained)[device] = ctx;
  return ctx;
}

struct ModuleCache {
  std::mutex mutex;
  std::map<std::pair<CUcontext, std::string>, CUmodule> modules;
  std::map<std::pair<CUmodule, std::string>, CUfunction> functions;
  std::map<CUfunction, unsigned> smem_limits;  // dynamic smem limit already set
};

ModuleCache& module_cache() {
  static ModuleCache* cache = new ModuleCache();  // outlives static destructors
  return *cache;
}

}  // namespace

ContextGuard::ContextGuard(int device) {
  const DriverApi& d = driver();
  FA_CU(cuCtxGetCurrent, &ctx_);
  if (ctx_) {
    FA_CU(cuCtxGetDevice, &device_);
    return;
  }
  FA_CU(cuDeviceGet, &device_, device);
  ctx_ = primary_context(device_);
  FA_CU(cuCtxPushCurrent, ctx_);
  pushed_ = true;
  (void)d;
}

ContextGuard::~ContextGuard() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  driver().cuCtxPopCurrent(&popped);
}

std::string DeviceInfo::arch() const { return fmt::format("sm_{}{}", cc_major, cc_minor); }

const DeviceInfo& device_info(int ordinal) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceInfo>>* infos = new std::map<int, std::unique_ptr<DeviceInfo>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = infos->find(ordinal);
  if (it != infos->end()) return *it->second;
  CUdevice dev = 0;
  FA_CU(cuDeviceGet, &dev, ordinal);
  auto info = std::make_unique<DeviceInfo>();
  info->ordinal = ordinal;
  char name[256] = {0};
  FA_CU(cuDeviceGetName, name, static_cast<int>(sizeof(name) - 1), dev);
  info->name = name;
  FA_CU(cuDeviceGetAttribute, &info->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  FA_CU(cuDeviceGetAttribute, &info->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  FA_CU(cuDeviceGetAttribute, &info->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  FA_CU(cuDeviceGetAttribute, &info->max_smem_per_block_optin,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  FA_CU(cuDeviceGetAttribute, &info->max_smem_per_sm,
        CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, dev);
  const DeviceInfo& ref = *info;
  (*infos)[ordinal] = std::move(info);
  return ref;
}

const DeviceInfo& current_device_info() {
  ContextGuard guard;
  return device_info(static_cast<int>(guard.device()));
}

CUfunction load_function(const std::string& key, std::string_view image, const std::string& kernel_name) {
  ContextGuard guard;
  ModuleCache& cache = module_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  CUmodule module = nullptr;
  auto mkey = std::make_pair(guard.context(), key);
  auto mit = cache.modules.find(mkey);
  if (mit != cache.modules.end()) {
    module = mit->second;
  } else {
    if (image.empty()) throw Error(fmt::format("kernel image for '{}' is empty", key));
    // cuModuleLoadData reads a cubin by its ELF header; copy to guarantee alignment.
    std::string copy(image);
    FA_CU(cuModuleLoadData, &module, copy.data());
    cache.modules.emplace(mkey, module);
  }
  auto fkey = std::make_pair(module, kernel_name);
  auto fit = cache.functions.find(fkey);
  if (fit != cache.functions.end()) return fit->second;
  CUfunction fn = nullptr;
  CUresult r = driver().cuModuleGetFunction(&fn, module, kernel_name.c_str());
  if (r == CUDA_ERROR_NOT_FOUND)
    throw Error(fmt::format("kernel '{}' not found in module '{}'", kernel_name, key), ErrorCode::kCuda);
  check(r, "cuModuleGetFunction");
  cache.functions.emplace(fkey, fn);
  return fn;
}

namespace {
// Raises fn's dynamic shared memory limit to smem_bytes once (per function), or throws when
// the device cannot give that much.
void allow_smem(CUfunction fn, unsigned smem_bytes, ContextGuard& guard) {
  if (smem_bytes <= kDefaultSmemLimit) return;
  ModuleCache& cache = module_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  unsigned& set = cache.smem_limits[fn];
  if (set < smem_bytes) {
    const DeviceInfo& info = device_info(static_cast<int>(guard.device()));
    if (static_cast<long long>(smem_bytes) > info.max_smem_per_block_optin)
      throw Error(fmt::format("launch: kernel needs {} bytes of shared memory; {} allows {}", smem_bytes,
                              info.name, info.max_smem_per_block_optin),
                  ErrorCode::kCuda);
    FA_CU(cuFuncSetAttribute, fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
          static_cast<int>(smem_bytes));
    set = smem_bytes;
  }
}
}  // namespace

namespace {
void launch_with(bool dependent, CUfunction fn, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
                 void** args) {
  if (!fn) throw Error("launch: null kernel function");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0)
    throw Error(fmt::format("launch: empty grid ({}, {}, {})", grid.x, grid.y, grid.z));
  ContextGuard guard;
  allow_smem(fn, smem_bytes, guard);
  if (!dependent || device_info(static_cast<int>(guard.device())).cc_major < 9) {
    FA_CU(cuLaunchKernel, fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem_bytes, stream, args,
          nullptr);
    return;
  }
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config{};
  config.gridDimX = grid.x, config.gridDimY = grid.y, config.gridDimZ = grid.z;
  config.blockDimX = block.x, config.blockDimY = block.y, config.blockDimZ = block.z;
  config.sharedMemBytes = smem_bytes;
  config.hStream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  FA_CU(cuLaunchKernelEx, &config, fn, args, nullptr);
}
}  // namespace

void launch(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream, void** args) {
  launch_with(false, fn, grid, block, smem_bytes, stream, args);
}

void launch_dependent(CUfunction fn, Dim3 grid, Dim3 block, unsigned smem_bytes, CUstream stream,
                      void** args) {
  launch_with(true, fn, grid, block, smem_bytes, stream, args);
}

void synchronize(CUstream stream) {
  ContextGuard guard;
  FA_CU(cuStreamSynchronize, stream);
}

}  // namespace fa::rt

namespace fa::rt {

bool stream_is_capturing(CUstream stream) {
  ContextGuard guard;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  FA_CU(cuStreamIsCapturing, stream, &status);
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace fa::rt
