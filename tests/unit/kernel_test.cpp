// fa::create_block_mask and fa::BlockMaskFactory (fajit/kernel.h) on the CPU: a mask the
// analysis decides completely compiles nothing, in particular no forward kernel; bad options
// fail as fa::compile's do; a factory builds what create_block_mask builds, call after call.
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

TEST(BlockMaskFactory, BuildsWhatCreateBlockMaskBuildsForEachCallsSizesAndScalars) {
  const fa::BlockMaskFactory factory(fa::mods::sliding_window());
  const fa::BlockMaskFactory copy = factory;  // shares the traced mask_mod
  for (int window : {100, 300, 1000}) {
    fa::Captures cap;
    cap.scalar("window", window);
    for (int64_t len : {256, 1000, 4097}) {
      const fa::BlockMask want = fa::create_block_mask(fa::mods::sliding_window(), 1, 1, len, len, cap);
      const fa::BlockMask got = (window == 300 ? copy : factory).build(1, 1, len, len, cap);
      ASSERT_TRUE(got.valid());
      EXPECT_EQ(got.kinds(), want.kinds()) << "window " << window << ", length " << len;
      EXPECT_EQ(got.num_q_blocks(), want.num_q_blocks());
    }
  }
  EXPECT_EQ(fa::test::error_of([&] { factory.build(0, 1, 256, 256); }),
            "block mask needs positive sizes, got B=0 H=1 Lq=256 Lkv=256");
}

}  // namespace
