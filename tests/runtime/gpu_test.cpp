// GPU tests: driver, modules, launches, device tables and the block-mask builder against
// brute-force host tables. Kernels are compiled here with NVRTC from a hand-written FaMods,
// with the embedded templates as in-memory headers, independently of the compiler.
// Skipped (GTEST_SKIP) where there is no driver or no GPU.
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fajit/block_mask.h"
#include "fajit/detail/embedded_templates.h"
#include "fajit/error.h"
#include "fajit/params.h"
#include "fajit/runtime/block_mask_builder.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"
#include "reference_masks.h"

namespace {

const char* kSource = R"cuda(
#include "fajit/params.h"

#define FA_TEST_NO_SCORE_MOD \
  static constexpr bool kHasScoreMod = false; \
  static __device__ __forceinline__ float score_mod(float s, int, int, int, int, \
                                                    const FaCaptures&) { return s; }

struct CausalMods {
  FA_TEST_NO_SCORE_MOD
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv,
                                                  const FaCaptures& cap) {
    return kv <= q;
  }
};

// Causal sliding window whose width depends on the head: scalars[0] + h * scalars[1].
struct SlidingMods {
  FA_TEST_NO_SCORE_MOD
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv,
                                                  const FaCaptures& cap) {
    const int w = cap.scalars[0].i + h * cap.scalars[1].i;
    return kv <= q && q - kv < w;
  }
};

// Document masking from captured per-batch ids: buffers[0] is int32 [B, L].
struct DocumentMods {
  FA_TEST_NO_SCORE_MOD
  static constexpr bool kHasMaskMod = true;
  static __device__ __forceinline__ bool mask_mod(int b, int h, int q, int kv,
                                                  const FaCaptures& cap) {
    const int* doc = (const int*)cap.buffers[0].ptr;
    const long long sb = cap.buffers[0].stride[0], sl = cap.buffers[0].stride[1];
    return doc[b * sb + q * sl] == doc[b * sb + kv * sl];
  }
};

struct NoMaskMods {
  FA_TEST_NO_SCORE_MOD
  static constexpr bool kHasMaskMod = false;
  static __device__ __forceinline__ bool mask_mod(int, int, int, int, const FaCaptures&) {
    return false;  // never called
  }
};

#include "fajit/block_mask.cuh"
FAJIT_DEFINE_BLOCK_MASK(fa_bm_causal, CausalMods)
FAJIT_DEFINE_BLOCK_MASK(fa_bm_sliding, SlidingMods)
FAJIT_DEFINE_BLOCK_MASK(fa_bm_document, DocumentMods)
FAJIT_DEFINE_BLOCK_MASK(fa_bm_nomask, NoMaskMods)

extern "C" __global__ void fa_test_fill(int* out, int n, int value) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + i;
}

// Needs more than 48 KB of dynamic shared memory: reverses `n` ints through it.
extern "C" __global__ void fa_test_smem(const int* in, int* out, int n) {
  extern __shared__ int tile[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tile[n - 1 - i];
}
)cuda";

std::string nvrtc_check(nvrtcResult r, const char* what) {
  return r == NVRTC_SUCCESS ? "" : std::string(what) + ": " + nvrtcGetErrorString(r);
}

// Compiles kSource for `arch` ("sm_90"); returns the cubin, or "" and the log in *log.
std::string compile_test_source(const std::string& arch, std::string* log_out) {
  int count = 0;
  const fa::detail::EmbeddedHeader* headers = fa::detail::embedded_headers(&count);
  std::vector<const char*> names, texts;
  for (int i = 0; i < count; ++i) {
    names.push_back(headers[i].name);
    texts.push_back(headers[i].text);
  }
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, kSource, "fa_runtime_test.cu", count, texts.data(), names.data());
  if (r != NVRTC_SUCCESS) {
    *log_out = nvrtc_check(r, "nvrtcCreateProgram");
    return std::string();
  }
  const std::string arch_opt = "--gpu-architecture=" + arch;
  const char* opts[] = {arch_opt.c_str(), "-std=c++17"};
  r = nvrtcCompileProgram(prog, 2, opts);
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  std::string log(log_size, '\0');
  if (log_size) nvrtcGetProgramLog(prog, &log[0]);
  std::string out;
  if (r != NVRTC_SUCCESS) {
    *log_out = nvrtc_check(r, "nvrtcCompileProgram") + "\n" + log;
  } else {
    size_t size = 0;
    nvrtcGetCUBINSize(prog, &size);
    out.resize(size);
    nvrtcGetCUBIN(prog, &out[0]);
  }
  nvrtcDestroyProgram(&prog);
  return out;
}

// The test kernels for the current device, compiled once.
const std::string& test_cubin() {
  static const std::string cubin = [] {
    std::string log;
    std::string out = compile_test_source(fa::rt::current_device_info().arch(), &log);
    if (out.empty()) ADD_FAILURE() << log;
    return out;
  }();
  return cubin;
}

// Needs only NVRTC: the builder template compiles without any CUDA toolkit header.
TEST(Templates, BlockMaskBuilderCompilesWithNvrtc) {
  for (const char* arch : {"sm_80", "sm_90"}) {
    std::string log;
    EXPECT_FALSE(compile_test_source(arch, &log).empty()) << arch << ": " << log;
  }
}

CUfunction kernel(const char* name) {
  return fa::rt::load_function("fajit-runtime-test", test_cubin(), name);
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
    ASSERT_FALSE(test_cubin().empty());
  }
};

TEST_F(Gpu, DeviceInfo) {
  const fa::rt::DeviceInfo& info = fa::rt::current_device_info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.cc_major, 7);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.max_smem_per_block_optin, 48 * 1024);
  EXPECT_EQ(info.arch(), "sm_" + std::to_string(info.cc_major) + std::to_string(info.cc_minor));
  std::printf("device: %s, %s, %d SMs, %d B smem opt-in, driver %d\n", info.name.c_str(), info.arch().c_str(),
              info.sm_count, info.max_smem_per_block_optin, fa::rt::driver().version);
}

TEST_F(Gpu, PrimaryContextIsPushedAndPopped) {
  std::thread([] {  // a fresh thread has no current context
    CUcontext cur = reinterpret_cast<CUcontext>(1);
    FA_CU(cuCtxGetCurrent, &cur);
    EXPECT_EQ(cur, nullptr);
    {
      fa::rt::ContextGuard guard;
      EXPECT_NE(guard.context(), nullptr);
      FA_CU(cuCtxGetCurrent, &cur);
      EXPECT_EQ(cur, guard.context());
      fa::rt::ContextGuard nested;  // uses the current one, pushes nothing
      EXPECT_EQ(nested.context(), guard.context());
    }
    FA_CU(cuCtxGetCurrent, &cur);
    EXPECT_EQ(cur, nullptr);
  })
      .join();
}

TEST_F(Gpu, LoadAndLaunch) {
  CUfunction fn = kernel("fa_test_fill");
  // Cached per (context, key): the image is not read again.
  EXPECT_EQ(fa::rt::load_function("fajit-runtime-test", "", "fa_test_fill"), fn);
  const int n = 1000;
  fa::rt::DeviceBuffer buf(n * sizeof(int));
  CUdeviceptr ptr = buf.ptr();
  int count = n, value = 7;
  void* args[] = {&ptr, &count, &value};
  fa::rt::launch(fn, fa::rt::Dim3((n + 127) / 128), fa::rt::Dim3(128), 0, nullptr, args);
  std::vector<int> host(n);
  buf.download(host.data(), n * sizeof(int));
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 7 + i) << i;
}

TEST_F(Gpu, LaunchWithLargeDynamicSharedMemory) {
  const int n = 25000;  // 100 000 bytes of shared memory
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i * 3;
  fa::rt::DeviceBuffer a(n * sizeof(int)), b(n * sizeof(int));
  a.upload(in.data(), n * sizeof(int));
  b.memset32(0xffffffffu);
  CUdeviceptr pa = a.ptr(), pb = b.ptr();
  int count = n;
  void* args[] = {&pa, &pb, &count};
  fa::rt::launch(kernel("fa_test_smem"), fa::rt::Dim3(1), fa::rt::Dim3(256), n * sizeof(int), nullptr, args);
  b.download(out.data(), n * sizeof(int));
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[i], in[n - 1 - i]) << i;
  const int too_much = fa::rt::current_device_info().max_smem_per_block_optin + 16;
  try {
    fa::rt::launch(kernel("fa_test_smem"), fa::rt::Dim3(1), fa::rt::Dim3(256), too_much, nullptr, args);
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("launch: kernel needs " + std::to_string(too_much) +
                                         " bytes of shared memory; "),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Gpu, ModuleErrors) {
  try {
    kernel("fa_no_such_kernel");
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "kernel 'fa_no_such_kernel' not found in module 'fajit-runtime-test'");
    EXPECT_EQ(e.code(), fa::ErrorCode::kCuda);
  }
  try {
    fa::rt::load_function("garbage",
                          std::string("\x7f"
                                      "ELF garbage",
                                      12),
                          "x");
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cuModuleLoadData failed: CUDA_ERROR_", 0), 0u) << e.what();
    EXPECT_EQ(e.code(), fa::ErrorCode::kCuda);
  }
}

TEST_F(Gpu, BlockMaskDeviceTables) {
  const auto kinds = fa::test::reference_kinds([](int, int h, int q, int kv) { return kv <= q + h; }, 1, 2,
                                               700, 900, 128, 64);
  fa::BlockMask m = fa::BlockMask::from_kinds(1, 2, 700, 900, kinds, 128, 64);
  fa::BlockMaskDeviceTables d = m.device_tables();
  EXPECT_EQ(m.device_tables().kv_indices, d.kv_indices);  // uploaded once per context
  auto download = [](const int* p, size_t n) {
    std::vector<int32_t> v(n);
    FA_CU(cuMemcpyDtoH, v.data(), reinterpret_cast<CUdeviceptr>(p), n * sizeof(int32_t));
    return v;
  };
  fa::rt::ContextGuard guard;
  EXPECT_EQ(download(d.kv_num_blocks, m.kv_num_blocks().size()), m.kv_num_blocks());
  EXPECT_EQ(download(d.kv_indices, m.kv_indices().size()), m.kv_indices());
  EXPECT_EQ(download(d.full_kv_indices, m.full_kv_indices().size()), m.full_kv_indices());
  EXPECT_EQ(download(d.q_indices, m.q_indices().size()), m.q_indices());
  EXPECT_EQ(download(d.full_q_num_blocks, m.full_q_num_blocks().size()), m.full_q_num_blocks());
  FaBlockTables t{};
  m.fill(t);
  EXPECT_EQ(t.kv_indices, d.kv_indices);
  EXPECT_EQ(t.row_stride_b, 0);
  EXPECT_EQ(t.row_stride_h, m.num_q_blocks());
  EXPECT_EQ(t.num_q_blocks, 6);
  EXPECT_EQ(t.num_kv_blocks, 15);
  EXPECT_EQ(t.q_block, 128);
  EXPECT_EQ(t.kv_block, 64);
}

struct Case {
  int len_q, len_kv, q_block, kv_block;
};

std::vector<Case> builder_cases() {
  const int lengths[][2] = {{1, 1},     {17, 17},     {1000, 1000}, {4097, 4097},
                            {17, 4097}, {4097, 1000}, {1, 1000}};
  const int blocks[][2] = {{128, 128}, {64, 64}, {64, 128}};
  std::vector<Case> cases;
  for (auto& l : lengths)
    for (auto& b : blocks) cases.push_back({l[0], l[1], b[0], b[1]});
  return cases;
}

std::vector<int32_t> download_ints(const int* p, size_t n) {
  std::vector<int32_t> v(n);
  if (n) FA_CU(cuMemcpyDtoH, v.data(), reinterpret_cast<CUdeviceptr>(p), n * sizeof(int32_t));
  return v;
}

std::vector<uint8_t> download_bytes(const unsigned char* p, size_t n) {
  std::vector<uint8_t> v(n);
  if (n) FA_CU(cuMemcpyDtoH, v.data(), reinterpret_cast<CUdeviceptr>(p), n);
  return v;
}

// The tables a mask built on the device holds there (all eight, and fill()'s sub-block kinds in
// kv_indices' order) equal those the host derives from the same kinds (`host`, a host mask).
void expect_same_device_tables(const fa::BlockMask& dev, const fa::BlockMask& host) {
  ASSERT_TRUE(dev.built_on_device());
  ASSERT_FALSE(host.built_on_device());
  fa::rt::ContextGuard guard;
  const fa::BlockMaskDeviceTables t = dev.device_tables();
  FA_CU(cuCtxSynchronize);
  EXPECT_EQ(download_ints(t.kv_num_blocks, host.kv_num_blocks().size()), host.kv_num_blocks());
  EXPECT_EQ(download_ints(t.kv_indices, host.kv_indices().size()), host.kv_indices());
  EXPECT_EQ(download_ints(t.full_kv_num_blocks, host.full_kv_num_blocks().size()), host.full_kv_num_blocks());
  EXPECT_EQ(download_ints(t.full_kv_indices, host.full_kv_indices().size()), host.full_kv_indices());
  EXPECT_EQ(download_ints(t.q_num_blocks, host.q_num_blocks().size()), host.q_num_blocks());
  EXPECT_EQ(download_ints(t.q_indices, host.q_indices().size()), host.q_indices());
  EXPECT_EQ(download_ints(t.full_q_num_blocks, host.full_q_num_blocks().size()), host.full_q_num_blocks());
  EXPECT_EQ(download_ints(t.full_q_indices, host.full_q_indices().size()), host.full_q_indices());
  FaBlockTables fd{}, fh{};
  dev.fill(fd);
  host.fill(fh);
  EXPECT_EQ(fd.kv_indices, t.kv_indices);
  EXPECT_EQ(fd.row_stride_b, fh.row_stride_b);
  EXPECT_EQ(fd.row_stride_h, fh.row_stride_h);
  EXPECT_EQ(fd.num_q_blocks, fh.num_q_blocks);
  EXPECT_EQ(fd.q_block, fh.q_block);
  ASSERT_EQ(fd.kv_sub_kinds == nullptr, fh.kv_sub_kinds == nullptr);
  if (fh.kv_sub_kinds) {
    const size_t tiles = host.kinds().size();
    EXPECT_EQ(download_bytes(fd.kv_sub_kinds, tiles), download_bytes(fh.kv_sub_kinds, tiles));
  }
  FaBlockTables td{}, th{};
  dev.fill_transposed(td);
  host.fill_transposed(th);
  EXPECT_EQ(td.kv_indices, t.q_indices);
  EXPECT_EQ(td.row_stride_h, th.row_stride_h);
  EXPECT_EQ(td.num_q_blocks, th.num_q_blocks);
}

// The same mask built on the device (the builder's tables and regroup kernels): its kinds and
// tables, and those of every regrouping the forward kernels ask for, equal the host's.
void expect_built_on_device(const char* name, const FaCaptures& cap, int bm, int hm, const Case& c,
                            const fa::BlockMask& host_mask, fa::rt::BlockMaskBuildOptions opt) {
  opt.tables = kernel((std::string(name) + "_tables").c_str());
  opt.regroup = kernel((std::string(name) + "_regroup").c_str());
  fa::BlockMask dev = fa::rt::build_block_mask(kernel(name), cap, bm, hm, c.len_q, c.len_kv, opt);
  ASSERT_TRUE(dev.built_on_device());
  EXPECT_FALSE(dev.on_device());  // not the caller's tables: nothing is copied back per call
  EXPECT_FALSE(dev.regroupable());
  ASSERT_EQ(dev.kinds(), host_mask.kinds());
  expect_same_device_tables(dev, host_mask);
  fa::BlockMask host = host_mask.host_copy();
  EXPECT_EQ(dev.host_copy().kinds(), host.kinds());
  host.set_matches_mask_mod();
  dev.set_matches_mask_mod();
  const int sizes[][2] = {{192, 128}, {192, 112}, {256, 128}, {128, 64}, {64, 64}, {64, 128}, {128, 176}};
  for (auto [qb, kb] : sizes) {
    SCOPED_TRACE(::testing::Message() << "regrouped " << qb << "x" << kb);
    const fa::BlockMask& r = dev.regrouped(qb, kb);
    EXPECT_EQ(&dev.regrouped(qb, kb), &r);  // once per size
    ASSERT_EQ(r.kinds(), host.regrouped(qb, kb).kinds());
    EXPECT_EQ(r.sub_kinds(), host.regrouped(qb, kb).sub_kinds());
    expect_same_device_tables(r, host.regrouped(qb, kb).host_copy());
  }
}

void expect_built(const char* name, const FaCaptures& cap, int bm, int hm, const fa::test::MaskFn& ref,
                  const Case& c) {
  SCOPED_TRACE(::testing::Message() << name << " B=" << bm << " H=" << hm << " Lq=" << c.len_q
                                    << " Lkv=" << c.len_kv << " block=" << c.q_block << "x" << c.kv_block);
  fa::rt::BlockMaskBuildOptions opt;
  opt.q_block = c.q_block;
  opt.kv_block = c.kv_block;
  fa::BlockMask m = fa::rt::build_block_mask(kernel(name), cap, bm, hm, c.len_q, c.len_kv, opt);
  const auto kinds = fa::test::reference_kinds(ref, bm, hm, c.len_q, c.len_kv, c.q_block, c.kv_block);
  ASSERT_EQ(m.kinds(), kinds);
  const auto r = fa::test::reference_tables(kinds, bm, hm, m.num_q_blocks(), m.num_kv_blocks());
  fa::test::expect_tables(m, r);
  expect_built_on_device(name, cap, bm, hm, c, m, opt);
}

TEST_F(Gpu, BuildCausal) {
  FaCaptures cap{};
  for (const Case& c : builder_cases())
    expect_built(
        "fa_bm_causal", cap, 1, 1, [](int, int, int q, int kv) { return kv <= q; }, c);
}

TEST_F(Gpu, BuildSlidingPerHead) {
  FaCaptures cap{};
  cap.scalars[0].i = 100;
  cap.scalars[1].i = 257;
  auto ref = [](int, int h, int q, int kv) { return kv <= q && q - kv < 100 + h * 257; };
  for (const Case& c : builder_cases()) expect_built("fa_bm_sliding", cap, 1, 3, ref, c);
}

TEST_F(Gpu, BuildDocumentPerBatch) {
  for (const Case& c : builder_cases()) {
    const int bm = 2, len = std::max(c.len_q, c.len_kv);
    std::vector<int32_t> doc(size_t(bm) * len);
    std::mt19937 rng(c.len_q * 31 + c.len_kv);
    for (int b = 0; b < bm; ++b) {
      int id = 0;
      for (int i = 0; i < len; ++i) {
        if (i > 0 && rng() % (b == 0 ? 150 : 700) == 0) ++id;
        doc[size_t(b) * len + i] = id;
      }
    }
    fa::rt::DeviceBuffer buf(doc.size() * sizeof(int32_t));
    buf.upload(doc.data(), doc.size() * sizeof(int32_t));
    FaCaptures cap{};
    cap.buffers[0].ptr = buf.as<const void>();
    cap.buffers[0].stride[0] = len;
    cap.buffers[0].stride[1] = 1;
    auto ref = [&](int b, int, int q, int kv) {
      return doc[size_t(b) * len + q] == doc[size_t(b) * len + kv];
    };
    expect_built("fa_bm_document", cap, bm, 1, ref, c);
  }
}

TEST_F(Gpu, BuildWithoutMaskModIsAllFull) {
  FaCaptures cap{};
  for (const Case& c : builder_cases())
    expect_built(
        "fa_bm_nomask", cap, 2, 2, [](int, int, int, int) { return true; }, c);
}

TEST_F(Gpu, KnownKindsAreNotEvaluated) {
  // Causal 1000x1000 with blocks of 128: claim tile (7, 0) is empty and (0, 7) full;
  // everything else is evaluated.
  FaCaptures cap{};
  fa::rt::BlockMaskBuildOptions opt;
  opt.known.assign(64, 255);
  opt.known[7 * 8 + 0] = 0;
  opt.known[0 * 8 + 7] = 2;
  auto kinds = fa::rt::classify_blocks(kernel("fa_bm_causal"), cap, 1, 1, 1000, 1000, opt);
  auto ref =
      fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; }, 1, 1, 1000, 1000, 128, 128);
  ref[7 * 8 + 0] = 0;
  ref[0 * 8 + 7] = 2;
  EXPECT_EQ(kinds, ref);
  // The same on the device: the known kinds go up through a pinned staging buffer.
  opt.tables = kernel("fa_bm_causal_tables");
  opt.regroup = kernel("fa_bm_causal_regroup");
  for (int round = 0; round < 3; ++round) {  // the staging buffer is reused
    const fa::BlockMask d = fa::rt::build_block_mask(kernel("fa_bm_causal"), cap, 1, 1, 1000, 1000, opt);
    EXPECT_EQ(d.kinds(), ref);
    expect_same_device_tables(d, fa::BlockMask::from_kinds(1, 1, 1000, 1000, ref));
  }
  opt.tables = opt.regroup = nullptr;
  opt.known.resize(3);
  try {
    fa::rt::classify_blocks(kernel("fa_bm_causal"), cap, 1, 1, 1000, 1000, opt);
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "build_block_mask: known kinds: expected 64 entries, got 3");
  }
}

TEST_F(Gpu, BuildLargeCausalAndTime) {
  // 32768^2 causal, blocks of 128: 256 partial diagonal tiles, 32640 full, 32640 empty.
  FaCaptures cap{};
  CUfunction fn = kernel("fa_bm_causal");
  fa::rt::build_block_mask(fn, cap, 1, 1, 1024, 1024);  // warm up
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint8_t> kinds = fa::rt::classify_blocks(fn, cap, 1, 1, 32768, 32768);
  const double classify_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  fa::BlockMask m = fa::BlockMask::from_kinds(1, 1, 32768, 32768, kinds);
  const double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const fa::BlockMaskDensity d = m.density();
  EXPECT_EQ(d.partial, 256);
  EXPECT_EQ(d.full, 32640);
  EXPECT_EQ(d.empty, 32640);
  fa::rt::BlockMaskBuildOptions opt;
  opt.tables = kernel("fa_bm_causal_tables");
  opt.regroup = kernel("fa_bm_causal_regroup");
  const auto t0 = std::chrono::steady_clock::now();
  fa::BlockMask dev = fa::rt::build_block_mask(fn, cap, 1, 1, 32768, 32768, opt);
  const double launch_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  fa::rt::synchronize(nullptr);
  const double device_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(dev.kinds(), kinds);
  expect_same_device_tables(dev, m);
  std::printf(
      "causal 32768x32768 block mask: classify %.2f ms, with host tables %.2f ms; built on the device: "
      "%.3f ms to return, %.2f ms done\n",
      classify_ms, total_ms, launch_ms, device_ms);
}

// Kv tables given on the device (a torch BlockMask's): their kinds scattered there and all eight
// tables rebuilt equal what the host derives from the same tables (rows listed in any order, with
// and without full tables, broadcast or per batch and head); then regrouped on the device (splits).
TEST_F(Gpu, DeriveFromDeviceKvTables) {
  std::mt19937 rng(4901);
  struct Shape {
    int bm, hm, len_q, len_kv, q_block, kv_block;
    bool with_full;
  };
  for (const Shape& sh : {Shape{1, 1, 1000, 1000, 128, 128, true}, Shape{2, 3, 4097, 1000, 128, 128, true},
                          Shape{1, 2, 17, 4097, 128, 64, false}, Shape{2, 1, 3000, 3000, 256, 128, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << sh.bm << "x" << sh.hm << " " << sh.len_q << "x" << sh.len_kv << " blocks " << sh.q_block
                 << "x" << sh.kv_block << (sh.with_full ? "" : " no full"));
    const int nq = (sh.len_q + sh.q_block - 1) / sh.q_block,
              nkv = (sh.len_kv + sh.kv_block - 1) / sh.kv_block;
    const size_t rows = size_t(sh.bm) * sh.hm * nq;
    std::vector<int32_t> num(rows), idx(rows * nkv, 0), fnum(rows), fidx(rows * nkv, 0);
    for (size_t r = 0; r < rows; ++r) {
      std::vector<int32_t> blocks(nkv);
      for (int j = 0; j < nkv; ++j) blocks[j] = j;
      std::shuffle(blocks.begin(), blocks.end(), rng);  // a row's blocks in any order
      const int np = int(rng() % (nkv + 1)), nf = sh.with_full ? int(rng() % (nkv - np + 1)) : 0;
      num[r] = np, fnum[r] = nf;
      for (int i = 0; i < np; ++i) idx[r * nkv + i] = blocks[i];
      for (int i = 0; i < nf; ++i) fidx[r * nkv + i] = blocks[np + i];
    }
    const fa::BlockMask host = fa::BlockMask::from_kv_blocks(
        sh.bm, sh.hm, sh.len_q, sh.len_kv, num, idx, sh.with_full ? fnum : std::vector<int32_t>{},
        sh.with_full ? fidx : std::vector<int32_t>{}, sh.q_block, sh.kv_block);
    std::vector<int32_t> all = num;
    for (const auto* t : {&idx, &fnum, &fidx}) all.insert(all.end(), t->begin(), t->end());
    fa::rt::DeviceBuffer buf(all.size() * sizeof(int32_t));
    buf.upload(all.data(), all.size() * sizeof(int32_t));
    const int32_t* at = buf.as<const int32_t>();
    const fa::BlockMask given = fa::BlockMask::from_device_kv_blocks(
        sh.bm, sh.hm, sh.len_q, sh.len_kv, at, at + rows, sh.with_full ? at + rows + rows * nkv : nullptr,
        sh.with_full ? at + 2 * rows + rows * nkv : nullptr, sh.q_block, sh.kv_block);
    const fa::BlockMask d =
        fa::rt::derive_device_kinds(given, kernel("fa_bm_causal_kinds"), kernel("fa_bm_causal_tables"),
                                    kernel("fa_bm_causal_regroup"), nullptr);
    EXPECT_FALSE(d.matches_mask_mod());  // given tables keep flex's meaning
    ASSERT_EQ(d.kinds(), host.kinds());
    expect_same_device_tables(d, host);
    for (auto [qb, kb] : {std::pair{64, 64}, std::pair{sh.q_block, 64}}) {  // splits: exact for any tables
      SCOPED_TRACE(::testing::Message() << "split " << qb << "x" << kb);
      const fa::BlockMask r = d.regrouped_now(qb, kb, nullptr);
      ASSERT_EQ(r.kinds(), host.regrouped(qb, kb).kinds());
      expect_same_device_tables(r, host.regrouped(qb, kb).host_copy());
    }
  }
  // Bad entries never write out of bounds: counts past the row and indices outside it are skipped.
  std::vector<int32_t> bad = {9, -3, 0, 1, 7, 2, 0, 0, 0, 0};  // num [2] = {9, -3}, idx [2, 4]
  fa::rt::DeviceBuffer b(bad.size() * sizeof(int32_t));
  b.upload(bad.data(), bad.size() * sizeof(int32_t));
  const fa::BlockMask g = fa::BlockMask::from_device_kv_blocks(
      1, 1, 256, 512, b.as<const int32_t>(), b.as<const int32_t>() + 2, nullptr, nullptr, 128, 128);
  const fa::BlockMask d =
      fa::rt::derive_device_kinds(g, kernel("fa_bm_causal_kinds"), kernel("fa_bm_causal_tables"),
                                  kernel("fa_bm_causal_regroup"), nullptr);
  fa::rt::ContextGuard guard;
  FA_CU(cuCtxSynchronize);
  // row 0 lists 0, 1, 7 (skipped), 2 as partial; row 1 nothing.
  const fa::BlockMaskDeviceTables t = d.device_tables();
  EXPECT_EQ(download_ints(t.kv_num_blocks, 2), (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(download_ints(t.kv_indices, 8), (std::vector<int32_t>{0, 1, 2, 0, 0, 0, 0, 0}));
}

TEST_F(Gpu, BuildOnAStream) {
  // Non-default stream: the classification and the copy back are ordered on it.
  fa::rt::ContextGuard guard;
  CUstream stream = nullptr;
  FA_CU(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  FaCaptures cap{};
  fa::rt::BlockMaskBuildOptions opt;
  opt.stream = stream;
  opt.q_block = 64;
  const auto ref =
      fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; }, 1, 1, 3000, 2000, 64, 128);
  {
    fa::BlockMask m = fa::rt::build_block_mask(kernel("fa_bm_causal"), cap, 1, 1, 3000, 2000, opt);
    EXPECT_EQ(m.kinds(), ref);
    // Built on the device on that stream: the mask's memory is freed on it (the stream outlives it).
    opt.tables = kernel("fa_bm_causal_tables");
    opt.regroup = kernel("fa_bm_causal_regroup");
    fa::BlockMask d = fa::rt::build_block_mask(kernel("fa_bm_causal"), cap, 1, 1, 3000, 2000, opt);
    d.set_matches_mask_mod();
    const fa::BlockMask& r = d.regrouped(192, 128);  // on the mask's stream
    EXPECT_EQ(d.kinds(), ref);
    expect_same_device_tables(d, m);
    m.set_matches_mask_mod();
    expect_same_device_tables(r, m.regrouped(192, 128).host_copy());
  }
  FA_CU(cuStreamDestroy, stream);
}

}  // namespace
