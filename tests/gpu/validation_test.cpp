// Bad arguments to Kernel::forward / Kernel::block_mask are rejected before any launch, with
// the exact messages pinned here. All of these checks run before the driver is touched, so the
// tests run without a GPU too (on fake, aligned device addresses, and the kernel compiled for
// sm_90a). With a GPU the tensors are real, O is poisoned, and after the throw O must still be
// all poison: nothing was launched.
#include <gtest/gtest.h>

#include <memory>
#include <optional>

#include "fajit/runtime/device.h"
#include "gpu_harness.h"

namespace fa_gpu_test {
namespace {

// alibi over a slopes buffer + a sliding window: one buffer and one i32 scalar to get wrong.
const fa::Kernel& kernel() {
  static const fa::Kernel k = [] {
    fa::Options o;  // bf16, head dims 128 / 128
    return fa::compile(fa::mods::alibi(fa::buffer<float>("slopes", 1)), fa::mods::sliding_window(), o);
  }();
  return k;
}

constexpr int kB = 1, kH = 2, kL = 256;

class ForwardValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = fa::rt::cuda_available();
    if (gpu_) guard_.emplace();
    slopes_ = buffer(kH * 4);
    wrong_ = buffer(kH * 4);
  }

  // A device address: real memory with a GPU, a fake 256-byte aligned one without.
  void* buffer(size_t bytes) {
    if (!gpu_) {  // [fake_, fake_ + bytes), then a gap: fake buffers never overlap
      void* p = reinterpret_cast<void*>(fake_);
      fake_ += (bytes + 255) / 256 * 256 + 256;
      return p;
    }
    bufs_.emplace_back(bytes);
    bufs_.back().memset8(0xFF);
    return bufs_.back().as<void>();
  }

  struct Args {
    fa::TensorView q, k, v, o;
    void* o_ptr = nullptr;
    size_t o_bytes = 0;
  };
  Args args(fa::DType t = fa::DType::bf16, int dqk = 128, int dv = 128, int L = kL, int B = kB) {
    Args a;
    a.q = fa::TensorView(buffer(size_t(B) * kH * L * dqk * 2), t, {B, kH, L, dqk});
    a.k = fa::TensorView(buffer(size_t(B) * kH * L * dqk * 2), t, {B, kH, L, dqk});
    a.v = fa::TensorView(buffer(size_t(B) * kH * L * dv * 2), t, {B, kH, L, dv});
    a.o_bytes = size_t(B) * kH * L * dv * 2;
    a.o_ptr = buffer(a.o_bytes);
    a.o = fa::TensorView(a.o_ptr, t, {B, kH, L, dv});
    return a;
  }
  fa::Captures good() const {
    fa::Captures c;
    c.buffer("slopes", fa::TensorView(slopes_, fa::DType::f32, {kH}));
    c.scalar("window", 16);
    return c;
  }
  fa::BlockMask mask(int64_t L = kL) const { return fa::BlockMask::all_full(1, 1, L, L); }

  // forward(...) must throw exactly `message`, and (with a GPU) leave O poisoned.
  void expect_rejected(const Args& a, const fa::BlockMask& m, const fa::Captures& cap,
                       const std::string& message, const fa::ForwardOptions& fo = {}) {
    EXPECT_EQ(error_of([&] { kernel().forward(a.q, a.k, a.v, a.o, m, cap, fo); }), message);
    if (!gpu_) return;
    fa::rt::synchronize(nullptr);
    std::vector<unsigned char> host(a.o_bytes);
    fa::rt::check(
        fa::rt::driver().cuMemcpyDtoH(host.data(), reinterpret_cast<CUdeviceptr>(a.o_ptr), a.o_bytes),
        "cuMemcpyDtoH");
    size_t touched = 0;
    for (unsigned char b : host) touched += b != 0xFF;
    EXPECT_EQ(touched, 0u) << "O was written although forward threw";
  }

  bool gpu_ = false;
  std::optional<fa::rt::ContextGuard> guard_;
  std::vector<fa::rt::DeviceBuffer> bufs_;
  uintptr_t fake_ = uintptr_t(1) << 32;
  void* slopes_ = nullptr;
  void* wrong_ = nullptr;
};

TEST_F(ForwardValidation, GoodArgumentsPackCaptures) {
  // The baseline every other test breaks one thing of.
  std::vector<unsigned char> bytes;
  EXPECT_NO_THROW(bytes = kernel().pack_captures(good()));
  EXPECT_FALSE(bytes.empty());
  ASSERT_EQ(kernel().capture_slots().size(), 2u);
  EXPECT_EQ(kernel().capture_slots()[0].name, "slopes");
  EXPECT_EQ(kernel().capture_slots()[1].name, "window");
}

TEST_F(ForwardValidation, WrongDtype) {
  expect_rejected(args(fa::DType::f16), mask(), good(), "q: the kernel was compiled for bf16, got f16");
}

TEST_F(ForwardValidation, WrongHeadDimQk) {
  expect_rejected(args(fa::DType::bf16, 64, 128), mask(), good(),
                  "q: the kernel was compiled for head_dim_qk=128, got 64");
}

TEST_F(ForwardValidation, WrongHeadDimV) {
  expect_rejected(args(fa::DType::bf16, 128, 64), mask(), good(),
                  "v: the kernel was compiled for head_dim_v=128, got 64");
}

TEST_F(ForwardValidation, BlockMaskForOtherLengths) {
  expect_rejected(args(), mask(1000), good(),
                  "block mask was built for Lq=1000, Lkv=1000; got Lq=256, Lkv=256");
}

TEST_F(ForwardValidation, BlockMaskForOtherBatch) {
  const fa::BlockMask m3 = fa::BlockMask::all_full(3, 1, kL, kL);
  expect_rejected(args(fa::DType::bf16, 128, 128, kL, 2), m3, good(),
                  "block mask was built for B=3; got B=2 (expected 1 or 2)");
}

// The persistent forward's own regrouping (its first block before query 0) is not a mask to pass.
TEST_F(ForwardValidation, LedBlockMask) {
  const fa::BlockMask causal = fa::create_block_mask(fa::mods::causal(), 1, 1, kL, kL);
  expect_rejected(
      args(), causal.regrouped_led(192, 128, 128), good(),
      "block mask: its first block starts before query 0 (BlockMask::regrouped_led); pass the mask "
      "it was regrouped from");
}

TEST_F(ForwardValidation, EmptyBlockMask) {
  expect_rejected(args(), fa::BlockMask(), good(),
                  "block mask is empty; build one with Kernel::block_mask or fa::create_block_mask");
}

// ForwardOptions::max_scores: fp32 [B, Hq, Lq] like the LSE, named in the errors.
TEST_F(ForwardValidation, MaxScoresOfWrongDtypeOrShape) {
  const Args a = args();
  fa::TensorView bf(buffer(kB * kH * kL * 2), fa::DType::bf16, {kB, kH, kL}),
      short_rows(buffer(kB * kH * kL * 4), fa::DType::f32, {kB, kH, kL - 1}),
      flat(buffer(kB * kH * kL * 4), fa::DType::f32, {kB * kH * kL});
  fa::ForwardOptions fo;
  fo.max_scores = &bf;
  expect_rejected(a, mask(), good(), "max_scores: dtype must be f32, got bf16", fo);
  fo.max_scores = &short_rows;
  expect_rejected(a, mask(), good(), "max_scores: Lq must match q (256), got 255", fo);
  fo.max_scores = &flat;
  expect_rejected(a, mask(), good(), "max_scores: expected 3 dimensions [B, Hq, Lq], got 1", fo);
  const fa::TensorView in_o(a.o_ptr, fa::DType::f32, {kB, kH, kL});  // inside O's bytes
  fo.max_scores = &in_o;
  expect_rejected(a, mask(), good(), "max_scores: its memory overlaps that of o; give it a buffer of its own",
                  fo);
}

// Outputs that share memory with what the call reads, or with each other, are refused: the
// kernels would read values already overwritten (by themselves or another CTA).
TEST_F(ForwardValidation, OutputsSharingMemory) {
  const Args a = args();
  Args o_on_k = a;
  o_on_k.o = a.k;
  expect_rejected(o_on_k, mask(), good(), "o: its memory overlaps that of k; give it a buffer of its own");
  fa::Captures in_o = good();
  in_o.buffer("slopes", fa::TensorView(a.o_ptr, fa::DType::f32, {kH}));
  expect_rejected(a, mask(), in_o,
                  "o: its memory overlaps that of capture 'slopes'; give it a buffer of its own");
  const fa::TensorView lse_in_q(a.q.data, fa::DType::f32, {kB, kH, kL});
  fa::ForwardOptions fo;
  fo.lse = &lse_in_q;
  expect_rejected(a, mask(), good(), "lse: its memory overlaps that of q; give it a buffer of its own", fo);
  const fa::TensorView lse(buffer(kB * kH * kL * 4), fa::DType::f32, {kB, kH, kL});
  fo.lse = &lse;
  fo.max_scores = &lse;
  expect_rejected(a, mask(), good(),
                  "max_scores: its memory overlaps that of lse; give it a buffer of its own", fo);
}

TEST_F(ForwardValidation, MissingCapture) {
  fa::Captures c;
  c.scalar("window", 16);
  expect_rejected(args(), mask(), c, "missing capture 'slopes' (a f32 buffer of rank 1)");
}

TEST_F(ForwardValidation, CaptureOfWrongDtype) {
  fa::Captures c = good();
  c.buffer("slopes", fa::TensorView(wrong_, fa::DType::i32, {kH}));
  expect_rejected(args(), mask(), c, "capture 'slopes' must be a f32 buffer, got i32");
}

TEST_F(ForwardValidation, CaptureOfWrongRank) {
  fa::Captures c = good();
  c.buffer("slopes", fa::TensorView(slopes_, fa::DType::f32, {1, kH}));
  expect_rejected(args(), mask(), c, "capture 'slopes' must have rank 1, got 2");
}

TEST_F(ForwardValidation, CaptureWithNullData) {
  fa::Captures c = good();
  c.buffer("slopes", fa::TensorView(static_cast<void*>(nullptr), fa::DType::f32, {kH}));
  expect_rejected(args(), mask(), c, "capture 'slopes' has a null data pointer");
}

TEST_F(ForwardValidation, UnknownCaptureName) {
  fa::Captures c = good();
  c.buffer("slope", fa::TensorView(slopes_, fa::DType::f32, {kH}));
  expect_rejected(args(), mask(), c, "unknown buffer capture 'slope'; the mods capture: slopes, window");
}

TEST_F(ForwardValidation, UnknownScalarName) {
  fa::Captures c = good();
  c.scalar("windw", 16);
  expect_rejected(args(), mask(), c, "unknown scalar 'windw'; the mods capture: slopes, window");
}

TEST_F(ForwardValidation, MissingScalar) {
  fa::Captures c;
  c.buffer("slopes", fa::TensorView(slopes_, fa::DType::f32, {kH}));
  expect_rejected(args(), mask(), c, "missing scalar 'window' (i32)");
}

TEST_F(ForwardValidation, FloatValueForI32Scalar) {
  fa::Captures c = good();
  c.scalar("window", 16.0f);
  expect_rejected(args(), mask(), c, "scalar 'window' must be i32, got f32");
}

TEST_F(ForwardValidation, NegativeScale) {
  fa::ForwardOptions fo;
  fo.scale = -1.0f;
  expect_rejected(args(), mask(), good(), "scale must be positive and finite, got -1", fo);
}

TEST_F(ForwardValidation, DecodePathOnALongQuery) {
  fa::ForwardOptions fo;
  fo.path = fa::ForwardPath::kDecode;
  expect_rejected(args(), mask(), good(),
                  "path kDecode: the decoding kernel takes len_q <= 64 within one block row (len_q <= the "
                  "mask's q_block 128), got len_q=256",
                  fo);
}

TEST_F(ForwardValidation, NegativeDecodeSplits) {
  fa::ForwardOptions fo;
  fo.decode_splits = -1;
  expect_rejected(args(), mask(), good(), "decode_splits must be >= 0, got -1", fo);
}

// Kernel::block_mask checks the captures before the driver too.
TEST_F(ForwardValidation, BlockMaskMissingScalar) {
  fa::Captures c;
  c.buffer("slopes", fa::TensorView(slopes_, fa::DType::f32, {kH}));
  EXPECT_EQ(error_of([&] { kernel().block_mask(kB, kH, kL, kL, c); }), "missing scalar 'window' (i32)");
}

TEST_F(ForwardValidation, BlockMaskFloatForI32Scalar) {
  fa::Captures c = good();
  c.scalar("window", 2.5);
  EXPECT_EQ(error_of([&] { kernel().block_mask(kB, kH, kL, kL, c); }),
            "scalar 'window' must be i32, got f32");
}

// ---- ragged and paged layouts (fa::Sequences): shapes and tables before any launch --------
class SequencesValidation : public ForwardValidation {
 protected:
  // Packed q/o [total_q, H, 128], packed or paged k/v; tables of `batch` sequences.
  fa::TensorView table(std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    void* p = buffer(n * 4);
    return shape.size() == 1 ? fa::TensorView(p, fa::DType::i32, {shape[0]})
                             : fa::TensorView(p, fa::DType::i32, {shape[0], shape[1]});
  }
  fa::TensorView packed(int64_t rows, int d = 128) {
    return fa::TensorView(buffer(size_t(rows) * kH * d * 2), fa::DType::bf16, {rows, kH, d});
  }
  fa::TensorView pool(int64_t pages, int64_t page_size) {
    return fa::TensorView(buffer(size_t(pages * page_size) * kH * 128 * 2), fa::DType::bf16,
                          {pages, page_size, kH, 128});
  }
  // forward on packed q/o with these k, v and options must throw exactly `message`
  void expect(const fa::TensorView& k, const fa::TensorView& v, fa::ForwardOptions fo,
              const std::string& message, int64_t total_q = 300, int64_t mask_q = 128, int64_t mask_kv = 256,
              int mask_b = 1) {
    const fa::TensorView q = packed(total_q), o = packed(total_q);
    const fa::BlockMask m = fa::BlockMask::all_full(mask_b, 1, mask_q, mask_kv);
    EXPECT_EQ(error_of([&] { kernel().forward(q, k, v, o, m, good(), fo); }), message);
  }
};

TEST_F(SequencesValidation, TablesDisagreeOnTheBatch) {
  fa::TensorView cq = table({5}), ck = table({4});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo,
         "cu_seqlens_k: expected 5 entries (B+1, B = 4 from cu_seqlens_q), got 4");
}

TEST_F(SequencesValidation, MaxSeqlenQRequired) {
  fa::TensorView cq = table({3}), ck = table({3});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo, "max_seqlen_q must be positive with cu_seqlens_q, got 0");
}

TEST_F(SequencesValidation, TableOfWrongDtype) {
  fa::TensorView cq(buffer(12), fa::DType::f32, {3});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  expect(packed(500), packed(500), fo, "cu_seqlens_q: dtype must be i32, got f32");
}

TEST_F(SequencesValidation, PackedQueriesNeedThreeDimensions) {
  fa::TensorView cq = table({2}), ck = table({2});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  const Args d = args();  // dense [1, H, 256, 128] q, o
  EXPECT_EQ(error_of([&] { kernel().forward(d.q, packed(256), packed(256), d.o, mask(), good(), fo); }),
            "q: a packed tensor has 3 dimensions [total, H, D], got 4");
}

// The per-row outputs (lse, max_scores) of packed queries are [Hq, total_q].
TEST_F(SequencesValidation, PackedRowOutputsShape) {
  for (auto [name, field] :
       {std::pair{"lse", &fa::ForwardOptions::lse}, {"max_scores", &fa::ForwardOptions::max_scores}}) {
    fa::TensorView cq = table({3}), ck = table({3});
    fa::TensorView rows(buffer(300 * kH * 4), fa::DType::f32, {300, kH});  // transposed
    fa::ForwardOptions fo;
    fo.*field = &rows;
    fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
    fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
    expect(packed(500), packed(500), fo,
           std::string(name) + ": expected [Hq, total_q] = [2, 300], got [300, 2]");
  }
}

TEST_F(SequencesValidation, LseSharingMemoryWithATable) {
  fa::TensorView lse(buffer(300 * kH * 4), fa::DType::f32, {kH, 300});
  fa::TensorView cq(lse.data, fa::DType::i32, {3}), ck = table({3});  // cq: lse's first bytes
  fa::ForwardOptions fo;
  fo.lse = &lse;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo,
         "lse: its memory overlaps that of cu_seqlens_q; give it a buffer of its own");
}

TEST_F(SequencesValidation, PackedLseMustBeContiguousAlongTotal) {
  // [Hq, total_q] with a transposed stride: only caught by its own check when max_seqlen_q is 1
  fa::TensorView cq = table({3}), ck = table({3});
  fa::TensorView lse(buffer(300 * kH * 4), fa::DType::f32, {kH, 300}, {1, kH});
  fa::ForwardOptions fo;
  fo.lse = &lse;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 1;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo, "lse: total_q must be contiguous (stride 1), got stride 2", 300, 1);
}

TEST_F(SequencesValidation, PackedRowStrideKeeps16ByteRows) {
  fa::TensorView cq = table({3}), ck = table({3});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  const fa::TensorView k(buffer(500 * 300 * 2), fa::DType::bf16, {500, 1, 128}, {300, 300, 1});
  expect(k, packed(500), fo, "k: stride of total must be a multiple of 8 elements (16 bytes), got 300");
}

TEST_F(SequencesValidation, MaxSeqlenWithoutItsTable) {
  fa::TensorView n = table({1});
  fa::ForwardOptions fo;
  fo.sequences.seqlens_k = &n, fo.sequences.max_seqlen_q = 64;
  const Args a = args();
  EXPECT_EQ(error_of([&] { kernel().forward(a.q, a.k, a.v, a.o, mask(), good(), fo); }),
            "max_seqlen_q (64) is for packed queries: give cu_seqlens_q, or leave it 0");
  fa::ForwardOptions none;
  none.sequences.max_seqlen_k = 64;
  EXPECT_EQ(error_of([&] { kernel().forward(a.q, a.k, a.v, a.o, mask(), good(), none); }),
            "sequences: max_seqlen_q / max_seqlen_k / check_tables given without a table (cu_seqlens_q, "
            "cu_seqlens_k, seqlens_k or page_table)");
}

TEST_F(SequencesValidation, GridLimitOnBatchTimesHeads) {
  // 40000 sequences x 2 heads: more CTAs along y than a grid holds
  fa::TensorView cq = table({40001}), ck = table({40001});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo,
         "B x Hq = 40000 x 2 = 80000 exceeds the 65535 the kernels' grid takes; split the batch");
}

TEST_F(SequencesValidation, PackedAndPagedKeys) {
  fa::TensorView cq = table({3}), ck = table({3}), pt = table({2, 4}), n = table({2});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.page_table = &pt, fo.sequences.seqlens_k = &n;
  fo.sequences.max_seqlen_k = 256;
  expect(pool(8, 64), pool(8, 64), fo,
         "cu_seqlens_k and page_table: keys are either packed or paged, give one");
}

TEST_F(SequencesValidation, PageTableNeedsSeqlensK) {
  fa::TensorView cq = table({3}), pt = table({2, 4});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.page_table = &pt, fo.sequences.max_seqlen_k = 256;
  expect(pool(8, 64), pool(8, 64), fo, "page_table needs seqlens_k (each sequence's key count)");
}

TEST_F(SequencesValidation, MismatchedPageSizes) {
  fa::TensorView cq = table({3}), pt = table({2, 4}), n = table({2});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.page_table = &pt, fo.sequences.seqlens_k = &n, fo.sequences.max_seqlen_k = 256;
  expect(pool(16, 32), pool(8, 64), fo, "v: num_pages must match k (16), got 8");
  expect(pool(8, 32), pool(8, 64), fo, "v: page_size must match k (32), got 64");
}

TEST_F(SequencesValidation, MaxSeqlenKBeyondThePageTable) {
  fa::TensorView cq = table({3}), pt = table({2, 4}), n = table({2});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 128;
  fo.sequences.page_table = &pt, fo.sequences.seqlens_k = &n, fo.sequences.max_seqlen_k = 300;
  expect(pool(8, 64), pool(8, 64), fo,
         "max_seqlen_k (300) exceeds the page table's capacity (4 pages of 64 keys)", 300, 128, 300);
}

TEST_F(SequencesValidation, BlockMaskForTheLongestSequence) {
  fa::TensorView cq = table({3}), ck = table({3});
  fa::ForwardOptions fo;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 100;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  // the mask must be for [B or 1, H, max_seqlen_q, max_seqlen_k]: here for 128 queries
  const std::string e = error_of([&] {
    kernel().forward(packed(300), packed(500), packed(500), packed(300),
                     fa::BlockMask::all_full(1, 1, 128, 256), good(), fo);
  });
  EXPECT_NE(e.find("128"), std::string::npos) << e;
  EXPECT_NE(e.find("100"), std::string::npos) << e;
}

// With check_tables the contents are checked too (needs the tables on a device).
TEST_F(SequencesValidation, CheckedTables) {
  if (!gpu_) GTEST_SKIP() << "table contents need a GPU";
  auto with = [&](fa::TensorView t, std::vector<int32_t> host) {
    fa::rt::check(
        fa::rt::driver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(t.data), host.data(), host.size() * 4),
        "cuMemcpyHtoD");
    return t;
  };
  fa::TensorView cq = with(table({3}), {0, 200, 150}), ck = with(table({3}), {0, 256, 500});
  fa::ForwardOptions fo;
  fo.sequences.check_tables = true;
  fo.sequences.cu_seqlens_q = &cq, fo.sequences.max_seqlen_q = 200;
  fo.sequences.cu_seqlens_k = &ck, fo.sequences.max_seqlen_k = 256;
  expect(packed(500), packed(500), fo, "cu_seqlens_q: offsets must not decrease, got 200 then 150 at 2", 300,
         200, 256);
  cq = with(table({3}), {0, 200, 301});
  fo.sequences.cu_seqlens_q = &cq;
  expect(packed(500), packed(500), fo, "cu_seqlens_q: last offset 301 is past the end of q (300 rows)", 300,
         200, 256);
  cq = with(table({3}), {0, 50, 300});
  fo.sequences.cu_seqlens_q = &cq;
  expect(packed(500), packed(500), fo, "cu_seqlens_q: sequence 1 has 250 rows, more than max_seqlen_q (200)",
         300, 200, 256);
  // paged: a page past the pool
  fa::TensorView pt = with(table({2, 4}), {0, 1, 2, -1, 3, 9, -1, -1}), n = with(table({2}), {150, 100});
  fa::ForwardOptions fp;
  fp.sequences.check_tables = true;
  fp.sequences.cu_seqlens_q = &cq, fp.sequences.max_seqlen_q = 200;
  fp.sequences.page_table = &pt, fp.sequences.seqlens_k = &n, fp.sequences.max_seqlen_k = 256;
  cq = with(table({3}), {0, 100, 300});
  expect(pool(8, 64), pool(8, 64), fp, "page_table: entry [1][1] = 9 is outside the pool's 8 pages", 300, 200,
         256);
}

}  // namespace
}  // namespace fa_gpu_test
