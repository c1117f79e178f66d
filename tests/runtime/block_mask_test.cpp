#include "fajit/block_mask.h"
#include "fa_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fajit/error.h"
#include "reference_masks.h"

namespace {

using fa::BlockKind;
using fa::BlockMask;

using fa::test::error_of;

using fa::test::expect_tables;

TEST(BlockMask, FromKindsCausal) {
  // Causal, Lq = Lkv = 300, blocks 128: 3x3 tiles, diagonal partial, below full.
  const auto kinds =
      fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; }, 1, 1, 300, 300, 128, 128);
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
  EXPECT_EQ(fa::test::reference_kinds(mask, 1, 1, 256, 130, 128, 128), (std::vector<uint8_t>{2, 2, 1, 1}));
  EXPECT_EQ(fa::test::reference_kinds(mask, 1, 1, 150, 130, 128, 128), (std::vector<uint8_t>{2, 2, 2, 2}));
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
    BlockMask m = BlockMask::from_kv_blocks(bm, hm, len_q, len_kv, num, idx, fnum, fidx, q_block, 128);
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
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1}, {0, 0}, {}, {});
            }),
            "kv_num_blocks: expected 2 entries [Bm=1, Hm=1, 2], got 1");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 1}, {0}, {}, {});
            }),
            "kv_indices: expected 4 entries [Bm=1, Hm=1, 2, 2], got 1");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 3}, {0, 0, 0, 0}, {}, {});
            }),
            "kv_num_blocks: count 3 at (b=0, h=0, q-block=1) is outside [0, 2]");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 1}, {0, 0, 2, 0}, {}, {});
            }),
            "kv_indices: entry 0 at (b=0, h=0, q-block=1) is 2, outside [0, 2)");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kv_blocks(1, 1, 256, 256, {1, 0}, {1, 0, 0, 0}, {1, 0}, {1, 0, 0, 0});
            }),
            "full_kv_indices: block (b=0, h=0, q-block=0, kv-block=1) is listed twice");
}

// What is checked before a device-table mask touches a GPU (its entries are checked where the
// host first needs them: tests/gpu, DeviceTables).
TEST(BlockMask, FromDeviceKvBlocksArgumentErrors) {
  static const int32_t t[4] = {0, 0, 0, 0};
  EXPECT_EQ(error_of([] { BlockMask::from_device_kv_blocks(1, 1, 256, 256, nullptr, t, nullptr, nullptr); }),
            "block mask: kv_num_blocks and kv_indices are required (device tables)");
  EXPECT_EQ(error_of([] { BlockMask::from_device_kv_blocks(1, 1, 256, 256, t, t, t, nullptr); }),
            "block mask: full_kv_num_blocks and full_kv_indices go together (both or neither)");
  EXPECT_EQ(error_of([] { BlockMask::from_device_kv_blocks(1, 1, 256, 0, t, t, nullptr, nullptr); }),
            "block mask: lengths must be positive, got Lq=256, Lkv=0");
  EXPECT_EQ(error_of([] { BlockMask::from_device_kv_blocks(1, 1, 256, 256, t, t, nullptr, nullptr, 100); }),
            "block mask: block sizes must be positive multiples of 16, got 100x128");
}

TEST(BlockMask, FromKindsErrors) {
  EXPECT_EQ(error_of([] {
              BlockMask::from_kinds(1, 1, 256, 256, {0, 1, 2});
            }),
            "block mask: expected 4 block kinds [Bm=1, Hm=1, 2, 2], got 3");
  EXPECT_EQ(error_of([] {
              BlockMask::from_kinds(1, 1, 256, 256, {0, 1, 2, 3});
            }),
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

// The q tables are built on first request (the kv tables too): whatever is asked first, and
// from however many threads, they equal a brute-force transpose of the kinds.
std::vector<uint8_t> random_kinds(std::mt19937& rng, size_t n, int style) {
  std::vector<uint8_t> kinds(n);
  if (style == 0) {
    for (auto& k : kinds) k = uint8_t(rng() % 3);
  } else {  // long runs, as band masks give: run lengths up to 40
    size_t i = 0;
    while (i < n) {
      const uint8_t v = uint8_t(rng() % 3);
      const size_t len = 1 + rng() % 40;
      for (size_t j = 0; j < len && i < n; ++j) kinds[i++] = v;
    }
  }
  return kinds;
}

TEST(BlockMask, LazyTablesMatchBruteForce) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 48; ++trial) {
    const int bm = 1 + trial % 3, hm = 1 + (trial / 3) % 2;
    const int q_block = trial % 4 < 2 ? 128 : 64, kv_block = trial % 2 ? 64 : 128;
    const int len_q = 1 + int(rng() % 3000), len_kv = 1 + int(rng() % 3000);
    const int nq = (len_q + q_block - 1) / q_block, nkv = (len_kv + kv_block - 1) / kv_block;
    const auto kinds = random_kinds(rng, size_t(bm) * hm * nq * nkv, trial % 2);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " B=" << bm << " H=" << hm << " nq=" << nq << " nkv=" << nkv);
    const auto r = fa::test::reference_tables(kinds, bm, hm, nq, nkv);
    BlockMask m = BlockMask::from_kinds(bm, hm, len_q, len_kv, kinds, q_block, kv_block);
    if (trial % 3 == 0) {  // q tables first
      EXPECT_EQ(m.full_q_indices(), r.full_q_idx);
      EXPECT_EQ(m.q_num_blocks(), r.q_num);
    } else if (trial % 3 == 1) {  // kv tables first
      EXPECT_EQ(m.kv_indices(), r.kv_idx);
    }
    expect_tables(m, r);
    EXPECT_EQ(m.kinds(), kinds);
    // The getters return the same tables every time.
    EXPECT_EQ(&m.q_indices(), &m.q_indices());
    EXPECT_EQ(&m.kv_indices(), &m.kv_indices());
  }
}

TEST(BlockMask, LazyTablesConcurrentFirstUse) {
  std::mt19937 rng(5);
  const int bm = 2, hm = 3, nq = 37, nkv = 53;
  const auto kinds = random_kinds(rng, size_t(bm) * hm * nq * nkv, 1);
  const auto r = fa::test::reference_tables(kinds, bm, hm, nq, nkv);
  for (int round = 0; round < 8; ++round) {
    BlockMask m = BlockMask::from_kinds(bm, hm, nq * 64, nkv * 64, kinds, 64, 64);
    std::vector<const std::vector<int32_t>*> q(4), kv(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        if (t % 2) {
          q[t] = &m.q_indices();
          kv[t] = &m.kv_indices();
        } else {
          kv[t] = &m.kv_indices();
          q[t] = &m.q_indices();
        }
      });
    for (auto& th : threads) th.join();
    for (int t = 1; t < 4; ++t) {
      EXPECT_EQ(q[t], q[0]);
      EXPECT_EQ(kv[t], kv[0]);
    }
    expect_tables(m, r);
  }
}

TEST(BlockMask, FromKindsMovesKinds) {
  const auto kinds =
      fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; }, 1, 1, 1000, 1000, 128, 128);
  std::vector<uint8_t> moved = kinds;
  const uint8_t* data = moved.data();
  BlockMask m = BlockMask::from_kinds(1, 1, 1000, 1000, std::move(moved));
  EXPECT_EQ(m.kinds().data(), data);  // no copy
  expect_tables(m, fa::test::reference_tables(kinds, 1, 1, 8, 8));
  // Errors are those of the copying overload, and leave nothing half-built.
  std::vector<uint8_t> bad(100 * 100, 1);
  bad[9999] = 7;
  EXPECT_EQ(error_of([&] { BlockMask::from_kinds(1, 1, 12800, 12800, std::move(bad)); }),
            "block mask: block kind 7 at index 9999 is not 0, 1 or 2");
  std::vector<uint8_t> bad2(100 * 100, 2);
  bad2[4096] = 255;  // first element of a later validation chunk
  EXPECT_EQ(error_of([&] { BlockMask::from_kinds(1, 1, 12800, 12800, bad2); }),
            "block mask: block kind 255 at index 4096 is not 0, 1 or 2");
}

TEST(BlockMask, AllFullTables) {
  BlockMask m = BlockMask::all_full(2, 1, 300, 1000, 64, 128);
  const std::vector<uint8_t> kinds(2 * 5 * 8, 2);
  EXPECT_EQ(m.kinds(), kinds);
  expect_tables(m, fa::test::reference_tables(kinds, 2, 1, 5, 8));
}

TEST(BlockMask, Density) {
  const auto kinds =
      fa::test::reference_kinds([](int, int, int q, int kv) { return kv <= q; }, 1, 1, 512, 512, 128, 128);
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
