// Generated mod code (fa::emit_mods's FaMods) compiled with the host compiler and run, without a
// GPU: the embedded params.h and modlib.cuh, a stub prelude standing in for the device
// intrinsics they and the emitted mods reach (correctly rounded arithmetic, cvt.rzi's
// saturating float-to-int conversions, the host's libm), and a test's own source.
//
//   std::string tu = fa_test::mods_struct(fa::emit_mods(program), "Mods0") + harness;
//   fa_test::HostRun r = fa_test::run_on_host("fajit-my-check", tu + "int main() { ... }");
//   ASSERT_TRUE(r.compiled) << r.compile_log;   // r.rc, r.output: the program's exit status, stdout
//   if (!HasFailure()) r.remove();
// Used by tests/unit/kv_range_host_test.cpp, tests/unit/block_walk_host_test.cpp and
// tests/fuzz/host_exec_test.cpp.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "fajit/detail/embedded_templates.h"

#ifndef FAJIT_HOST_CXX
#define FAJIT_HOST_CXX "c++"
#endif

namespace fa_test {

// What modlib.cuh and the emitted mods reach of the device prelude, on the host.
inline constexpr const char* kHostPrelude = R"(#pragma once
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstring>
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __frcp_rn(float a) { return 1.f / a; }
static inline float rsqrtf(float a) { return 1.f / std::sqrt(a); }
// cvt.rzi: truncate, saturate, NaN -> 0
static inline int __float2int_rz(float a) {
  if (a != a) return 0;
  if (a >= 2147483648.f) return 2147483647;
  if (a <= -2147483648.f) return -2147483647 - 1;
  return (int)a;
}
static inline unsigned __float2uint_rz(float a) {
  if (a != a || a <= 0.f) return 0u;
  if (a >= 4294967296.f) return 4294967295u;
  return (unsigned)a;
}
static inline float __int2float_rn(int a) { return (float)a; }
static inline float __uint2float_rn(unsigned a) { return (float)a; }
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T __shfl_sync(unsigned, T v, int) { return v; }
static inline void red_add_f32(float* p, float v) { *p += v; }
namespace fa {
static inline float rcp(float x) { return 1.f / x; }
static inline float ex2(float x) { return exp2f(x); }
}
)";

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The FaMods struct of emit_mods' source, renamed `name` (so many fit one translation unit);
// empty when the source has none.
inline std::string mods_struct(const std::string& emitted, const std::string& name) {
  const size_t at = emitted.find("struct FaMods {"), end = emitted.find("\n};\n", at);
  if (at == std::string::npos || end == std::string::npos) return {};
  std::string s = emitted.substr(at, end + 4 - at);
  s.replace(0, std::string("struct FaMods {").size(), "struct " + name + " {");
  return s;
}

struct HostRun {
  std::filesystem::path dir;
  std::string command;  // the compile command
  bool compiled = false;
  std::string compile_log;  // the compiler's output
  int rc = -1;              // the program's exit status (system()'s)
  std::string output;       // its stdout and stderr
  void remove() const { std::filesystem::remove_all(dir); }
};

// Writes params.h, modlib.cuh, block_walk.cuh and the stub prelude into a fresh directory `tag`-<pid> under
// the temp directory, `source` after a prologue that includes them (with __device__ and
// __forceinline__ defined away), compiles it with the host compiler (-O1, wrapping signed
// arithmetic, no FMA contraction: each operation rounded, as __fmul_rn / __fadd_rn and the
// interpreter round) and runs it.
inline HostRun run_on_host(const std::string& tag, const std::string& source) {
  namespace fs = std::filesystem;
  HostRun r;
  r.dir = fs::temp_directory_path() / fmt::format("{}-{}", tag, ::getpid());
  fs::create_directories(r.dir / "fajit");
  int n = 0;
  const fa::detail::EmbeddedHeader* headers = fa::detail::embedded_headers(&n);
  for (int i = 0; i < n; ++i) {
    const std::string name = headers[i].name;
    if (name == "fajit/params.h" || name == "fajit/modlib.cuh" || name == "fajit/block_walk.cuh")
      std::ofstream(r.dir / name) << headers[i].text;
  }
  std::ofstream(r.dir / "fajit/prelude.cuh") << kHostPrelude;
  std::ofstream(r.dir / "main.cpp")
      << "#define __device__\n#define __forceinline__ inline\n#include <cstdio>\n#include <cstring>\n"
         "#include <vector>\n#include \"fajit/params.h\"\n#include \"fajit/prelude.cuh\"\n"
         "#include \"fajit/modlib.cuh\"\n"
      << source;
  r.command = fmt::format("{} -std=c++17 -O1 -fwrapv -ffp-contract=off -w -I{} -o {} {} > {} 2>&1",
                          FAJIT_HOST_CXX, r.dir.string(), (r.dir / "main").string(),
                          (r.dir / "main.cpp").string(), (r.dir / "compile.log").string());
  r.compiled = std::system(r.command.c_str()) == 0;
  r.compile_log = read_file(r.dir / "compile.log");
  if (!r.compiled) return r;
  r.rc = std::system(
      fmt::format("{} > {} 2>&1", (r.dir / "main").string(), (r.dir / "run.log").string()).c_str());
  r.output = read_file(r.dir / "run.log");
  return r;
}

}  // namespace fa_test
