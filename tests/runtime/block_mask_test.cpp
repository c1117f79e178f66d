#include "fajit/runtime/block_mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "fajit/error.h"
#include "reference_masks.h"

namespace {

using fa::BlockKind;
using fa::BlockMask;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fa::Error& e) {
    return e.what();
  }
  return "";
}

void expect_tables(const BlockMask& m, const fa::test::ReferenceTables& r) {
  EXPECT_EQ(m.kv_num_blocks(), r.kv_num);
  EXPECT_EQ(m.kv_indices(), r.kv_idx);
  EXPECT_EQ(m.full_kv_num_blocks(), r.full_kv_num);
  EXPECT_EQ(m.full_kv_indices(), r.full_kv_idx);
  EXPECT_EQ(m.q_num_blocks(), r.q_num);
  EXPECT_EQ(m.q_indices(), r.q_idx);
  EXPECT_EQ(m.full_q_num_blocks(), r.full_q_num);
  EXPECT_EQ(m.full_q_indices(), r.full_q_idx);
}

TEST(BlockMask, FromKindsCausal) {
  // Causal, Lq = Lkv = 300, blocks 128: 3x3 tiles, diagonal partial, below full.
  const auto kinds = fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; },
                                               1, 1, 300, 300, 128, 128);
  ASSERT_EQ(kinds, (std::vector<uint8_t>{1, 0, 0, 2, 1, 0, 2, 2, 1}));
  BlockMask m = BlockMask::from_kinds(1, 1, 300, 300, kinds);
  EXPECT_EQ(m.num_q_blocks(), 3);
  EXPECT_EQ(m.num_kv_blocks(), 3);
  EXPECT_EQ(m.kv_num_blocks(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(m.kv_indices(), (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 2, 0, 0}));
  EXPECT_EQ(m.full_kv_num_blocks(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(m.full_kv_indices(), (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 1, 0}));
  EXPECT_EQ(m.q_num_blocks(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(m.q_indices(), (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 2, 0, 0}));
  EXPECT_EQ(m.full_q_num_blocks(), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(m.full_q_indices(), (std::vector<int32_t>{1, 2, 0, 2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(m.kind(0, 0, 2, 0), BlockKind::kFull);
  EXPECT_EQ(m.kind(0, 0, 0, 2), BlockKind::kEmpty);
  expect_tables(m, fa::test::reference_tables(kinds, 1, 1, 3, 3));
}

TEST(BlockMask, TailBlocksIgnoreOutOfRangeElements) {
  // Lkv = 130 with blocks of 128: the tail kv tile holds kv 128..129 only, so "kv < 130" is
  // full there although kv 130..255 would be false. Likewise the q tail of Lq = 150.
  auto mask = [](int, int, int q, int kv) { return kv < 130 && q < 200; };
  EXPECT_EQ(fa::test::reference_kinds(mask, 1, 1, 256, 130, 128, 128),
            (std::vector<uint8_t>{2, 2, 1, 1}));
  EXPECT_EQ(fa::test::reference_kinds(mask, 1, 1, 150, 130, 128, 128),
            (std::vector<uint8_t>{2, 2, 2, 2}));
}

TEST(BlockMask, FromKvBlocksMatchesBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int bm = 1 + trial % 2, hm = 1 + trial % 3, q_block = trial % 2 ? 64 : 128;
    const int len_q = 1 + int(rng() % 1500), len_kv = 1 + int(rng() % 1500);
    const int nq = (len_q + q_block - 1) / q_block, nkv = (len_kv + 127) / 128;
    std::vector<uint8_t> kinds(size_t(bm) * hm * nq * nkv);
    for (auto& k : kinds) k = uint8_t(rng() % 3);
    // Host kv tables in shuffled order with garbage padding.
    const size_t rows = size_t(bm) * hm * nq;
    std::vector<int32_t> num(rows), idx(rows * nkv, 12345), fnum(rows), fidx(rows * nkv, -7);
    for (size_t row = 0; row < rows; ++row) {
      std::vector<int32_t> p, f;
      for (int kb = 0; kb < nkv; ++kb) {
        if (kinds[row * nkv + kb] == 1) p.push_back(kb);
        if (kinds[row * nkv + kb] == 2) f.push_back(kb);
      }
      std::shuffle(p.begin(), p.end(), rng);
      std::shuffle(f.begin(), f.end(), rng);
      num[row] = int32_t(p.size());
      fnum[row] = int32_t(f.size());
      std::copy(p.begin(), p.end(), idx.begin() + row * nkv);
      std::copy(f.begin(), f.end(), fidx.begin() + row * nkv);
    }
    BlockMask m = BlockMask::from_kv_blocks(bm, hm, len_q, len_kv, num, idx, fnum, fidx,
                                            q_block, 128);
    EXPECT_EQ(m.kinds(), kinds);
    expect_tables(m, fa::test::reference_tables(kinds, bm, hm, nq, nkv));
  }
}

TEST(BlockMask, FromKvBlocksWithoutFullTables) {
  BlockMask m = BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 2}, {1, 0, 0, 1}, {}, {});
  EXPECT_EQ(m.kinds(), (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(m.full_kv_num_blocks(), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(m.q_num_blocks(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(m.q_indices(), (std::vector<int32_t>{1, 0, 0, 1}));
}

TEST(BlockMask, FromKvBlocksErrors) {
  EXPECT_EQ(error_of([] { BlockMask::from_kv_blocks(1, 1, 256, 256, {1}, {0, 0}, {}, {}); }),
            "kv_num_blocks: expected 2 entries [Bm=1, Hm=1, 2], got 1");
  EXPECT_EQ(error_of([] { BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 1}, {0}, {}, {}); }),
            "kv_indices: expected 4 entries [Bm=1, Hm=1, 2, 2], got 1");
  EXPECT_EQ(
      error_of([] { BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 3}, {0, 0, 0, 0}, {}, {}); }),
      "kv_num_blocks: count 3 at (b=0, h=0, q-block=1) is outside [0, 2]");
  EXPECT_EQ(
      error_of([] { BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 1}, {0, 0, 2, 0}, {}, {}); }),
      "kv_indices: entry 0 at (b=0, h=0, q-block=1) is 2, outside [0, 2)");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 0}, {1, 0, 0, 0}, {1, 0},
                                        {1, 0, 0, 0});
            }),
            "full_kv_indices: block (b=0, h=0, q-block=0, kv-block=1) is listed twice");
}

TEST(BlockMask, FromKindsErrors) {
  EXPECT_EQ(error_of([] { BlockMask::from_kinds(1, 1, 256, 256, {0, 1, 2}); }),
            "block mask: expected 4 block kinds [Bm=1, Hm=1, 2, 2], got 3");
  EXPECT_EQ(error_of([] { BlockMask::from_kinds(1, 1, 256, 256, {0, 1, 2, 3}); }),
            "block mask: block kind 3 at index 3 is not 0, 1 or 2");
  EXPECT_EQ(error_of([] { BlockMask::from_kinds(1, 1, 0, 256, {}); }),
            "block mask: lengths must be positive, got Lq=0, Lkv=256");
  EXPECT_EQ(error_of([] { BlockMask::from_kinds(0, 1, 1, 256, {}); }),
            "block mask: batch and heads must be positive, got B=0, H=1");
  EXPECT_EQ(error_of([] { BlockMask::from_kinds(1, 1, 1, 1, {2}, 100, 128); }),
            "block mask: block sizes must be positive multiples of 16, got 100x128");
  EXPECT_EQ(error_of([] { BlockMask().batch(); }), "block mask: empty (default-constructed) mask");
  BlockMask m = BlockMask::all_full(1, 2, 10, 10);
  EXPECT_EQ(error_of([&] { m.kind(0, 2, 0, 0); }),
            "block mask: block (b=0, h=2, q-block=0, kv-block=0) is outside [1, 2, 1, 1]");
}

TEST(BlockMask, Density) {
  const auto kinds = fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; },
                                               1, 1, 512, 512, 128, 128);
  BlockMask m = BlockMask::from_kinds(1, 1, 512, 512, kinds);
  fa::BlockMaskDensity d = m.density();
  EXPECT_EQ(d.full, 6);
  EXPECT_EQ(d.partial, 4);
  EXPECT_EQ(d.empty, 6);
  EXPECT_DOUBLE_EQ(d.fraction, 10.0 / 16.0);
  fa::BlockMaskDensity all = BlockMask::all_full(2, 3, 1000, 17, 64, 64).density();
  EXPECT_EQ(all.full, 2 * 3 * 16 * 1);
  EXPECT_DOUBLE_EQ(all.fraction, 1.0);
}

TEST(BlockMask, Rendering) {
  // Sliding window of 200 over causal, blocks of 128, per-head broadcast off (Hm = 2).
  auto mask = [](int, int h, int q, int kv) { return kv <= q && q - kv < 200 + 300 * h; };
  const auto kinds = fa::test::reference_kinds(mask, 1, 2, 512, 512, 128, 128);
  BlockMask m = BlockMask::from_kinds(1, 2, 512, 512, kinds);
  EXPECT_EQ(m.to_string(0, 0),
            "BlockMask(B=1, H=2, Lq=512, Lkv=512, block=128x128, density=0.594: 5 full, 14 "
            "partial, 13 empty) b=0 h=0\n"
            "+...\n"
            "++..\n"
            "+++.\n"
            ".+++\n");
  EXPECT_EQ(m.to_string(0, 1).substr(m.to_string(0, 1).find('\n') + 1),
            "+...\n"
            "#+..\n"
            "##+.\n"
            "+##+\n");
  EXPECT_EQ(error_of([&] { m.to_string(1, 0); }),
            "block mask: block (b=1, h=0, q-block=0, kv-block=0) is outside [1, 2, 4, 4]");
}

TEST(BlockMask, CheckCompatible) {
  BlockMask m = BlockMask::all_full(2, 1, 1024, 1024);
  m.check_compatible(2, 8, 1024, 1024);
  EXPECT_EQ(error_of([&] { m.check_compatible(2, 8, 2048, 1024); }),
            "block mask was built for Lq=1024, Lkv=1024; got Lq=2048, Lkv=1024");
  EXPECT_EQ(error_of([&] { m.check_compatible(4, 8, 1024, 1024); }),
            "block mask was built for B=2; got B=4 (expected 1 or 4)");
  BlockMask h = BlockMask::all_full(1, 4, 1024, 1024);
  h.check_compatible(3, 4, 1024, 1024);
  EXPECT_EQ(error_of([&] { h.check_compatible(1, 8, 1024, 1024); }),
            "block mask was built for H=4; got H=8 (expected 1 or 8)");
}

}  // namespace
