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
    if (!gpu_) {
      fake_ += (bytes + 255) / 256 * 256 + 256;
      return reinterpret_cast<void*>(fake_);
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

TEST_F(ForwardValidation, EmptyBlockMask) {
  expect_rejected(args(), fa::BlockMask(), good(),
                  "block mask is empty; build one with Kernel::block_mask or fa::create_block_mask");
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

}  // namespace
}  // namespace fa_gpu_test
