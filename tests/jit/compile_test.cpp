#include "fajit/jit/compile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "fajit/error.h"
#include "fajit/jit/key.h"

namespace {

using fa::jit::Cache;
using fa::jit::KernelRequest;
using Origin = fa::CacheOrigin;

KernelRequest request() {
  KernelRequest req;
  req.source =
      "#include \"fajit/params.h\"\n"
      "extern \"C\" __global__ void fa_k(FaFwdParams p) { p.lse[0] = p.scale; }\n";
  req.name = "fa_k.cu";
  req.spec = "variant=test";
  req.meta = "fa_k test";
  req.options.arch = "sm_80";
  return req;
}

class CompileCached : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/fajit-compile-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(CompileCached, CompilesOnceThenHits) {
  Cache cache(dir_);
  fa::jit::Lookup a = fa::jit::compile_cached(request(), cache);
  EXPECT_EQ(a.origin, Origin::kCompiled);
  EXPECT_EQ(a.entry->cubin.substr(0, 4),
            "\x7f"
            "ELF");
  EXPECT_EQ(a.entry->meta, "fa_k test");
  EXPECT_EQ(fa::jit::compile_cached(request(), cache).origin, Origin::kMemory);
  Cache again(dir_);
  fa::jit::Lookup b = fa::jit::compile_cached(request(), again);
  EXPECT_EQ(b.origin, Origin::kDisk);
  EXPECT_EQ(b.entry->cubin, a.entry->cubin);
}

TEST_F(CompileCached, KeyCoversArchSpecAndFlags) {
  const fa::jit::Nvrtc& nv = fa::jit::Nvrtc::get();
  const std::string base = fa::jit::request_key(request(), nv);
  EXPECT_TRUE(fa::jit::is_valid_key(base));
  KernelRequest r = request();
  r.options.arch = "sm_90a";
  EXPECT_NE(fa::jit::request_key(r, nv), base);
  r = request();
  r.spec = "variant=other";
  EXPECT_NE(fa::jit::request_key(r, nv), base);
  r = request();
  r.options.line_info = true;
  EXPECT_NE(fa::jit::request_key(r, nv), base);
  r = request();
  r.options.extra = {"-DX=1"};
  EXPECT_NE(fa::jit::request_key(r, nv), base);
  r = request();
  r.meta = "other text";  // not part of the key
  r.name = "other.cu";
  EXPECT_EQ(fa::jit::request_key(r, nv), base);
}

TEST_F(CompileCached, CompileErrorCachesNothing) {
  Cache cache(dir_);
  KernelRequest r = request();
  r.source += "int broken = ;  // fa: arith.constant\n";
  EXPECT_THROW(fa::jit::compile_cached(r, cache), fa::Error);
  EXPECT_EQ(cache.stats().memory_entries, 0u);
  EXPECT_EQ(cache.stats().disk_entries, 0u);
}

TEST_F(CompileCached, MemoryHitIsFast) {
  Cache cache(dir_);
  const std::string key = fa::jit::request_key(request(), fa::jit::Nvrtc::get());
  cache.get_or_compile(key, [] { return std::string("cubin"); });
  std::vector<double> us;
  for (int r = 0; r < 101; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 100; ++i) cache.get_or_compile(key, [] { return std::string(); });
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                 100);
  }
  std::sort(us.begin(), us.end());
  EXPECT_LT(us[us.size() / 2], 2.0);  // the target; typically ~0.03 us
}

}  // namespace
