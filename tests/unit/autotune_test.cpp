// Autotuning's host side: the candidate lists per arch and head dims, shape classes, the
// stored record's text, the switch (Options::autotune, $FAJIT_AUTOTUNE). The timing itself is a GPU test
// (tests/gpu/forward_test.cpp, Autotune*).
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "../../compiler/lib/api/autotune.h"
#include "fa_test_util.h"
#include "fajit/error.h"
#include "fajit/kernel.h"
#include "fajit/mods.h"

namespace {

fa::KernelSpec forward(int dqk, int dv, const char* arch = "sm_90a") {
  fa::KernelSpec s;
  s.head_dim_qk = dqk;
  s.head_dim_v = dv;
  s.arch = arch;
  return s.resolved();
}

std::vector<std::string> texts(const std::vector<fa::KernelSpec>& specs) {
  std::vector<std::string> out;
  for (const fa::KernelSpec& s : specs) out.push_back(s.to_string());
  return out;
}

TEST(Autotune, CandidatesOnSm90aStartWithTheDefaultThenEveryWgmmaTileThenMmaSync) {
  const fa::KernelSpec def = forward(128, 128);
  const std::vector<fa::KernelSpec> c = fa::forward_tune_candidates(def, false);
  // A mask_mod without a score_mod above 64: 2 stages first (the persistent form's second Q
  // region fits beside them); three consumers with P through shared memory last.
  EXPECT_EQ(texts(c), (std::vector<std::string>{
                          "forward bf16 qk128 v128 wgmma tile128x128w12s2 sm_90a",
                          "forward bf16 qk128 v128 wgmma tile128x128w12s3 sm_90a",
                          "forward bf16 qk128 v128 wgmma tile128x64w12s2 sm_90a",
                          "forward bf16 qk128 v128 wgmma tile128x64w12s3 sm_90a",
                          "forward bf16 qk128 v128 wgmma tile192x128w16s2 sm_90a",
                          "forward bf16 qk128 v128 mma tile128x64w4s2 sm_90a",
                          "forward bf16 qk128 v128 mma tile64x64w4s2 sm_90a",
                      }));
  for (const fa::KernelSpec& s : c) EXPECT_EQ(s.resolved(), s) << s.to_string();  // each a resolved spec
  // Without mods, three consumers (192x128, 2 stages, P through shared memory) are the default.
  fa::KernelSpec plain;
  plain.head_dim_qk = plain.head_dim_v = 128;
  const fa::KernelSpec def_plain = plain.resolved(false, false);
  EXPECT_EQ(def_plain.to_string(), "forward bf16 qk128 v128 wgmma tile192x128w16s2 sm_90a");
  EXPECT_EQ(def_plain.smem_bytes(), 230472);  // 48 KiB of Q, two 64 KiB stages, three 16 KiB P tiles
  EXPECT_EQ(texts(fa::forward_tune_candidates(def_plain, false, false)),
            (std::vector<std::string>{
                "forward bf16 qk128 v128 wgmma tile192x128w16s2 sm_90a",
                "forward bf16 qk128 v128 wgmma tile128x128w12s3 sm_90a",
                "forward bf16 qk128 v128 wgmma tile128x128w12s2 sm_90a",
                "forward bf16 qk128 v128 wgmma tile128x64w12s3 sm_90a",
                "forward bf16 qk128 v128 wgmma tile128x64w12s2 sm_90a",
                "forward bf16 qk128 v128 mma tile128x64w4s2 sm_90a",
                "forward bf16 qk128 v128 mma tile64x64w4s2 sm_90a",
            }));
  // 192x128 s2 first only at 113-128 (QK and V): d120 yes, d112 and 128/96 no (a candidate);
  // not at all where P would stay in registers (V up to 64: 128/64; 96/64 spills with a score_mod).
  auto default_of = [](int dqk, int dv) {
    fa::KernelSpec s;
    s.head_dim_qk = dqk, s.head_dim_v = dv;
    return s.resolved(false, false).tile;
  };
  EXPECT_EQ(default_of(120, 120), (fa::TileConfig{192, 128, 16, 2}));
  EXPECT_EQ(default_of(112, 112), (fa::TileConfig{128, 128, 12, 3}));
  EXPECT_EQ(default_of(128, 96), (fa::TileConfig{128, 128, 12, 3}));
  for (auto [dqk, dv] : {std::pair{128, 64}, {96, 64}})
    for (const fa::KernelSpec& s : fa::forward_tune_candidates(forward(dqk, dv), dqk == 96))
      EXPECT_FALSE(s.tile == (fa::TileConfig{192, 128, 16, 2})) << s.to_string();
  // A score_mod on d128 takes 8 warps on mma.sync (4 spill), and no three-consumer tile (it spills).
  EXPECT_EQ(fa::forward_tune_candidates(def, true)[4].to_string(),
            "forward bf16 qk128 v128 mma tile128x64w8s2 sm_90a");
}

TEST(Autotune, CandidatesKeepToWhatSharedMemoryAndTheHeadDimsAllow) {
  // 256/256: BLOCK_N 64 only on wgmma (O of 256 columns), 16 rows per warp on mma.sync.
  EXPECT_EQ(texts(fa::forward_tune_candidates(forward(256, 256), false)),
            (std::vector<std::string>{
                "forward bf16 qk256 v256 wgmma tile128x64w12s2 sm_90a",
                "forward bf16 qk256 v256 mma tile128x64w8s2 sm_90a",
                "forward bf16 qk256 v256 mma tile64x64w4s2 sm_90a",
            }));
  // d64: three consumer warpgroups (192 rows) are the wgmma default; 128 rows in three stages
  // as above 64, and two, are candidates.
  EXPECT_EQ(texts(fa::forward_tune_candidates(forward(64, 64), false)),
            (std::vector<std::string>{
                "forward bf16 qk64 v64 wgmma tile192x128w16s3 sm_90a",
                "forward bf16 qk64 v64 wgmma tile128x128w12s3 sm_90a",
                "forward bf16 qk64 v64 wgmma tile128x128w12s2 sm_90a",
                "forward bf16 qk64 v64 wgmma tile128x64w12s3 sm_90a",
                "forward bf16 qk64 v64 wgmma tile128x64w12s2 sm_90a",
                "forward bf16 qk64 v64 mma tile128x64w4s2 sm_90a",
                "forward bf16 qk64 v64 mma tile64x64w4s2 sm_90a",
            }));
  // Between 64 and 96: 192x112 (three consumers) first without a score_mod or mask_mod, else
  // after the 128-row tiles; its 2-stage ring too, and 192x128 with P through shared memory
  // (eight candidates at most: the last mma.sync tile is left out).
  const std::vector<std::string> d96_masked{
      "forward bf16 qk96 v96 wgmma tile128x128w12s2 sm_90a",
      "forward bf16 qk96 v96 wgmma tile128x128w12s3 sm_90a",
      "forward bf16 qk96 v96 wgmma tile128x64w12s2 sm_90a",
      "forward bf16 qk96 v96 wgmma tile128x64w12s3 sm_90a",
      "forward bf16 qk96 v96 wgmma tile192x112w16s3 sm_90a",
      "forward bf16 qk96 v96 wgmma tile192x112w16s2 sm_90a",
      "forward bf16 qk96 v96 wgmma tile192x128w16s2 sm_90a",
      "forward bf16 qk96 v96 mma tile128x64w4s2 sm_90a",
  };
  EXPECT_EQ(texts(fa::forward_tune_candidates(forward(96, 96), false)), d96_masked);
  fa::KernelSpec plain96;
  plain96.head_dim_qk = plain96.head_dim_v = 96;
  const fa::KernelSpec def96 = plain96.resolved(false, false);
  EXPECT_EQ(def96.to_string(), "forward bf16 qk96 v96 wgmma tile192x112w16s3 sm_90a");
  // without a mask_mod: 192x112 first, then the 128-row tiles 3 stages first
  std::vector<std::string> d96_plain = d96_masked;
  d96_plain.erase(d96_plain.begin() + 4);
  d96_plain.insert(d96_plain.begin(), "forward bf16 qk96 v96 wgmma tile192x112w16s3 sm_90a");
  std::swap(d96_plain[1], d96_plain[2]);
  std::swap(d96_plain[3], d96_plain[4]);
  EXPECT_EQ(texts(fa::forward_tune_candidates(def96, false, false)), d96_plain);
  // sm_80: mma.sync only, 128 and 64 rows, BLOCK_N 64 and 32, 2 and 3 stages.
  EXPECT_EQ(texts(fa::forward_tune_candidates(forward(64, 64, "sm_80"), false)),
            (std::vector<std::string>{
                "forward bf16 qk64 v64 mma tile128x64w4s2 sm_80",
                "forward bf16 qk64 v64 mma tile128x64w4s3 sm_80",
                "forward bf16 qk64 v64 mma tile128x32w4s2 sm_80",
                "forward bf16 qk64 v64 mma tile128x32w4s3 sm_80",
                "forward bf16 qk64 v64 mma tile64x64w4s2 sm_80",
                "forward bf16 qk64 v64 mma tile64x64w4s3 sm_80",
                "forward bf16 qk64 v64 mma tile64x32w4s2 sm_80",
                "forward bf16 qk64 v64 mma tile64x32w4s3 sm_80",
            }));
  for (int d : {32, 80, 96, 128, 192, 256})
    for (const char* arch : {"sm_80", "sm_86", "sm_90a"}) {
      const std::vector<fa::KernelSpec> c =
          fa::forward_tune_candidates(forward(d, d == 192 ? 128 : d, arch), false);
      // sm_86's 99 KB hold nothing but the smallest tile at 256/256: nothing to tune.
      if (std::string(arch) == "sm_86" && d == 256)
        EXPECT_EQ(c.size(), 1u) << d << " " << arch;
      else
        EXPECT_GE(c.size(), 2u) << d << " " << arch;
      EXPECT_LE(c.size(), size_t(fa::kMaxTuneCandidates));
      const std::vector<std::string> t = texts(c);
      EXPECT_EQ(std::set<std::string>(t.begin(), t.end()).size(), t.size()) << "a candidate twice";
    }
}

TEST(Autotune, CandidatesAreForTheDenseForwardOnly) {
  fa::KernelSpec s = forward(128, 128);
  s.kind = fa::KernelKind::kBackward;
  EXPECT_THROW(
      {
        try {
          fa::forward_tune_candidates(s, false);
        } catch (const fa::Error& e) {
          EXPECT_STREQ(e.what(), "autotuning takes the dense forward kernel only");
          throw;
        }
      },
      fa::Error);
}

TEST(Autotune, ShapeClassesRoundUpToPowersOfTwo) {
  EXPECT_EQ(fa::detail::shape_class({64, 4096, 4096, 128, 128}), "bh64 q4096 kv4096 blk128x128");
  EXPECT_EQ(fa::detail::shape_class({3, 1000, 1, 128, 64}), "bh4 q1024 kv1 blk128x64");
  EXPECT_EQ(fa::detail::shape_class({65, 4097, 2, 128, 128}), "bh128 q8192 kv2 blk128x128");
}

TEST(Autotune, StoredRecordsNameOneOfTheCandidates) {
  const std::vector<fa::KernelSpec> c = fa::forward_tune_candidates(forward(128, 128), false);
  fa::TuneRecord r;
  r.shape_class = "bh64 q4096 kv4096 blk128x128";
  r.device = "NVIDIA H200";
  r.chosen = c[2];
  r.timed = {{c[0], 1.25f}, {c[2], 1.125f}};
  const std::string text = fa::detail::tune_record_text(r);
  EXPECT_EQ(text,
            "choice forward bf16 qk128 v128 wgmma tile128x64w12s2 sm_90a\n"
            "class bh64 q4096 kv4096 blk128x128\n"
            "device NVIDIA H200\n"
            "timed 1.2500 forward bf16 qk128 v128 wgmma tile128x128w12s2 sm_90a\n"
            "timed 1.1250 forward bf16 qk128 v128 wgmma tile128x64w12s2 sm_90a\n");
  EXPECT_EQ(fa::detail::parse_tune_choice(text, c), c[2]);
  // A choice that is not (or no longer) a candidate, or a damaged record, is no choice.
  EXPECT_FALSE(fa::detail::parse_tune_choice(text, {c[0], c[1]}));
  EXPECT_FALSE(fa::detail::parse_tune_choice("", c));
  EXPECT_FALSE(fa::detail::parse_tune_choice("choice forward bf16 qk128", c));
  EXPECT_EQ(fa::to_string(r),
            "bh64 q4096 kv4096 blk128x128: tuned wgmma 128x64w12s2 (wgmma 128x128w12s2 1.250 ms, wgmma "
            "128x64w12s2 1.125 ms, compile 0.00 s, 0 at the call, timing 0.00 s) on NVIDIA H200");
  r.origin = fa::TuneRecord::Origin::kStored;
  r.timed.clear();
  EXPECT_EQ(fa::to_string(r), "bh64 q4096 kv4096 blk128x128: stored wgmma 128x64w12s2 on NVIDIA H200");
  r.origin = fa::TuneRecord::Origin::kSkipped;
  r.chosen = c[0];
  r.note = "one launch takes 40.00 ms, 6 candidates do not fit 200 ms";
  EXPECT_EQ(
      fa::to_string(r),
      "bh64 q4096 kv4096 blk128x128: default wgmma 128x128w12s2 (not timed: one launch takes 40.00 ms, 6 "
      "candidates do not fit 200 ms) on NVIDIA H200");
}

TEST(Autotune, OnByDefaultOffWithTheEnvironmentOrAnExplicitKernel) {
  fa::Options o;
  {
    fa::test::ScopedEnv env("FAJIT_AUTOTUNE", nullptr);
    EXPECT_TRUE(fa::detail::autotune_enabled(o));
  }
  {
    fa::test::ScopedEnv env("FAJIT_AUTOTUNE", "0");
    EXPECT_FALSE(fa::detail::autotune_enabled(o));
    o.autotune = true;  // the code's word wins over the environment's
    EXPECT_TRUE(fa::detail::autotune_enabled(o));
  }
  {
    fa::test::ScopedEnv env("FAJIT_AUTOTUNE", "1");
    o.autotune = false;
    EXPECT_FALSE(fa::detail::autotune_enabled(o));
    o.autotune.reset();
    EXPECT_TRUE(fa::detail::autotune_enabled(o));
    o.family = fa::KernelFamily::kWgmma;  // an explicit kernel is never tuned
    EXPECT_FALSE(fa::detail::autotune_enabled(o));
    o.family = fa::KernelFamily::kAuto;
    o.tile = {128, 64, 4, 2};
    EXPECT_FALSE(fa::detail::autotune_enabled(o));
    o.autotune = true;  // and asking for both is an error
    EXPECT_EQ(
        fa::test::error_of([&] { fa::detail::autotune_enabled(o); }),
        "autotune: autotuning picks the kernel family and tile itself; leave family on auto and the tile "
        "empty, or turn autotune off");
  }
  o = fa::Options{};
  for (const char* off : {"0", "off", "OFF", "false", "no"}) {
    fa::test::ScopedEnv env("FAJIT_AUTOTUNE", off);
    EXPECT_FALSE(fa::detail::autotune_enabled(o)) << off;
  }
}

TEST(Autotune, KernelReportsWhetherItTunes) {
  fa::test::ScopedEnv env("FAJIT_AUTOTUNE", nullptr);
  fa::Options o;
  o.arch = "sm_90a";
  o.head_dim_qk = o.head_dim_v = 64;
  const fa::Kernel k = fa::compile(fa::identity_score(), fa::mods::causal(), o);
  EXPECT_TRUE(k.autotunes());
  EXPECT_TRUE(k.tune_records().empty());  // nothing run yet
  o.autotune = false;
  EXPECT_FALSE(fa::compile(fa::identity_score(), fa::mods::causal(), o).autotunes());
}

}  // namespace
