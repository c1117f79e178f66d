// Kernel::block_mask (built on the GPU by a kernel generated from the mask_mod) against
// fa::brute_force_block_classes (the interpreter on every element), at odd lengths, with the
// B/H broadcast: a mask that ignores b (h) gives batch() == 1 (heads() == 1).
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu_harness.h"

namespace fa_gpu_test {
namespace {

struct MaskCase {
  std::string variant;
  int B, H, Lq, Lkv;
  int param = -1;
  int q_block = 128, kv_block = 128;

  std::string name() const {
    std::string n = variant + "_b" + std::to_string(B) + "h" + std::to_string(H) + "_" + std::to_string(Lq) +
                    "x" + std::to_string(Lkv);
    if (param >= 0) n += "_p" + std::to_string(param);
    if (q_block != 128 || kv_block != 128)
      n += "_blk" + std::to_string(q_block) + "x" + std::to_string(kv_block);
    return n;
  }
};

// gtest prints a case by its name (ctest shows it beside the test name).
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name(); }

const std::vector<MaskCase>& mask_cases() {
  static const std::vector<MaskCase> all = {
      {"causal", 2, 4, 1000, 1000},
      {"causal", 1, 1, 17, 4097},
      {"causal", 3, 2, 4097, 1000},
      {"causal", 1, 1, 1, 1},
      {"sliding", 1, 3, 4097, 4097, 300},
      {"sliding", 2, 1, 1000, 17, 0},
      {"sliding", 1, 1, 1000, 1000, 100, 256, 64},
      {"document_softcap", 1, 2, 4097, 4097, 500},  // rank-1 doc ids
      {"document2d_causal", 3, 2, 1000, 1000},      // b-dependent doc ids
      {"document2d_causal", 2, 1, 4097, 4097, 700},
      {"document2d_causal", 4, 1, 17, 1000, 5},
      {"prefix_lm", 1, 1, 1000, 1000, 300},
      {"prefix_lm", 2, 2, 17, 1000, 129},
      {"prefix_lm", 1, 1, 4097, 4097, 4000},
      {"head_sliding", 2, 4, 1000, 1000},  // h-dependent
      {"padding", 1, 1, 1000, 1000, 333},
      {"dilated", 1, 1, 1000, 4097, 200},
      {"none", 2, 2, 1000, 17},
  };
  return all;
}

class BlockMaskTest : public ::testing::TestWithParam<MaskCase> {};

TEST_P(BlockMaskTest, MatchesBruteForce) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const MaskCase& c = GetParam();
  const Variant& var = variant(c.variant);
  fa::Options o;
  o.head_dim_qk = o.head_dim_v = 64;
  const fa::Kernel k = fa::compile(var.score(), var.mask(), o);
  CaptureSet caps;
  std::mt19937 rng(static_cast<uint32_t>(fnv1a(c.name())));
  var.fill(caps, Dims{c.B, c.H, c.Lq, c.Lkv}, c.param, rng);
  caps.upload();
  fa::BlockMaskOptions bo;
  bo.q_block = c.q_block, bo.kv_block = c.kv_block;
  const fa::BlockMask m = k.block_mask(c.B, c.H, c.Lq, c.Lkv, caps.captures(), bo);

  ASSERT_TRUE(m.valid());
  EXPECT_EQ(m.batch(), var.mask_batch ? c.B : 1);
  EXPECT_EQ(m.heads(), var.mask_heads ? c.H : 1);
  EXPECT_EQ(m.len_q(), c.Lq);
  EXPECT_EQ(m.len_kv(), c.Lkv);
  EXPECT_EQ(m.q_block(), c.q_block);
  EXPECT_EQ(m.kv_block(), c.kv_block);
  EXPECT_NO_THROW(m.check_compatible(c.B, c.H, c.Lq, c.Lkv));

  const ModPrograms progs = mod_programs(k.program());
  const std::vector<uint8_t> want = fa::brute_force_block_classes(
      progs.mask, caps.bindings(), m.batch(), m.heads(), c.Lq, c.Lkv, c.q_block, c.kv_block);
  ASSERT_EQ(m.kinds().size(), want.size());
  size_t bad = 0, first = want.size();
  for (size_t i = 0; i < want.size(); ++i)
    if (m.kinds()[i] != want[i]) ++bad, first = std::min(first, i);
  EXPECT_EQ(bad, 0u) << "first mismatch at flat tile " << first << ": got " << int(m.kinds()[first])
                     << ", want " << int(want[first]) << "\n"
                     << m.to_string();

  // Every table, not only the classes.
  const fa::BlockMask ref =
      fa::BlockMask::from_kinds(m.batch(), m.heads(), c.Lq, c.Lkv, want, c.q_block, c.kv_block);
  EXPECT_EQ(m.kv_num_blocks(), ref.kv_num_blocks());
  EXPECT_EQ(m.kv_indices(), ref.kv_indices());
  EXPECT_EQ(m.full_kv_num_blocks(), ref.full_kv_num_blocks());
  EXPECT_EQ(m.full_kv_indices(), ref.full_kv_indices());
  EXPECT_EQ(m.q_num_blocks(), ref.q_num_blocks());
  EXPECT_EQ(m.q_indices(), ref.q_indices());
  EXPECT_EQ(m.full_q_num_blocks(), ref.full_q_num_blocks());
  EXPECT_EQ(m.full_q_indices(), ref.full_q_indices());
  const fa::BlockMaskDensity d = m.density();
  std::printf("[ mask     ] Bm=%d Hm=%d %dx%d tiles: %lld full, %lld partial, %lld empty\n", m.batch(),
              m.heads(), m.num_q_blocks(), m.num_kv_blocks(), (long long)d.full, (long long)d.partial,
              (long long)d.empty);
}

INSTANTIATE_TEST_SUITE_P(Cases, BlockMaskTest, ::testing::ValuesIn(mask_cases()),
                         [](const ::testing::TestParamInfo<MaskCase>& i) { return i.param.name(); });

// fa::create_block_mask (the builder alone) agrees with Kernel::block_mask.
TEST(BlockMaskStandalone, CreateBlockMaskMatchesKernel) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const Variant& var = variant("sliding");
  fa::Options o;
  o.head_dim_qk = o.head_dim_v = 64;
  CaptureSet caps;
  caps.scalar_i32("window", 257);
  const fa::BlockMask a = fa::create_block_mask(var.mask(), 2, 2, 1000, 4097, caps.captures(), {}, o);
  const fa::Kernel k = fa::compile(var.score(), var.mask(), o);
  const fa::BlockMask b = k.block_mask(2, 2, 1000, 4097, caps.captures());
  EXPECT_EQ(a.batch(), 1);
  EXPECT_EQ(a.heads(), 1);
  EXPECT_EQ(a.kinds(), b.kinds());
  EXPECT_EQ(a.kv_indices(), b.kv_indices());
}

// fa::BlockMaskFactory, one per mask_mod, builds a new document packing each call (the GPU
// builder, compiled once) as Kernel::block_mask builds it.
TEST(BlockMaskStandalone, FactoryBuildsEachPackingAsTheKernelDoes) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const Variant& var = variant("document2d_causal");
  const fa::BlockMaskFactory factory(var.mask());
  const fa::Kernel k = fa::compile(var.score(), var.mask());
  std::mt19937 rng(48);
  const Dims d{3, 2, 1000, 1000};
  for (int step = 0; step < 3; ++step) {
    CaptureSet caps;
    var.fill(caps, d, 64 + 200 * step, rng);
    caps.upload();
    const fa::BlockMask a = factory.build(d.B, d.H, d.Lq, d.Lkv, caps.captures());
    const fa::BlockMask b = k.block_mask(d.B, d.H, d.Lq, d.Lkv, caps.captures());
    EXPECT_EQ(a.batch(), d.B);
    EXPECT_EQ(a.kinds(), b.kinds()) << "packing " << step;
    EXPECT_EQ(a.kv_indices(), b.kv_indices()) << "packing " << step;
  }
}

}  // namespace
}  // namespace fa_gpu_test
