#include "fajit/jit/arch.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include "fajit/error.h"

namespace {

using fa::test::error_of;

TEST(Arch, KnownArchsValidate) {
  for (const std::string& a : fa::jit::known_archs()) EXPECT_EQ(fa::jit::validate_arch(a), a);
}

TEST(Arch, UnknownArchMessage) {
  EXPECT_EQ(error_of([] { fa::jit::validate_arch("sm_7"); }),
            "unknown target arch 'sm_7'; expected sm_80, sm_86, sm_87, sm_89, sm_90, sm_90a, "
            "sm_100, sm_100a, sm_103, sm_103a, sm_110, sm_110a, sm_120, sm_120a, sm_121, "
            "sm_121a");
  EXPECT_THROW(fa::jit::validate_arch("compute_90"), fa::Error);
  EXPECT_THROW(fa::jit::validate_arch(""), fa::Error);
}

TEST(Arch, FromComputeCapability) {
  EXPECT_EQ(fa::jit::arch_for_device(8, 0), "sm_80");
  EXPECT_EQ(fa::jit::arch_for_device(8, 6), "sm_86");
  EXPECT_EQ(fa::jit::arch_for_device(8, 9), "sm_89");
  EXPECT_EQ(fa::jit::arch_for_device(9, 0), "sm_90a");
  EXPECT_EQ(fa::jit::arch_for_device(10, 0), "sm_100");
  EXPECT_EQ(fa::jit::arch_for_device(12, 0), "sm_120");
}

TEST(Arch, OldOrUnknownCapability) {
  EXPECT_EQ(error_of([] { fa::jit::arch_for_device(7, 5); }),
            "compute capability 7.5 is not supported; fajit needs sm_80 or newer");
  EXPECT_EQ(error_of([] { fa::jit::arch_for_device(8, 1); }),
            "compute capability 8.1 is not known to this fajit (sm_81)");
}

TEST(Arch, VirtualArch) {
  EXPECT_EQ(fa::jit::virtual_arch("sm_90a"), "compute_90a");
  EXPECT_EQ(fa::jit::virtual_arch("sm_80"), "compute_80");
}

}  // namespace
