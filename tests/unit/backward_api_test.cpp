// fa::Kernel::backward's compile-side contract, without a GPU: the backward kernels are generated
// and NVRTC-compiled on demand with the host's backward tile, with the score_mod's derivative
// from fa-differentiate; a score_mod without one is refused naming the op; bad tensors are rejected before
// anything touches the driver, with the argument named (fake, aligned device addresses; nothing is launched).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fa_test_util.h"
#include "fajit/error.h"
#include "fajit/frontend.h"
#include "fajit/jit/cache.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"

namespace {

using fa::test::error_of;

fa::Options opts(int dqk, int dv) {
  fa::Options o;
  o.head_dim_qk = dqk, o.head_dim_v = dv, o.arch = "sm_90a";
  return o;
}

TEST(BackwardApi, GeneratesAndCompilesTheBackwardKernels) {
  fa::Options o = opts(128, 64);
  o.arch = "sm_80";  // the mma.sync backward (sm_90a takes the Hopper one: the next test)
  const fa::Kernel k = fa::compile(fa::identity_score(), fa::mods::causal(), o);
  const fa::KernelSpec& s = k.backward_spec();
  EXPECT_EQ(s.kind, fa::KernelKind::kBackward);
  EXPECT_EQ(s.tile, fa::default_tile(128, 64, false, fa::KernelFamily::kMmaSync, fa::KernelKind::kBackward));
  EXPECT_EQ(s.to_string(), "backward bf16 qk128 v64 mma tile64x128w8s2 sm_80");
  const std::string& src = k.backward_cuda_source();
  EXPECT_NE(src.find("using FaBwdCfg = fa::BwdConfig<fa::bf16_t, 128, 64, 64, 8, 2, false>;"),
            std::string::npos)
      << src;
  EXPECT_NE(src.find("FAJIT_DEFINE_BACKWARD(fajit_bwd, FaBwdCfg, FaMods)"), std::string::npos);
  EXPECT_NE(src.find("static constexpr bool kScoreGrad = false;"), std::string::npos);
  // The forward is untouched by asking for the backward.
  EXPECT_EQ(k.spec().kind, fa::KernelKind::kForward);
}

// Which backward: the Hopper (wgmma) kernel on sm_90a, with the tile default_tile gives it
// (block_m 64 above 64 or with a score_mod, 128 up to 64 / 64 without one; 64 x 64 above 128);
// the mma.sync kernel on other archs and when the forward is mma.sync, there above a QK head
// dim of 192 the deterministic kernels even when not asked for.
TEST(BackwardApi, PicksTheHopperKernelWhereItApplies) {
  struct Want {
    int dqk, dv;
    bool score_mod;
    std::string arch;
    fa::KernelFamily forward;
    std::string spec;
  };
  const fa::KernelFamily kAuto = fa::KernelFamily::kAuto, kMma = fa::KernelFamily::kMmaSync;
  for (const Want& w : std::vector<Want>{
           {128, 128, false, "sm_90a", kAuto, "backward bf16 qk128 v128 wgmma tile64x128w12s3 sm_90a"},
           {64, 64, false, "sm_90a", kAuto, "backward bf16 qk64 v64 wgmma tile128x128w12s2 sm_90a"},
           {64, 64, true, "sm_90a", kAuto, "backward bf16 qk64 v64 wgmma tile64x128w12s2 sm_90a"},
           {64, 64, false, "sm_90a", kMma, "backward bf16 qk64 v64 mma tile64x64w4s2 sm_90a"},
           {128, 128, false, "sm_80", kAuto, "backward bf16 qk128 v128 mma tile64x128w8s2 sm_80"},
           {64, 128, false, "sm_90a", kAuto, "backward bf16 qk64 v128 wgmma tile64x128w12s3 sm_90a"},
           // above 128 the wide-head Hopper kernel
           {192, 128, false, "sm_90a", kAuto, "backward bf16 qk192 v128 wgmma tile64x64w12s3 sm_90a"},
           {256, 256, true, "sm_90a", kAuto, "backward bf16 qk256 v256 wgmma tile64x64w12s2 sm_90a"},
           {192, 192, false, "sm_90a", kMma, "backward bf16 qk192 v192 mma tile64x128w8s2 sm_90a"},
           // mma.sync above QK 192: the deterministic kernels, measured faster (bwd_prefers_separate_dq)
           {256, 256, false, "sm_90a", kMma,
            "backward bf16 qk256 v256 mma tile64x64w4s2 sm_90a deterministic"},
       }) {
    fa::Options o = opts(w.dqk, w.dv);
    o.arch = w.arch, o.family = w.forward;
    const fa::Kernel k =
        fa::compile(w.score_mod ? fa::mods::softcap() : fa::identity_score(), fa::mods::causal(), o);
    EXPECT_EQ(k.backward_spec().to_string(), w.spec);
    const bool wgmma = k.backward_spec().family == fa::KernelFamily::kWgmma;
    EXPECT_NE(k.backward_cuda_source().find(wgmma ? "FAJIT_DEFINE_BACKWARD_SM90(" : "FAJIT_DEFINE_BACKWARD("),
              std::string::npos)
        << w.spec;
  }
}

// An additive bias differentiates to dS = dT: the identity hook, as for no score_mod at all.
TEST(BackwardApi, AdditiveBiasKeepsDsEqualToDt) {
  const fa::Kernel k = fa::compile(fa::mods::alibi(), fa::mods::causal(), opts(64, 64));
  const std::string& src = k.backward_cuda_source();
  EXPECT_NE(src.find("static constexpr bool kScoreGrad = false;"), std::string::npos) << src;
}

// softcap's derivative is generated code; a float buffer's gradient goes through grad_add_f32.
// Both compile with NVRTC (backward_cuda_source compiles the kernels).
TEST(BackwardApi, ScoreModDerivativesAreGenerated) {
  const fa::Kernel cap = fa::compile(fa::mods::softcap(), fa::mods::causal(), opts(64, 64));
  const std::string& src = cap.backward_cuda_source();
  EXPECT_NE(src.find("static constexpr bool kScoreGrad = true;"), std::string::npos) << src;
  EXPECT_NE(src.find("float score_grad(float score, int b, int h, int q, int kv, float dt,"),
            std::string::npos);
  EXPECT_NE(src.find("fa::mod::tanh("), std::string::npos);
  const fa::Kernel slopes =
      fa::compile(fa::mods::alibi(fa::buffer<float>("slopes", 1)), fa::mods::causal(), opts(64, 64));
  const std::string& src2 = slopes.backward_cuda_source();
  EXPECT_NE(src2.find("static constexpr bool kScoreGrad = true;"), std::string::npos) << src2;
  EXPECT_NE(src2.find("fa::mod::grad_add_f32(grads.buffers[0], "), std::string::npos) << src2;
}

TEST(BackwardApi, ScoreModWithoutDerivativeIsRefusedNamingTheOp) {
  const fa::ScoreMod stepped{
      "stepped", [](fa::Score s, fa::Index, fa::Index, fa::Index, fa::Index) { return s + fa::floor(s); }};
  const fa::Kernel k = fa::compile(stepped, fa::mods::causal(), opts(64, 64));
  const std::string e = error_of([&] { k.backward_cuda_source(); });
  EXPECT_EQ(e.rfind("cannot differentiate score_mod @stepped:\n", 0), 0u) << e;
  EXPECT_NE(e.find("'math.floor' op has no derivative (a step function); the gradient of score_mod @stepped "
                   "would flow through it"),
            std::string::npos)
      << e;
}

// Kernel::warm compiles the kernels otherwise compiled on first use, once: a second warm finds
// the same ones (the counts are of where each first came from), and the sources it compiled
// are those the first use would take. A no-op mask has no classifier (its table kernels still
// warm); a score_mod without a derivative fails the backward as its first use would.
TEST(KernelWarm, CompilesTheLazyKernelsOnce) {
  const fa::Kernel k = fa::compile(fa::mods::softcap(), fa::mods::causal(), opts(64, 64));
  fa::WarmOptions w;
  w.backward = w.decode = w.ragged = true;
  const fa::WarmReport r = k.warm(w);
  // forward, builder (its classifier and its table kernels), backward, decode, ragged prefill,
  // decode and backward
  EXPECT_EQ(r.kernels, 8);
  EXPECT_EQ(r.compiled + r.from_disk + r.from_memory, r.kernels);
  const fa::WarmReport again = k.warm(w);
  EXPECT_EQ(again.kernels, 8);
  EXPECT_EQ(again.compiled, r.compiled);
  EXPECT_EQ(k.backward_spec().kind, fa::KernelKind::kBackward);
  EXPECT_EQ(k.decode_spec().kind, fa::KernelKind::kDecode);

  const fa::Kernel noop = fa::compile(fa::identity_score(), fa::noop_mask(), opts(64, 64));
  // the forward and the builder's table kernels (they derive a device-given mask's tables): no
  // classifier, nothing to evaluate for a no-op mask
  EXPECT_EQ(noop.warm().kernels, 2);
  fa::WarmOptions rm;
  rm.row_max = true;
  EXPECT_EQ(noop.warm(rm).kernels, 3);  // and the forward's row-max twin (ForwardOptions::max_scores)
  rm.block_mask = false;
  EXPECT_EQ(noop.warm(rm).kernels, 2);

  // d128 without mods: the dense forward's 192x128 s2 (by default, or asked for) is dense-only;
  // the ragged and paged prefill kernels compile on their layout's own default instead.
  fa::WarmOptions seq;
  seq.ragged = seq.paged = true;
  fa::Options wide = opts(128, 128);
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "Options::tile 192x128w16s2" : "default tile");
    if (given) wide.family = fa::KernelFamily::kWgmma, wide.tile = {192, 128, 16, 2};
    const fa::Kernel k128 = fa::compile(fa::identity_score(), fa::noop_mask(), wide);
    EXPECT_EQ(k128.spec().tile, (fa::TileConfig{192, 128, 16, 2}));
    EXPECT_EQ(k128.warm(seq).kernels, 6);  // forward; table kernels; ragged prefill and decoding; paged ones
  }

  const fa::ScoreMod stepped{
      "stepped", [](fa::Score s, fa::Index, fa::Index, fa::Index, fa::Index) { return s + fa::floor(s); }};
  const fa::Kernel ks = fa::compile(stepped, fa::mods::causal(), opts(64, 64));
  EXPECT_EQ(ks.warm().kernels, 3);
  fa::WarmOptions bw;
  bw.backward = true;
  const std::string e = error_of([&] { ks.warm(bw); });
  EXPECT_EQ(e.rfind("cannot differentiate score_mod @stepped:\n", 0), 0u) << e;
}

// WarmOptions::candidates compiles the dense forward's autotuning candidates (every one but the
// default, which the forward is) through the cache, so a later first call only times them; no
// GPU needed (an explicit arch). Once: a second warm finds them where they first came from.
TEST(KernelWarm, CompilesTheAutotuneCandidates) {
  const fa::ScoreMod scaled{
      "warm_candidates", [](fa::Score s, fa::Index, fa::Index, fa::Index, fa::Index) { return s * 0.875f; }};
  const fa::Kernel k = fa::compile(scaled, fa::mods::causal(), opts(64, 64));
  const std::vector<fa::KernelSpec> specs = fa::forward_tune_candidates(k.spec(), true, true);
  ASSERT_GE(specs.size(), 3u);
  EXPECT_EQ(specs[0], k.spec());
  fa::WarmOptions w;
  w.block_mask = false;
  w.candidates = true;
  const fa::WarmReport r = k.warm(w);
  EXPECT_EQ(r.kernels, static_cast<int>(specs.size()));  // the forward and every other candidate
  EXPECT_EQ(r.compiled + r.from_disk + r.from_memory, r.kernels);
  const fa::jit::CacheStats before = fa::jit::Cache::global().stats();
  const fa::WarmReport again = k.warm(w);
  const fa::jit::CacheStats after = fa::jit::Cache::global().stats();
  EXPECT_EQ(again.kernels, r.kernels);
  EXPECT_EQ(again.compiled, r.compiled);
  EXPECT_EQ(after.misses, before.misses) << "the second warm compiled nothing";
  EXPECT_EQ(after.disk_hits, before.disk_hits) << "nor read anything from disk: the tuner holds them";
  w.candidates = false;
  EXPECT_EQ(k.warm(w).kernels, 1);
}

// The ragged and paged prefill on Hopper: the wgmma kernel (K/V by cp.async) at every head dim,
// its paged copy gathering the rows (one page lookup a row and tile: load_rows_sw128) padded ones
// (d80, d96, d112, d160) and those of pitch 192 (8 threads a row) included; both layouts alike
// (paged stays bit-identical to packed). Compiled here by NVRTC, so those copies compile in CI.
TEST(KernelWarm, SequenceLayoutsTakeTheWgmmaPrefillAtEveryHeadDim) {
  for (auto [dqk, dv] : {std::pair{80, 80}, {96, 96}, {112, 48}, {160, 160}, {192, 128}}) {
    SCOPED_TRACE(::testing::Message() << dqk << "/" << dv);
    const fa::Kernel k = fa::compile(fa::mods::alibi(), fa::mods::causal(), opts(dqk, dv));
    for (fa::SequenceLayout l : {fa::SequenceLayout::kRagged, fa::SequenceLayout::kPaged}) {
      const fa::KernelSpec& s = k.prefill_spec(l);
      EXPECT_EQ(s.layout, l);
      EXPECT_EQ(s.family, fa::KernelFamily::kWgmma) << s.to_string();
      EXPECT_TRUE(s.cp_async_kv) << s.to_string();
      EXPECT_EQ(s.tile, k.prefill_spec(fa::SequenceLayout::kRagged).tile) << "both layouts on one tile";
    }
  }
}

// Options::backward_in_background compiles the backward on a thread of its own while the forward
// compiles: a later Kernel::warm finds it in the process's memory cache (finished, or joined in
// flight) instead of compiling it or reading it from disk. The score_mod is this test's own, so
// no earlier test of the process put this backward in memory. A score_mod without a derivative
// starts nothing and fails at the backward's first use, as without the option.
TEST(KernelWarm, BackwardInBackgroundIsReadyForTheFirstBackward) {
  const fa::ScoreMod scaled{
      "bg_scaled", [](fa::Score s, fa::Index, fa::Index, fa::Index, fa::Index) { return s * 0.8125f; }};
  fa::Options o = opts(64, 64);
  o.backward_in_background = true;
  const fa::Kernel k = fa::compile(scaled, fa::mods::causal(), o);
  EXPECT_NE(k.origin(), fa::CacheOrigin::kMemory);
  fa::WarmOptions bw;
  bw.block_mask = false;
  bw.backward = true;
  const fa::WarmReport r = k.warm(bw);
  EXPECT_EQ(r.kernels, 2);
  EXPECT_EQ(r.from_memory, 1);  // the backward
  EXPECT_EQ(r.compiled + r.from_disk, 1);

  const fa::ScoreMod stepped{
      "stepped_bg", [](fa::Score s, fa::Index, fa::Index, fa::Index, fa::Index) { return s + fa::floor(s); }};
  const fa::Kernel ks = fa::compile(stepped, fa::mods::causal(), o);
  const std::string e = error_of([&] { ks.warm(bw); });
  EXPECT_EQ(e.rfind("cannot differentiate score_mod @stepped_bg:\n", 0), 0u) << e;
}

// Tensors at fake, 256-byte aligned addresses: validation never dereferences them.
struct FakeTensors {
  uintptr_t next = 0x10000000;
  fa::TensorView t(fa::DType d, std::initializer_list<int64_t> shape) {
    void* p = reinterpret_cast<void*>(next);
    next += 1 << 24;
    return fa::TensorView(p, d, shape);
  }
};

// A backward's tensors for B 1, H 2, L 256, D 64, each at its own fake address.
struct BackwardArgs {
  fa::TensorView q, k, v, o, lse, dout, dq, dk, dv;
  explicit BackwardArgs(FakeTensors& f) {
    for (fa::TensorView* t : {&q, &k, &v, &o, &dout, &dq, &dk, &dv})
      *t = f.t(fa::DType::bf16, {1, 2, 256, 64});
    lse = f.t(fa::DType::f32, {1, 2, 256});
  }
};

TEST(BackwardApi, BadTensorsNameTheArgument) {
  const fa::Kernel k = fa::compile(fa::identity_score(), fa::mods::causal(), opts(64, 64));
  const fa::BlockMask mask = fa::BlockMask::all_full(1, 1, 256, 256);
  FakeTensors f;
  const auto bf = fa::DType::bf16, f32 = fa::DType::f32;
  const BackwardArgs a(f);
  const fa::TensorView &q = a.q, &kk = a.k, &v = a.v, &o = a.o, &lse = a.lse, &dout = a.dout, &dq = a.dq,
                       &dv = a.dv;
  const fa::TensorView dk_short = f.t(bf, {1, 2, 255, 64}), dq_f16 = f.t(fa::DType::f16, {1, 2, 256, 64}),
                       lse_bf16 = f.t(bf, {1, 2, 256}), dlse_bad = f.t(f32, {1, 1, 256});
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse, dout, dq, dk_short, dv, mask); }),
            "dk: Lkv must match k (256), got 255");
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse, dout, dq_f16, kk, dv, mask); }),
            "dq: dtype must match q (bf16), got f16");
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse_bf16, dout, dq, kk, dv, mask); }),
            "lse: dtype must be f32, got bf16");
  fa::BackwardOptions bo;
  bo.dlse = &dlse_bad;
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse, dout, dq, kk, dv, mask, {}, bo); }),
            "dlse: Hq must match lse (2), got 1");
  const fa::BlockMask other = fa::BlockMask::all_full(1, 1, 512, 256);
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse, dout, dq, kk, dv, other); }),
            "block mask was built for Lq=512, Lkv=256; got Lq=256, Lkv=256");
  const fa::BlockMask small = fa::BlockMask::all_full(1, 1, 256, 256, 32, 32);
  EXPECT_EQ(error_of([&] { k.backward(q, kk, v, o, lse, dout, dq, kk, dv, small); }),
            "block mask block sizes 32x32 must be multiples of the backward tile 128x128");
}

// Gradients may share memory with nothing the call reads, nor with each other.
TEST(BackwardApi, GradientsSharingMemoryAreRefused) {
  const fa::Kernel k =
      fa::compile(fa::mods::alibi(fa::buffer<float>("slopes", 1)), fa::mods::causal(), opts(64, 64));
  const fa::BlockMask mask = fa::BlockMask::all_full(1, 1, 256, 256);
  FakeTensors f;
  const BackwardArgs a(f);
  const fa::TensorView slopes = f.t(fa::DType::f32, {2}),
                       dk_on_lse(a.lse.data, fa::DType::bf16, {1, 2, 256, 64});
  fa::Captures cap;
  cap.buffer("slopes", slopes);
  auto error_with = [&](const fa::TensorView& dq, const fa::TensorView& dk, const fa::TensorView& dv,
                        const fa::BackwardOptions& bo = {}) {
    return error_of([&] { k.backward(a.q, a.k, a.v, a.o, a.lse, a.dout, dq, dk, dv, mask, cap, bo); });
  };
  EXPECT_EQ(error_with(a.q, a.dk, a.dv), "dq: its memory overlaps that of q; give it a buffer of its own");
  EXPECT_EQ(error_with(a.dq, dk_on_lse, a.dv),
            "dk: its memory overlaps that of lse; give it a buffer of its own");
  EXPECT_EQ(error_with(a.dq, a.dk, a.dq), "dv: its memory overlaps that of dq; give it a buffer of its own");
  fa::BackwardOptions bo;
  bo.buffer_grads.emplace("slopes", slopes);
  EXPECT_EQ(
      error_with(a.dq, a.dk, a.dv, bo),
      "buffer_grads['slopes']: its memory overlaps that of capture 'slopes'; give it a buffer of its own");
}

// The d64 Hopper forward (192 query rows) regroups masks that agree with mask_mod; given tables
// whose blocks it can neither regroup nor hand to its 128-row twin are refused naming its tile.
TEST(ForwardApi, GivenTablesTheWideTileCannotTakeAreRefusedNamingTheTile) {
  const fa::Kernel k = fa::compile(fa::identity_score(), fa::mods::causal(), opts(64, 64));
  ASSERT_EQ(k.spec().tile.block_m, 192) << k.spec().to_string();
  FakeTensors f;
  const auto bf = fa::DType::bf16;
  const fa::TensorView q = f.t(bf, {1, 2, 256, 64}), kk = f.t(bf, {1, 2, 256, 64}),
                       v = f.t(bf, {1, 2, 256, 64}), o = f.t(bf, {1, 2, 256, 64});
  std::vector<uint8_t> kinds(4 * 2, uint8_t(fa::BlockKind::kFull));
  kinds[1] = uint8_t(fa::BlockKind::kEmpty);
  const fa::BlockMask given = fa::BlockMask::from_kinds(1, 1, 256, 256, kinds, 64, 128);
  ASSERT_FALSE(given.regroupable());
  EXPECT_EQ(error_of([&] { k.forward(q, kk, v, o, given); }),
            "block mask block sizes 64x128 must be multiples of the forward tile 192x128");
}

TEST(BackwardApi, BufferGradientsAreCheckedByName) {
  const fa::Kernel k =
      fa::compile(fa::mods::alibi(fa::buffer<float>("slopes", 1)), fa::mods::document(), opts(64, 64));
  const fa::BlockMask mask = fa::BlockMask::all_full(1, 1, 256, 256);
  FakeTensors f;
  const auto bf = fa::DType::bf16, f32 = fa::DType::f32;
  const fa::TensorView q = f.t(bf, {1, 2, 256, 64}), lse = f.t(f32, {1, 2, 256});
  fa::Captures cap;
  cap.buffer("slopes", f.t(f32, {2})).buffer("doc_ids", f.t(fa::DType::i32, {256}));
  auto error_with = [&](const std::string& name, const fa::TensorView& g) {
    fa::BackwardOptions bo;
    bo.buffer_grads.emplace(name, g);
    return error_of([&] { k.backward(q, q, q, q, lse, q, q, q, q, mask, cap, bo); });
  };
  EXPECT_EQ(error_with("bias", f.t(f32, {2})), "buffer_grads: 'bias' is not a buffer the mods capture");
  EXPECT_EQ(error_with("doc_ids", f.t(f32, {256})),
            "buffer_grads: 'doc_ids' is an i32 buffer; only f32 buffers have gradients");
  // A float buffer only the mask_mod reads has no gradient either.
  const fa::MaskMod limited{"limited", [](fa::Index, fa::Index h, fa::Index q, fa::Index kv) {
                              return q - kv < fa::buffer<float>("limit", 1)[h];
                            }};
  const fa::Kernel k2 = fa::compile(fa::identity_score(), limited, opts(64, 64));
  fa::Captures cap2;
  cap2.buffer("limit", f.t(f32, {2}));
  fa::BackwardOptions bo2;
  bo2.buffer_grads.emplace("limit", f.t(f32, {2}));
  EXPECT_EQ(error_of([&] { k2.backward(q, q, q, q, lse, q, q, q, q, mask, cap2, bo2); }),
            "buffer_grads: the score_mod @identity does not read 'limit', so it has no gradient");
  EXPECT_EQ(error_with("slopes", f.t(bf, {2})), "buffer_grads: 'slopes' must be f32, got bf16");
  EXPECT_EQ(error_with("slopes", f.t(f32, {3}))
                .rfind("buffer_grads: 'slopes' must have the capture's shape f32[2]", 0),
            0u);
}

}  // namespace
