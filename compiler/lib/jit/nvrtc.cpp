#include "fajit/jit/nvrtc.h"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "fajit/detail/embedded_templates.h"
#include "fajit/error.h"
#include "fajit/jit/arch.h"

namespace fa::jit {

// The few NVRTC entry points fajit uses, declared here so no toolkit header is needed.
// nvrtcResult is an enum (int-sized); NVRTC_SUCCESS is 0.
using NvrtcResult = int;
using NvrtcProgram = struct NvrtcProgramOpaque*;

struct Nvrtc::Api {
  const char* (*GetErrorString)(NvrtcResult);
  NvrtcResult (*Version)(int*, int*);
  NvrtcResult (*CreateProgram)(NvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*);
  NvrtcResult (*DestroyProgram)(NvrtcProgram*);
  NvrtcResult (*CompileProgram)(NvrtcProgram, int, const char* const*);
  NvrtcResult (*GetPTXSize)(NvrtcProgram, size_t*);
  NvrtcResult (*GetPTX)(NvrtcProgram, char*);
  NvrtcResult (*GetCUBINSize)(NvrtcProgram, size_t*);
  NvrtcResult (*GetCUBIN)(NvrtcProgram, char*);
  NvrtcResult (*GetProgramLogSize)(NvrtcProgram, size_t*);
  NvrtcResult (*GetProgramLog)(NvrtcProgram, char*);
};

namespace {

constexpr NvrtcResult kSuccess = 0;

// dlerror() says "<path>: <reason>"; the path is already on our line.
std::string dl_reason(const std::string& path) {
  const char* e = dlerror();
  std::string s = e ? e : "unknown error";
  if (s.compare(0, path.size() + 2, path + ": ") == 0) s.erase(0, path.size() + 2);
  return s;
}

bool is_nvrtc_basename(std::string_view base) {
  return base.compare(0, 8, "libnvrtc") == 0 && base.find("builtins") == std::string_view::npos &&
         base.find(".so") != std::string_view::npos;
}

// The first libnvrtc already mapped into this process, or "".
std::string loaded_nvrtc() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (!info->dlpi_name || !*info->dlpi_name) return 0;
        std::string_view path = info->dlpi_name;
        size_t slash = path.rfind('/');
        std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
        if (!is_nvrtc_basename(base)) return 0;
        *static_cast<std::string*>(data) = std::string(path);
        return 1;
      },
      &found);
  return found;
}

template <class F>
bool resolve(void* handle, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn) {
    if (!missing.empty()) missing += ", ";
    missing += name;
  }
  return fn != nullptr;
}

std::string result_name(const Nvrtc::Api& api, NvrtcResult r) {
  const char* s = api.GetErrorString ? api.GetErrorString(r) : nullptr;
  return s ? s : "NVRTC error " + std::to_string(r);
}

// RAII for one NVRTC program.
struct Program {
  const Nvrtc::Api& api;
  NvrtcProgram prog = nullptr;
  ~Program() {
    if (prog) api.DestroyProgram(&prog);
  }
  std::string log() const {
    size_t n = 0;
    if (api.GetProgramLogSize(prog, &n) != kSuccess || n <= 1) return {};
    std::string s(n, '\0');
    if (api.GetProgramLog(prog, s.data()) != kSuccess) return {};
    s.resize(std::strlen(s.c_str()));
    return s;
  }
};

std::string_view line_of(std::string_view text, long lineno) {
  if (lineno < 1) return {};
  size_t pos = 0;
  for (long i = 1; i < lineno; ++i) {
    pos = text.find('\n', pos);
    if (pos == std::string_view::npos) return {};
    ++pos;
  }
  size_t end = text.find('\n', pos);
  std::string_view line = text.substr(pos, end == std::string_view::npos ? text.npos : end - pos);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// For each "file(LINE): error" (or "catastrophic error") in the log, the line quoted from
// the generated source or from an embedded header, once each, in log order.
std::string quote_error_lines(std::string_view log, std::string_view name, std::string_view source) {
  int n_headers = 0;
  const detail::EmbeddedHeader* headers = detail::embedded_headers(&n_headers);
  std::set<std::pair<std::string, long>> seen;
  std::string out;
  size_t pos = 0;
  while (pos < log.size()) {
    size_t end = log.find('\n', pos);
    if (end == std::string_view::npos) end = log.size();
    std::string_view line = log.substr(pos, end - pos);
    pos = end + 1;
    size_t close = line.find("): error");
    if (close == std::string_view::npos) close = line.find("): catastrophic error");
    if (close == std::string_view::npos) continue;
    size_t open = line.rfind('(', close);
    if (open == std::string_view::npos || open + 1 >= close) continue;
    std::string_view digits = line.substr(open + 1, close - open - 1);
    if (digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    long lineno = std::strtol(std::string(digits).c_str(), nullptr, 10);
    std::string file(line.substr(0, open));
    while (!file.empty() && file.front() == ' ') file.erase(0, 1);
    if (!seen.insert({file, lineno}).second) continue;
    std::string_view text;
    bool found = false;
    if (file == name) {
      text = source;
      found = true;
    } else {
      for (int i = 0; i < n_headers && !found; ++i)
        if (file == headers[i].name) {
          text = headers[i].text;
          found = true;
        }
    }
    if (!found) continue;
    std::string_view quoted = line_of(text, lineno);
    out += "  ";
    if (file != name) out += file + ":";
    out += std::to_string(lineno) + " | " + std::string(quoted) + "\n";
  }
  return out;
}

}  // namespace

Nvrtc::~Nvrtc() = default;

std::string Nvrtc::version() const { return std::to_string(major_) + "." + std::to_string(minor_); }

std::vector<NvrtcPlace> Nvrtc::default_places() {
  const char* env = std::getenv("FAJIT_NVRTC_LIBRARY");
  if (env && *env) return {{env, "$FAJIT_NVRTC_LIBRARY"}};
  std::vector<NvrtcPlace> places;
  places.push_back({loaded_nvrtc(), "loaded in this process"});
  places.push_back({"libnvrtc.so.13", "soname"});
  places.push_back({"libnvrtc.so.12", "soname"});
  for (const char* dir : {"/usr/local/cuda/lib64/", "/usr/local/cuda/targets/x86_64-linux/lib/"})
    for (const char* so : {"libnvrtc.so.13", "libnvrtc.so.12"})
      places.push_back({std::string(dir) + so, "toolkit"});
  return places;
}

std::shared_ptr<const Nvrtc> Nvrtc::load(const std::vector<NvrtcPlace>& places) {
  std::string tried;
  for (const NvrtcPlace& place : places) {
    if (place.path.empty()) {
      tried += "  a libnvrtc " + place.why + ": none\n";
      continue;
    }
    int flags = RTLD_NOW | RTLD_LOCAL;
    if (place.why == "loaded in this process") flags |= RTLD_NOLOAD;
    void* handle = dlopen(place.path.c_str(), flags);
    if (!handle) {
      tried += "  " + place.path + " (" + place.why + "): " + dl_reason(place.path) + "\n";
      continue;
    }
    auto api = std::make_unique<Api>();
    std::string missing;
    resolve(handle, "nvrtcGetErrorString", api->GetErrorString, missing);
    resolve(handle, "nvrtcVersion", api->Version, missing);
    resolve(handle, "nvrtcCreateProgram", api->CreateProgram, missing);
    resolve(handle, "nvrtcDestroyProgram", api->DestroyProgram, missing);
    resolve(handle, "nvrtcCompileProgram", api->CompileProgram, missing);
    resolve(handle, "nvrtcGetPTXSize", api->GetPTXSize, missing);
    resolve(handle, "nvrtcGetPTX", api->GetPTX, missing);
    resolve(handle, "nvrtcGetCUBINSize", api->GetCUBINSize, missing);
    resolve(handle, "nvrtcGetCUBIN", api->GetCUBIN, missing);
    resolve(handle, "nvrtcGetProgramLogSize", api->GetProgramLogSize, missing);
    resolve(handle, "nvrtcGetProgramLog", api->GetProgramLog, missing);
    int major = 0, minor = 0;
    if (missing.empty() && api->Version(&major, &minor) != kSuccess) missing = "nvrtcVersion failed";
    if (!missing.empty()) {
      tried += "  " + place.path + " (" + place.why + "): missing " + missing + "\n";
      continue;  // left open: closing a half-used library buys nothing
    }
    if (major < kMinMajor) {  // the templates need CUDA 12's PTX (wgmma, setmaxnreg) and C++17
      tried += "  " + place.path + " (" + place.why + "): NVRTC " + std::to_string(major) + "." +
               std::to_string(minor) + ", fajit needs " + std::to_string(kMinMajor) + ".0 or newer\n";
      continue;
    }
    std::shared_ptr<Nvrtc> nv(new Nvrtc());
    nv->handle_ = handle;
    nv->api_ = std::move(api);
    nv->major_ = major;
    nv->minor_ = minor;
    char origin[4096] = {};
    nv->library_ = dlinfo(handle, RTLD_DI_ORIGIN, origin) == 0 && place.path.find('/') == std::string::npos
                       ? std::string(origin) + "/" + place.path
                       : place.path;
    return nv;
  }
  throw Error("cannot load NVRTC; tried:\n" + tried + "set FAJIT_NVRTC_LIBRARY to the path of libnvrtc.so",
              ErrorCode::kCompile);
}

const Nvrtc& Nvrtc::get() {
  static std::mutex mu;
  static std::shared_ptr<const Nvrtc> instance;
  std::lock_guard<std::mutex> lock(mu);
  if (!instance) instance = load(default_places());
  return *instance;
}

CompileResult Nvrtc::compile(std::string_view source, std::string_view name,
                             const CompileOptions& opt) const {
  auto t0 = std::chrono::steady_clock::now();
  const std::string arch = validate_arch(opt.arch);
  const std::string prog_name(name);
  const std::string src(source);

  int n_headers = 0;
  const detail::EmbeddedHeader* headers = detail::embedded_headers(&n_headers);
  std::vector<const char*> header_texts, header_names;
  for (int i = 0; i < n_headers; ++i) {
    header_texts.push_back(headers[i].text);
    header_names.push_back(headers[i].name);
  }

  CompileResult result;
  result.options = {"-default-device", "-std=c++17", "-DNDEBUG", "-arch=" + arch};
  if (opt.line_info) result.options.push_back("-lineinfo");
  for (const std::string& o : opt.extra) result.options.push_back(o);

  // Runs one NVRTC program with `options`; returns it compiled, or throws with the log.
  auto run = [&](Program& p, const std::vector<std::string>& options) {
    NvrtcResult r = api_->CreateProgram(&p.prog, src.c_str(), prog_name.c_str(), n_headers,
                                        header_texts.data(), header_names.data());
    if (r != kSuccess)
      throw Error("cannot create NVRTC program '" + prog_name + "': " + result_name(*api_, r),
                  ErrorCode::kCompile);
    std::vector<const char*> argv;
    for (const std::string& o : options) argv.push_back(o.c_str());
    r = api_->CompileProgram(p.prog, static_cast<int>(argv.size()), argv.data());
    std::string log = p.log();
    if (r != kSuccess) {
      std::string msg =
          "cannot compile '" + prog_name + "' for " + arch + " (" + result_name(*api_, r) + "):\n" + log;
      if (!msg.empty() && msg.back() != '\n') msg += '\n';
      std::string quoted = quote_error_lines(log, prog_name, source);
      if (!quoted.empty()) msg += "offending lines:\n" + quoted;
      while (!msg.empty() && msg.back() == '\n') msg.pop_back();
      throw Error(msg, ErrorCode::kCompile);
    }
    return log;
  };
  auto fetch = [&](Program& p, auto size_fn, auto get_fn, std::string& out) {
    size_t n = 0;
    if (size_fn(p.prog, &n) != kSuccess || n == 0) return false;
    out.assign(n, '\0');
    return get_fn(p.prog, out.data()) == kSuccess;
  };

  {
    Program p{*api_};
    result.log = run(p, result.options);
    if (!fetch(p, api_->GetCUBINSize, api_->GetCUBIN, result.cubin))
      throw Error("NVRTC produced no cubin for '" + prog_name + "' (" + arch + ")", ErrorCode::kCompile);
    if (opt.want_ptx && fetch(p, api_->GetPTXSize, api_->GetPTX, result.ptx) && result.ptx.size() <= 1)
      result.ptx.clear();
  }
  if (opt.want_ptx && result.ptx.empty()) {
    std::vector<std::string> options = result.options;
    options[3] = "-arch=" + virtual_arch(arch);
    Program p{*api_};
    run(p, options);
    if (!fetch(p, api_->GetPTXSize, api_->GetPTX, result.ptx))
      throw Error("NVRTC produced no PTX for '" + prog_name + "' (" + arch + ")", ErrorCode::kCompile);
  }
  if (!result.ptx.empty() && result.ptx.back() == '\0') result.ptx.pop_back();
  result.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace fa::jit
