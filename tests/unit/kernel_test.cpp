// fa::create_block_mask and fa::BlockMaskFactory (fajit/kernel.h) on the CPU: a mask the
// analysis decides completely compiles nothing, in particular no forward kernel; bad options
// fail as fa::compile's do; a factory builds each call's mask (checked against brute force).
#include "fajit/kernel.h"

#include <gtest/gtest.h>

#include <algorithm>

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

// The kind of block (qb, kb) of a sliding window (kv <= q <= kv + window) over len x len, by
// brute force.
fa::BlockKind sliding_block(int64_t len, int window, int qb, int kb) {
  int64_t kept = 0, all = 0;
  for (int64_t q = qb * 128; q < std::min<int64_t>(len, (qb + 1) * 128); ++q)
    for (int64_t kv = kb * 128; kv < std::min<int64_t>(len, (kb + 1) * 128); ++kv, ++all)
      kept += kv <= q && q - kv <= window;
  return kept == 0 ? fa::BlockKind::kEmpty : kept == all ? fa::BlockKind::kFull : fa::BlockKind::kPartial;
}

TEST(BlockMaskFactory, BuildsEachCallsSizesAndScalars) {
  const fa::BlockMaskFactory factory(fa::mods::sliding_window());
  const fa::BlockMaskFactory copy = factory;  // shares the traced mask_mod
  for (int window : {100, 300, 1000, 100}) {
    fa::Captures cap;
    cap.scalar("window", window);
    for (int64_t len : {256, 1000, 4097}) {
      const fa::BlockMask got = (window == 300 ? copy : factory).build(1, 1, len, len, cap);
      ASSERT_TRUE(got.valid());
      ASSERT_EQ(got.num_q_blocks(), (len + 127) / 128);
      for (int qb = 0; qb < got.num_q_blocks(); ++qb)
        for (int kb = 0; kb < got.num_kv_blocks(); ++kb)
          ASSERT_EQ(got.kind(0, 0, qb, kb), sliding_block(len, window, qb, kb))
              << "window " << window << ", length " << len << ", block " << qb << "," << kb;
    }
  }
  EXPECT_EQ(fa::test::error_of([&] { factory.build(0, 1, 256, 256); }),
            "block mask needs positive sizes, got B=0 H=1 Lq=256 Lkv=256");
}

}  // namespace
