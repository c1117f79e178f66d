// fa::create_block_mask (fajit/kernel.h) on the CPU: a mask the analysis decides completely
// compiles nothing, in particular no forward kernel; bad options fail as fa::compile's do.
#include "fajit/kernel.h"

#include <gtest/gtest.h>

#include "fa_test_util.h"
#include "fajit/jit/cache.h"
#include "fajit/mods.h"

namespace {

TEST(CreateBlockMask, CompilesNoForwardKernel) {
  const fa::jit::CacheStats before = fa::jit::Cache::global().stats();
  fa::BlockMask m = fa::create_block_mask(fa::mods::causal(), 2, 4, 1000, 1000);
  const fa::jit::CacheStats after = fa::jit::Cache::global().stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.memory_hits, before.memory_hits);
  EXPECT_EQ(after.disk_hits, before.disk_hits);
  ASSERT_TRUE(m.valid());
  EXPECT_EQ(m.batch(), 1);  // causal reads neither b nor h
  EXPECT_EQ(m.heads(), 1);
  EXPECT_EQ(m.kind(0, 0, 0, 0), fa::BlockKind::kPartial);
  EXPECT_EQ(m.kind(0, 0, 7, 0), fa::BlockKind::kFull);
  EXPECT_EQ(m.kind(0, 0, 0, 7), fa::BlockKind::kEmpty);
}

TEST(CreateBlockMask, ChecksTheOptionsLikeCompile) {
  fa::Options o;
  o.head_dim_qk = 100;
  EXPECT_EQ(fa::test::error_of([&] { fa::create_block_mask(fa::mods::causal(), 1, 1, 256, 256, {}, {}, o); }),
            "head_dim_qk must be a multiple of 8 from 32 to 256, got 100");
}

}  // namespace
