// Out of device memory (issue 13's runtime faults): with the GPU's memory taken by a hog, the
// calls that allocate — a block mask's tables (uploaded by the first forward that uses them, or built
// on the GPU), the backward's fp32 scratch, the decoding kernel's partial results — throw fa::Error
// naming the allocation; nothing leaks
// (a second hog gets as much memory as the first); and once the hog is gone the same calls
// give the same bits as before it.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fajit/error.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"
#include "fajit/runtime/device.h"
#include "fajit/runtime/driver.h"
#include "fajit/runtime/memory.h"

namespace {

// Takes device memory in blocks of 1 GiB, then 64 MiB, 1 MiB, 64 KiB, 4 KiB and 256 bytes
// until cuMemAlloc fails: small allocations are carved from the driver's 2 MiB pages, so a hog
// of whole MiBs left the block mask's few hundred bytes of tables room to fit. Then the same
// from fajit's stream-ordered pool, whose chunks a live mask built on the device (an earlier
// test's) keeps partly in use, so their free part stays there, out of cuMemAlloc's reach.
// bytes() is how much it got.
class Hog {
 public:
  Hog() {
    for (size_t block : kBlocks)
      for (;;) {
        try {
          bufs_.emplace_back(block, "the test's memory hog");
          bytes_ += block;
        } catch (const fa::Error&) {
          break;
        }
      }
    for (size_t block : kBlocks)
      for (;;) {
        try {
          pooled_.emplace_back(block, nullptr, "the test's memory hog");
          bytes_ += block;
        } catch (const fa::Error&) {
          break;
        }
      }
  }
  ~Hog() {
    pooled_.clear();  // freed on the default stream
    fa::rt::synchronize(nullptr);
  }
  size_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kBlocks[] = {size_t(1) << 30,  size_t(64) << 20, size_t(1) << 20,
                                       size_t(64) << 10, size_t(4) << 10,  size_t(256)};
  std::vector<fa::rt::DeviceBuffer> bufs_;
  std::vector<fa::rt::StreamBuffer> pooled_;
  size_t bytes_ = 0;
};

struct Buffers {
  static constexpr int kB = 1, kH = 2, kL = 1000, kD = 64;
  static constexpr size_t kElems = size_t(kB) * kH * kL * kD;
  fa::rt::DeviceBuffer q{kElems * 2}, k{kElems * 2}, v{kElems * 2}, o{kElems * 2}, dout{kElems * 2},
      dq{kElems * 2}, dk{kElems * 2}, dv{kElems * 2}, lse{size_t(kB) * kH * kL * 4};
  Buffers() {
    std::vector<uint16_t> bits(kElems);
    for (size_t i = 0; i < kElems; ++i)
      bits[i] = uint16_t(0x3c00 + (i * 2654435761u >> 20) % 0x300);  // bf16 in [2^-7, 2^-1)
    for (fa::rt::DeviceBuffer* b : {&q, &k, &v, &dout}) b->upload(bits.data(), kElems * 2);
  }
  fa::TensorView t(fa::rt::DeviceBuffer& b) {
    return fa::TensorView(b.as<void>(), fa::DType::bf16, {kB, kH, kL, kD});
  }
  fa::TensorView tl() { return fa::TensorView(lse.as<void>(), fa::DType::f32, {kB, kH, kL}); }
  std::vector<uint16_t> bits(const fa::rt::DeviceBuffer& b) const {
    std::vector<uint16_t> x(kElems);
    b.download(x.data(), kElems * 2);
    return x;
  }
};

TEST(Faults, OutOfDeviceMemoryIsAClearErrorAndTheProcessKeepsWorking) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  fa::Options opts;
  opts.head_dim_qk = opts.head_dim_v = Buffers::kD;
  const fa::Kernel kern = fa::compile(fa::mods::softcap(), fa::mods::causal(), opts);
  kern.warm({.backward = true, .deterministic = true, .decode = true});  // no compile under the hog
  fa::rt::ContextGuard guard;
  Buffers b;
  const int B = Buffers::kB, H = Buffers::kH, L = Buffers::kL;
  fa::Captures cap;
  cap.scalar("softcap", 20.0f);
  fa::BackwardOptions bo;
  bo.deterministic = true;  // bit-identical gradients, to compare with after the hog
  fa::ForwardOptions fo;
  const fa::TensorView lse = b.tl();
  fo.lse = &lse;
  auto run = [&](const fa::BlockMask& mask) {
    kern.forward(b.t(b.q), b.t(b.k), b.t(b.v), b.t(b.o), mask, cap, fo);
    kern.backward(b.t(b.q), b.t(b.k), b.t(b.v), b.t(b.o), lse, b.t(b.dout), b.t(b.dq), b.t(b.dk), b.t(b.dv),
                  mask, cap, bo);
    fa::rt::synchronize(nullptr);
    return std::vector<std::vector<uint16_t>>{b.bits(b.o), b.bits(b.dq), b.bits(b.dk), b.bits(b.dv)};
  };
  const fa::BlockMask mask = kern.block_mask(B, H, L, L, cap), mask1 = kern.block_mask(B, H, 1, L, cap);
  // A mask the GPU builds, tables and all (documents of 100 tokens: the symbolic analysis leaves
  // its tiles to the GPU), its builder compiled before the hog.
  const fa::BlockMaskFactory documents(fa::mods::document(), opts);
  std::vector<int32_t> ids(L);
  for (int i = 0; i < L; ++i) ids[size_t(i)] = i / 100;
  fa::rt::DeviceBuffer d_ids(ids.size() * sizeof(int32_t));
  d_ids.upload(ids.data(), ids.size() * sizeof(int32_t));
  fa::Captures dcap;
  dcap.buffer("doc_ids", fa::TensorView(d_ids.as<void>(), fa::DType::i32, {L}));
  ASSERT_TRUE(documents.build(B, H, L, L, dcap).built_on_device());
  const auto before = run(mask);
  // One query row through the decoding kernel, once before the hog so mask1's tables are on
  // the device: under the hog only the decoder's own scratch is left to allocate.
  fa::ForwardOptions dec = fo;
  dec.path = fa::ForwardPath::kDecode;
  const fa::TensorView q1(b.q.as<void>(), fa::DType::bf16, {B, H, 1, Buffers::kD}),
      o1(b.o.as<void>(), fa::DType::bf16, {B, H, 1, Buffers::kD});
  const fa::TensorView l1(b.lse.as<void>(), fa::DType::f32, {B, H, 1});
  dec.lse = &l1;
  kern.forward(q1, b.t(b.k), b.t(b.v), o1, mask1, cap, dec);
  fa::rt::synchronize(nullptr);  // the stream-ordered pool gives its memory back here

  size_t first = 0;
  {
    Hog hog;
    first = hog.bytes();
    ASSERT_GT(first, size_t(1) << 30);
    auto expect_oom = [](const std::string& what, const std::function<void()>& call) {
      try {
        call();
        ADD_FAILURE() << "no out-of-memory error for " << what;
      } catch (const fa::Error& e) {
        EXPECT_EQ(e.code(), fa::ErrorCode::kCuda) << e.what();
        EXPECT_NE(std::string(e.what()).find("cannot allocate"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      }
    };
    expect_oom("the block mask's tables", [&] {  // uploaded on the first forward that uses them
      const fa::BlockMask fresh = kern.block_mask(B, H, L, L, cap);
      kern.forward(b.t(b.q), b.t(b.k), b.t(b.v), b.t(b.o), fresh, cap, fo);
    });
    expect_oom("the block mask's kinds and tables", [&] { (void)documents.build(B, H, L, L, dcap); });
    expect_oom("the backward's fp32 scratch", [&] {
      kern.backward(b.t(b.q), b.t(b.k), b.t(b.v), b.t(b.o), lse, b.t(b.dout), b.t(b.dq), b.t(b.dk), b.t(b.dv),
                    mask, cap, bo);
    });
    expect_oom("the decoding kernel's", [&] { kern.forward(q1, b.t(b.k), b.t(b.v), o1, mask1, cap, dec); });
    fa::rt::synchronize(nullptr);
  }
  // Nothing leaked: a second hog gets what the first did (give or take the driver's own 64 MiB).
  {
    Hog again;
    EXPECT_GE(again.bytes() + (size_t(64) << 20), first);
  }
  const fa::BlockMask rebuilt = kern.block_mask(B, H, L, L, cap);
  EXPECT_EQ(rebuilt.kv_num_blocks(), mask.kv_num_blocks());
  const auto after = run(rebuilt);
  EXPECT_TRUE(after == before) << "out, dQ, dK or dV differ after the out-of-memory errors";
}

}  // namespace
