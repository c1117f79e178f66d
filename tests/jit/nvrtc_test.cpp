#include "fajit/jit/nvrtc.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "fajit/error.h"

namespace {

using fa::jit::CompileOptions;
using fa::jit::Nvrtc;

// A trivial kernel that needs an embedded header (the kernel ABI) to compile.
constexpr const char* kKernel = R"(#include "fajit/params.h"
extern "C" __global__ void fa_test_kernel(FaFwdParams p) {
  if (threadIdx.x == 0) p.lse[blockIdx.x] = p.scale * (float)p.len_q;
}
)";

// Line 4 fails, and carries codegen's origin comment.
constexpr const char* kBadKernel = R"(#include "fajit/params.h"
extern "C" __global__ void fa_bad(FaFwdParams p) {
  float x = p.scale;
  float y = x + undefined_thing;  // fa: arith.addf %score, %m
  p.lse[0] = y;
}
)";

TEST(Nvrtc, LoadsAndReportsVersion) {
  const Nvrtc& nv = Nvrtc::get();
  EXPECT_GE(nv.version_major(), 12);
  EXPECT_EQ(nv.version(), std::to_string(nv.version_major()) + "." + std::to_string(nv.version_minor()));
  EXPECT_NE(nv.library().find("libnvrtc"), std::string::npos) << nv.library();
}

TEST(Nvrtc, CompilesKernelWithEmbeddedHeader) {
  CompileOptions opt;
  opt.arch = "sm_80";
  opt.want_ptx = true;
  fa::jit::CompileResult r = Nvrtc::get().compile(kKernel, "fa_test.cu", opt);
  ASSERT_GT(r.cubin.size(), 4u);
  EXPECT_EQ(r.cubin.substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_NE(r.ptx.find(".entry fa_test_kernel"), std::string::npos) << r.ptx;
  EXPECT_NE(r.ptx.find(".target sm_80"), std::string::npos);
  EXPECT_EQ(r.options,
            (std::vector<std::string>{"-default-device", "-std=c++17", "-DNDEBUG", "-arch=sm_80"}));
  EXPECT_GT(r.wall_ms, 0.0);
}

TEST(Nvrtc, CompilesForSm90aWithLineInfoAndExtraOptions) {
  CompileOptions opt;
  opt.arch = "sm_90a";
  opt.line_info = true;
  opt.extra = {"-DFA_TEST_FLAG=1"};
  fa::jit::CompileResult r = Nvrtc::get().compile(kKernel, "fa_test.cu", opt);
  EXPECT_EQ(r.cubin.substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_TRUE(r.ptx.empty());
  EXPECT_EQ(r.options, (std::vector<std::string>{"-default-device", "-std=c++17", "-DNDEBUG", "-arch=sm_90a",
                                                 "-lineinfo", "-DFA_TEST_FLAG=1"}));
}

TEST(Nvrtc, CompileErrorQuotesGeneratedLine) {
  CompileOptions opt;
  opt.arch = "sm_80";
  try {
    Nvrtc::get().compile(kBadKernel, "fa_bad.cu", opt);
    FAIL() << "expected a compile error";
  } catch (const fa::Error& e) {
    EXPECT_EQ(e.code(), fa::ErrorCode::kCompile);
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("cannot compile 'fa_bad.cu' for sm_80 (NVRTC_ERROR_COMPILATION):\n"
                        "fa_bad.cu(4): error: identifier \"undefined_thing\" is undefined\n",
                        0),
              0u)
        << msg;
    const std::string tail =
        "offending lines:\n"
        "  4 |   float y = x + undefined_thing;  // fa: arith.addf %score, %m";
    ASSERT_GE(msg.size(), tail.size());
    EXPECT_EQ(msg.substr(msg.size() - tail.size()), tail) << msg;
  }
}

TEST(Nvrtc, ErrorInsideAnEmbeddedHeaderIsQuotedFromIt) {
  CompileOptions opt;
  opt.arch = "sm_80";
  // A macro that breaks the header's own text: the error is reported in fajit/params.h.
  const char* src = "#define FaScalar 42\n#include \"fajit/params.h\"\n";
  try {
    Nvrtc::get().compile(src, "fa_hdr.cu", opt);
    FAIL();
  } catch (const fa::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("offending lines:\n  fajit/params.h:"), std::string::npos) << msg;
    EXPECT_NE(msg.find(" | "), std::string::npos) << msg;
  }
}

TEST(Nvrtc, MissingIncludeIsQuoted) {
  CompileOptions opt;
  opt.arch = "sm_80";
  try {
    Nvrtc::get().compile("#include \"fajit/nope.cuh\"  // fa: template\n", "fa_inc.cu", opt);
    FAIL();
  } catch (const fa::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fa_inc.cu(1): catastrophic error: cannot open source file "
                       "\"fajit/nope.cuh\""),
              std::string::npos)
        << msg;
    const std::string tail = "offending lines:\n  1 | #include \"fajit/nope.cuh\"  // fa: template";
    ASSERT_GE(msg.size(), tail.size());
    EXPECT_EQ(msg.substr(msg.size() - tail.size()), tail) << msg;
  }
}

TEST(Nvrtc, BadArchIsRejectedBeforeCompiling) {
  CompileOptions opt;
  opt.arch = "sm_7";
  try {
    Nvrtc::get().compile(kKernel, "fa_test.cu", opt);
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(e.code(), fa::ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()).rfind("unknown target arch 'sm_7'; expected sm_80, ", 0), 0u);
  }
}

TEST(Nvrtc, NotFoundListsEveryPlace) {
  try {
    Nvrtc::load({{"/nonexistent/libnvrtc.so", "$FAJIT_NVRTC_LIBRARY"},
                 {"", "loaded in this process"},
                 {"libnvrtc-fajit-test.so.99", "soname"}});
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(e.code(), fa::ErrorCode::kCompile);
    EXPECT_EQ(std::string(e.what()),
              "cannot load NVRTC; tried:\n"
              "  /nonexistent/libnvrtc.so ($FAJIT_NVRTC_LIBRARY): cannot open shared object "
              "file: No such file or directory\n"
              "  a libnvrtc loaded in this process: none\n"
              "  libnvrtc-fajit-test.so.99 (soname): cannot open shared object file: No such "
              "file or directory\n"
              "set FAJIT_NVRTC_LIBRARY to the path of libnvrtc.so");
  }
}

// A libnvrtc of too old a major version, or one without an entry point fajit uses, is passed
// over with the reason, and the next place is tried (tests/jit/fake: stand-in libraries).
TEST(Nvrtc, TooOldOrIncompleteLibraryIsPassedOverWithTheReason) {
  try {
    Nvrtc::load({{FAJIT_FAKE_NVRTC11, "$FAJIT_NVRTC_LIBRARY"}, {FAJIT_FAKE_NVRTC_PARTIAL, "soname"}});
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(e.code(), fa::ErrorCode::kCompile);
    EXPECT_EQ(std::string(e.what()),
              "cannot load NVRTC; tried:\n"
              "  " FAJIT_FAKE_NVRTC11
              " ($FAJIT_NVRTC_LIBRARY): NVRTC 11.8, fajit needs 12.0 or newer\n"
              "  " FAJIT_FAKE_NVRTC_PARTIAL
              " (soname): missing nvrtcCreateProgram, nvrtcDestroyProgram, nvrtcCompileProgram, "
              "nvrtcGetPTXSize, nvrtcGetPTX, nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcGetProgramLogSize, "
              "nvrtcGetProgramLog\n"
              "set FAJIT_NVRTC_LIBRARY to the path of libnvrtc.so");
  }
  // A good one after them is taken.
  const std::string real = Nvrtc::get().library();
  EXPECT_EQ(Nvrtc::load({{FAJIT_FAKE_NVRTC11, "$FAJIT_NVRTC_LIBRARY"}, {real, "soname"}})->version(),
            Nvrtc::get().version());
}

TEST(Nvrtc, EnvironmentOverrideIsTheOnlyPlace) {
  ::setenv("FAJIT_NVRTC_LIBRARY", "/nonexistent", 1);
  std::vector<fa::jit::NvrtcPlace> places = Nvrtc::default_places();
  ::unsetenv("FAJIT_NVRTC_LIBRARY");
  ASSERT_EQ(places.size(), 1u);
  EXPECT_EQ(places[0].path, "/nonexistent");
  EXPECT_EQ(places[0].why, "$FAJIT_NVRTC_LIBRARY");
}

TEST(Nvrtc, DefaultPlacesPreferTheLoadedCopy) {
  Nvrtc::get();  // loads one
  std::vector<fa::jit::NvrtcPlace> places = Nvrtc::default_places();
  ASSERT_GE(places.size(), 2u);
  EXPECT_EQ(places[0].why, "loaded in this process");
  EXPECT_NE(places[0].path.find("libnvrtc"), std::string::npos);
  EXPECT_EQ(places[1].path, "libnvrtc.so.13");
  EXPECT_EQ(places.back().path, "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12");
  EXPECT_EQ(Nvrtc::load(places)->version(), Nvrtc::get().version());
}

TEST(Nvrtc, CompilesFromManyThreads) {
  const Nvrtc& nv = Nvrtc::get();
  std::vector<std::string> cubins(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      CompileOptions opt;
      opt.arch = "sm_86";
      cubins[i] = nv.compile(kKernel, "fa_test.cu", opt).cubin;
    });
  for (auto& t : threads) t.join();
  for (int i = 1; i < 4; ++i) EXPECT_EQ(cubins[i], cubins[0]);
}

}  // namespace
