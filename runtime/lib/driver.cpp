#include "fajit/runtime/driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace fa::rt {
namespace {

#define FA_STRINGIZE_EXPANDED(x) FA_STRINGIZE(x)
#define FA_STRINGIZE(x) #x

struct LoadedDriver {
  DriverApi api;
  std::string error;  // non-empty: loading failed with this message
};

const LoadedDriver& loaded_driver() {
  static const LoadedDriver* loaded = [] {
    auto* d = new LoadedDriver();  // never freed: the table outlives static destructors
    try {
      d->api = detail::load_driver(detail::driver_library_name());
    } catch (const Error& e) {
      d->error = e.what();
    }
    return d;
  }();
  return *loaded;
}

}  // namespace

namespace detail {

std::string driver_library_name() {
  const char* env = std::getenv("FAJIT_CUDA_LIBRARY");
  return env && *env ? std::string(env) : std::string("libcuda.so.1");
}

DriverApi load_driver(const std::string& library) {
  DriverApi api;
  api.library = library;
  // RTLD_LOCAL: our symbols never leak into the process; the handle is kept forever, as a
  // process may call into the driver until exit.
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    throw Error(fmt::format("no CUDA driver: cannot load {} ({})", library, why ? why : "unknown error"),
                ErrorCode::kCuda);
  }
#define FA_CUDA_RESOLVE(fn)                                                                             \
  api.fn = reinterpret_cast<decltype(api.fn)>(::dlsym(handle, FA_STRINGIZE_EXPANDED(fn)));              \
  if (!api.fn) {                                                                                        \
    ::dlclose(handle);                                                                                  \
    throw Error(fmt::format("no CUDA driver: {} has no symbol {}", library, FA_STRINGIZE_EXPANDED(fn)), \
                ErrorCode::kCuda);                                                                      \
  }
  FA_CUDA_DRIVER_FUNCTIONS(FA_CUDA_RESOLVE)
#undef FA_CUDA_RESOLVE

  auto describe_with = [&api](CUresult r) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (api.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "CUDA_ERROR_UNKNOWN";
    if (api.cuGetErrorString(r, &text) != CUDA_SUCCESS || !text) text = "unknown error";
    return fmt::format("{} ({})", name, text);
  };
  CUresult r = api.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE) throw Error("no CUDA device found", ErrorCode::kCuda);
  if (r != CUDA_SUCCESS) throw Error(fmt::format("cuInit failed: {}", describe_with(r)), ErrorCode::kCuda);
  int count = 0;
  r = api.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS)
    throw Error(fmt::format("cuDeviceGetCount failed: {}", describe_with(r)), ErrorCode::kCuda);
  if (count == 0) throw Error("no CUDA device found", ErrorCode::kCuda);
  r = api.cuDriverGetVersion(&api.version);
  if (r != CUDA_SUCCESS)
    throw Error(fmt::format("cuDriverGetVersion failed: {}", describe_with(r)), ErrorCode::kCuda);
  return api;
}

}  // namespace detail

const DriverApi& driver() {
  const LoadedDriver& d = loaded_driver();
  if (!d.error.empty()) throw Error(d.error, ErrorCode::kCuda);
  return d.api;
}

bool cuda_available() noexcept {
  try {
    return loaded_driver().error.empty();
  } catch (...) {
    return false;
  }
}

std::string cuda_unavailable_reason() noexcept {
  try {
    return loaded_driver().error;
  } catch (...) {
    return "unknown error";
  }
}

std::string describe(CUresult result) noexcept {
  try {
    const LoadedDriver& d = loaded_driver();
    const char* name = nullptr;
    const char* text = nullptr;
    if (d.error.empty()) {
      if (d.api.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
      if (d.api.cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
    }
    std::string n = name ? name : fmt::format("CUDA error {}", static_cast<int>(result));
    return fmt::format("{} ({})", n, text ? text : "unknown error");
  } catch (...) {
    return "unknown CUDA error";
  }
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  throw Error(fmt::format("{} failed: {}", call, describe(result)), ErrorCode::kCuda);
}

}  // namespace fa::rt
