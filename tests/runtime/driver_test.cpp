// Runs with FAJIT_CUDA_LIBRARY pointing at a library that does not exist (see CMakeLists.txt),
// so it pins the no-driver paths on any machine, with or without a GPU.
#include "fajit/runtime/driver.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fajit/block_mask.h"
#include "fajit/error.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/memory.h"

namespace {

constexpr const char* kMissing = "libfajit-no-such-driver.so.1";

class NoDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("FAJIT_CUDA_LIBRARY");
    if (!env || std::string(env) != kMissing) GTEST_SKIP() << "run with FAJIT_CUDA_LIBRARY=" << kMissing;
  }
};

const std::string kPrefix = std::string("no CUDA driver: cannot load ") + kMissing + " (";

TEST_F(NoDriver, CudaAvailableIsFalse) {
  EXPECT_FALSE(fa::rt::cuda_available());
  const std::string why = fa::rt::cuda_unavailable_reason();
  EXPECT_EQ(why.rfind(kPrefix, 0), 0u) << why;
  EXPECT_NE(why.find("cannot open shared object file"), std::string::npos) << why;
  EXPECT_EQ(why.back(), ')');
}

TEST_F(NoDriver, DriverThrowsTheSameErrorEveryTime) {
  for (int i = 0; i < 2; ++i) {
    try {
      fa::rt::driver();
      FAIL() << "driver() did not throw";
    } catch (const fa::Error& e) {
      EXPECT_EQ(e.code(), fa::ErrorCode::kCuda);
      EXPECT_EQ(std::string(e.what()), fa::rt::cuda_unavailable_reason());
    }
  }
}

TEST_F(NoDriver, RuntimeEntryPointsThrow) {
  EXPECT_THROW(fa::rt::ContextGuard(), fa::Error);
  EXPECT_THROW(fa::rt::DeviceBuffer(16), fa::Error);
  EXPECT_THROW(fa::rt::current_device_info(), fa::Error);
  EXPECT_NO_THROW(fa::rt::DeviceBuffer(0));  // allocates nothing
  fa::BlockMask m = fa::BlockMask::all_full(1, 1, 128, 128);
  EXPECT_THROW(m.device_tables(), fa::Error);
  EXPECT_EQ(m.kv_num_blocks().size(), 1u);  // host tables need no driver
}

TEST_F(NoDriver, CheckWithoutDriver) {
  try {
    fa::rt::check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "cuMemAlloc failed: CUDA error 2 (unknown error)");
    EXPECT_EQ(e.code(), fa::ErrorCode::kCuda);
  }
  EXPECT_NO_THROW(fa::rt::check(CUDA_SUCCESS, "cuInit"));
}

TEST(LoadDriver, MissingLibrary) {
  try {
    fa::rt::detail::load_driver(kMissing);
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(kPrefix, 0), 0u) << e.what();
    EXPECT_EQ(e.code(), fa::ErrorCode::kCuda);
  }
}

TEST(LoadDriver, MissingSymbol) {
  try {
    fa::rt::detail::load_driver("libc.so.6");
    FAIL();
  } catch (const fa::Error& e) {
    EXPECT_STREQ(e.what(), "no CUDA driver: libc.so.6 has no symbol cuInit");
  }
}

TEST(LoadDriver, LibraryNameFromEnvironment) {
  const char* env = std::getenv("FAJIT_CUDA_LIBRARY");
  EXPECT_EQ(fa::rt::detail::driver_library_name(), env && *env ? env : "libcuda.so.1");
}

}  // namespace
