// fa::compile'd forward kernels on the GPU against fa::reference_attention (float64) over the
// interpreter programs of the same fa IR, with host copies of the same captures.
//
// Inputs are random (seeded per case by its name), rounded to the kernel's dtype on the host,
// so the reference reads exactly what the GPU reads. O and LSE are poisoned (NaN) before every
// launch; every element must be written, nothing may be NaN, fully masked rows must be O = 0,
// LSE = -inf, and the error must stay under:
//   ||O - ref|| / ||ref|| (whole tensor)  < 1e-2 bf16, 5e-3 f16
//   the same per row                      < 4e-2 bf16, 2e-2 f16 (a row-local bug, e.g. in the
//                                           last q tile, barely moves the global norm)
//   |LSE - ref| where finite               < 2e-2 + |ref|·2^-21 (a few of f32's ulps: an LSE of
//                                           3e9 + log n is stored as f32)
// A global environment compiles the kernels and computes the references of the selected cases
// in parallel before the first test (the host reference is single-threaded and dominates).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "../../compiler/lib/api/autotune.h"
#include "../../compiler/lib/api/compiled.h"
#include "../../compiler/lib/api/forward_mask.h"
#include "fajit/detail/codegen.h"
#include "fajit/jit/cache.h"
#include "fajit/runtime/device.h"
#include "gpu_harness.h"

namespace fa_gpu_test {
namespace {

struct FwdCase {
  std::string variant;
  fa::DType dtype;
  int dqk, dv;
  int B, Hq, Hkv, Lq, Lkv;
  int param = -1;          // the variant's knob (window, prefix, n_pad, ...); < 0: default
  std::string tag = "";    // appended to the name
  bool noncontig = false;  // Q/K/V slices of one [B, L, Hq + 2 Hkv, D] buffer; O [B, Lq, Hq + 1, Dv]
  float scale = 0.0f;      // 0: default 1/sqrt(dqk)
  fa::TileConfig tile{};   // default: per head dims
  fa::KernelFamily family = fa::KernelFamily::kAuto;  // wgmma on sm_90a devices, else mma.sync
  int q_block = 128, kv_block = 128;
  bool no_lse = false;                            // launch without the LSE output
  bool own_stream = false;                        // launch on a non-blocking stream of our own
  fa::ForwardPath path = fa::ForwardPath::kAuto;  // auto: the decoding kernel for Lq <= 64
  int splits = 0;                                 // decoding: 0 = the host's choice
  bool cp_async_kv = false;       // FAJIT_TMA=0: the Hopper forward's producer copies K/V with cp.async
  bool autotune = false;          // Options::autotune (off elsewhere: the measured defaults under test)
  float salt = 0.0f;              // != 0: score_mod + salt, a variant of its own (a cache key no run saw)
  bool strided_captures = false;  // buffers at an innermost stride of 2: the wide-captures twins
  int persistent_ctas = 0;        // > 0: FAJIT_PERSISTENT_CTAS, the persistent forward's CTAs capped
  bool max_scores = false;        // ForwardOptions::max_scores too (the row-max twins), checked
  bool device_tables = false;     // the mask's kv tables read in place on the device (device_tables_of)
  int lead = -1;  // >= 0 (sm_90a): the rows the persistent forward's first block starts early, checked

  std::string name() const {
    std::string n = variant + "_" + fa::dtype_name(dtype) + "_d" + std::to_string(dqk) + "x" +
                    std::to_string(dv) + "_b" + std::to_string(B) + "h" + std::to_string(Hq) + "g" +
                    std::to_string(Hq / Hkv) + "_" + std::to_string(Lq) + "x" + std::to_string(Lkv);
    if (!tag.empty()) n += "_" + tag;
    return n;
  }
  fa::Options options() const {
    fa::Options o;
    o.dtype = dtype, o.head_dim_qk = dqk, o.head_dim_v = dv, o.tile = tile, o.family = family;
    o.autotune = autotune;
    return o;
  }
};

// gtest prints a case by its name (ctest shows it beside the test name).
void PrintTo(const FwdCase& c, std::ostream* os) { *os << c.name(); }

constexpr fa::DType bf16 = fa::DType::bf16, f16 = fa::DType::f16;

FwdCase with(FwdCase c, const std::string& tag, std::function<void(FwdCase&)> f) {
  c.tag = tag;
  f(c);
  return c;
}

// The mma.sync kernel on a device whose default is the wgmma one (Hopper).
void mma_family(FwdCase& c) { c.family = fa::KernelFamily::kMmaSync; }
void on_device_tables(FwdCase& c) { c.device_tables = true; }

// Three consumer warpgroups with 112 keys a tile (between head dims 64 and 96).
void tile192x112(FwdCase& c) {
  c.tile = fa::TileConfig{192, 112, 16, 3}, c.family = fa::KernelFamily::kWgmma;
}

// Three consumer warpgroups with 128 keys a tile above DV 64: P through shared memory, 2 stages.
void tile192x128s2(FwdCase& c) {
  c.tile = fa::TileConfig{192, 128, 16, 2}, c.family = fa::KernelFamily::kWgmma;
}

// Two consumer warpgroups, two stages: the persistent form at head dims 72-128 (FAJIT_PERSISTENT_CTAS
// caps its CTAs only there), forced where a score_mod or no mask_mod makes 128x128 s3 the default.
void tile128x128s2(FwdCase& c) {
  c.tile = fa::TileConfig{128, 128, 12, 2}, c.family = fa::KernelFamily::kWgmma;
}

// A covering set, not the cross product: every library mod at both dtypes, every head-dim pair
// at both dtypes, lengths 1 / 17 / 1000 / 4097 (Lq != Lkv both ways), GQA groups 1, 2, 4, 8.
const std::vector<FwdCase>& cases() {
  static const std::vector<FwdCase> all = {
      //  variant              dtype dqk  dv  B  Hq Hkv   Lq    Lkv  param
      {"none", bf16, 128, 128, 2, 2, 2, 1000, 1000},
      {"none", f16, 64, 64, 1, 8, 1, 17, 17},
      with({"none", f16, 64, 64, 1, 2, 2, 1000, 1000}, "scale", [](FwdCase& c) { c.scale = 0.3f; }),
      {"causal", bf16, 64, 64, 1, 2, 2, 4097, 4097},
      {"causal", f16, 128, 64, 2, 4, 1, 1000, 4097},
      {"causal", bf16, 128, 128, 1, 4, 1, 1, 1},
      {"causal_alibi", bf16, 128, 128, 1, 8, 1, 1000, 1000},
      {"causal_alibi", f16, 64, 128, 2, 4, 4, 17, 1000},
      with({"causal_alibi", bf16, 128, 128, 1, 2, 1, 1000, 1000}, "tile64x32w4s3",
           [](FwdCase& c) {
             c.tile = fa::TileConfig{64, 32, 4, 3};
           }),
      {"alibi_slopes", f16, 128, 128, 1, 4, 1, 1000, 17},
      {"alibi_slopes", bf16, 64, 64, 2, 8, 2, 1, 4097},
      {"alibi_slopes", bf16, 128, 64, 1, 4, 4, 4097, 1000},
      {"document_softcap", bf16, 64, 128, 1, 4, 1, 4097, 4097},
      {"document_softcap", f16, 128, 128, 1, 2, 2, 17, 1000},
      // scores far past the cap (scale 2: tanh saturated) as well as near 0 (fa::mod::tanh's two forms)
      with({"document_softcap", f16, 64, 64, 2, 4, 2, 1000, 1000}, "hot", [](FwdCase& c) { c.scale = 2.0f; }),
      {"document2d_causal", bf16, 64, 64, 3, 2, 2, 1000, 1000},
      {"sliding", bf16, 128, 128, 1, 8, 1, 4097, 4097, 200},
      {"sliding", f16, 64, 64, 2, 4, 1, 1000, 1000, 100},
      {"sliding", bf16, 64, 128, 1, 4, 4, 17, 17, 5},
      with({"sliding", f16, 64, 64, 1, 2, 2, 1000, 1000, 100}, "blocks256x64",
           [](FwdCase& c) { c.q_block = 256, c.kv_block = 64, c.family = fa::KernelFamily::kMmaSync; }),
      {"head_sliding", f16, 128, 128, 1, 4, 2, 1000, 1000},
      {"prefix_lm", f16, 128, 128, 1, 4, 2, 1000, 1000, 300},
      {"prefix_lm", bf16, 128, 64, 2, 8, 1, 17, 17, 5},
      {"padding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 333},
      {"padding", f16, 128, 128, 1, 8, 1, 17, 17, 5},
      with({"padding", f16, 128, 64, 1, 4, 4, 17, 1000, 17}, "allmasked", [](FwdCase&) {}),
      {"dilated", f16, 64, 128, 1, 4, 1, 4097, 1000, 200},
      {"dilated", bf16, 128, 128, 1, 2, 2, 1000, 1000, 150},
      {"relative_bias", bf16, 128, 64, 1, 2, 1, 17, 4097},
      {"relative_bias", f16, 64, 64, 2, 4, 4, 1000, 1000},
      with({"sliding", bf16, 128, 128, 2, 4, 2, 1000, 1000, 300}, "noncontig",
           [](FwdCase& c) { c.noncontig = true; }),
      with({"relative_bias", f16, 64, 64, 1, 8, 1, 17, 17}, "noncontig",
           [](FwdCase& c) { c.noncontig = true; }),
      with({"causal", f16, 64, 64, 1, 2, 1, 1000, 1000}, "nolse_stream",
           [](FwdCase& c) { c.no_lse = true, c.own_stream = true; }),
      // Split-KV decoding (decode.cuh, chosen for Lq <= 64 with at most 128 packed rows per KV
      // head; the short cases above take it too):
      // Lq 1, 2, 16, 64 over long KV, GQA 1/4/8 (heads of a group share a tile when the mask
      // ignores the head), causal with an offset (a decoding step at the end of the cache),
      // per-head masks (one head per tile), forced split counts, the prefill kernel forced on
      // a short query for comparison.
      {"none", bf16, 128, 128, 2, 8, 1, 1, 32768},
      {"causal_offset", bf16, 128, 128, 1, 32, 4, 2, 131072},
      {"alibi_slopes", f16, 64, 64, 2, 8, 8, 16, 20000},
      {"sliding", bf16, 128, 128, 1, 16, 2, 64, 9000, 1000},
      {"head_sliding", f16, 128, 128, 2, 8, 2, 3, 5000},
      {"document_softcap", bf16, 80, 80, 1, 8, 2, 16, 4097},
      {"causal_offset", bf16, 256, 256, 1, 4, 1, 1, 3000},
      with({"none", f16, 64, 64, 1, 4, 1, 17, 4096}, "splits7", [](FwdCase& c) { c.splits = 7; }),
      with({"causal_offset", bf16, 128, 128, 1, 8, 8, 1, 1000}, "splits1", [](FwdCase& c) { c.splits = 1; }),
      // The kv tables read in place on the device (BlockMask::from_device_kv_blocks): decoding
      // (GQA groups sharing a tile, per-head tables), prefill on the mask's own tile, and at d64
      // (whose 192-row tile does not divide the blocks: the 128x128 twin reads them in place).
      with({"causal_offset", bf16, 128, 128, 1, 32, 4, 2, 131072}, "devtables", on_device_tables),
      with({"head_sliding", f16, 128, 128, 2, 8, 2, 3, 5000}, "devtables", on_device_tables),
      with({"document_softcap", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "devtables", on_device_tables),
      with({"sliding", f16, 64, 64, 2, 4, 1, 1000, 1000, 100}, "devtables", on_device_tables),
      // captured buffers the 32-bit, contiguous-innermost offsets cannot address (innermost
      // stride 2, poison between): the wide-captures twins of the forward (wgmma and mma.sync),
      // decoding and block-mask builder kernels
      with({"document_softcap", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "stridedcaps",
           [](FwdCase& c) { c.strided_captures = true; }),
      with({"relative_bias", f16, 64, 64, 2, 4, 4, 1000, 1000}, "stridedcaps",
           [](FwdCase& c) { c.strided_captures = true, c.family = fa::KernelFamily::kMmaSync; }),
      with({"document2d_causal", bf16, 64, 64, 3, 2, 2, 16, 3000}, "stridedcaps",
           [](FwdCase& c) { c.strided_captures = true; }),
      // more parts than a warp has lanes (the combine takes 32 at a time), some seeing nothing
      with({"document_softcap", bf16, 128, 128, 1, 4, 4, 1, 6000}, "splits45",
           [](FwdCase& c) { c.splits = 45; }),
      with({"padding", bf16, 128, 64, 2, 4, 2, 5, 4000, 333}, "noncontig",
           [](FwdCase& c) { c.noncontig = true; }),
      with({"causal_offset", f16, 128, 128, 1, 8, 2, 16, 8192}, "prefill",
           [](FwdCase& c) { c.path = fa::ForwardPath::kPrefill; }),
      // 512 packed rows per KV head (Lq 64 x GQA 8): auto takes the prefill kernel there
      // (kDecodeAutoRows), the decoding kernel forced still takes it (8 row blocks per head).
      with({"causal_offset", bf16, 128, 128, 1, 8, 1, 64, 5000}, "decode",
           [](FwdCase& c) { c.path = fa::ForwardPath::kDecode; }),
      // Head dims beyond 64 / 128: the wgmma kernel on Hopper (rows padded to 64-column swizzle
      // blocks, a zero-filled chunk at 40 and 72, P·V's N rounded up to 16; above V 128 BLOCK_N
      // 64 and P·V as two wgmmas), the mma.sync kernel elsewhere (16 rows per warp above 128);
      // odd chunk counts (40, 72, 80), QK != V (192/128, 112/48).
      {"causal", bf16, 32, 32, 2, 4, 2, 1000, 1000},
      {"document_softcap", f16, 40, 40, 1, 4, 1, 4097, 4097},
      {"alibi_slopes", bf16, 80, 80, 1, 8, 2, 1000, 17},
      {"sliding", f16, 96, 96, 2, 4, 4, 1000, 1000, 100},
      {"causal", bf16, 192, 128, 1, 8, 1, 4097, 4097},
      {"relative_bias", f16, 256, 256, 1, 2, 2, 1000, 1000},
      {"prefix_lm", bf16, 256, 256, 2, 4, 1, 17, 4097, 5},
      with({"padding", bf16, 72, 136, 1, 4, 2, 1000, 1000, 333}, "noncontig",
           [](FwdCase& c) { c.noncontig = true; }),
      with({"causal_alibi", f16, 160, 160, 1, 4, 1, 1000, 1000}, "tile64x32w4s3",
           [](FwdCase& c) {
             c.tile = fa::TileConfig{64, 32, 4, 3};
           }),
      with({"document_softcap", bf16, 72, 72, 1, 4, 2, 1000, 1000}, "noncontig",
           [](FwdCase& c) { c.noncontig = true; }),
      {"document2d_causal", f16, 112, 48, 2, 4, 4, 1000, 4097},
      // Above 128 on the wgmma kernel: P·V split 128 + 72 (200/168, a zero chunk at 168), 64 + 80
      // (144), BLOCK_N 128 at 256/64; GQA, a tail tile, f16; and 256 on mma.sync once more.
      {"prefix_lm", bf16, 200, 168, 1, 8, 2, 1000, 777, 100},
      {"causal_alibi", f16, 144, 144, 2, 4, 4, 1000, 1000},
      {"sliding", bf16, 256, 64, 1, 8, 8, 1000, 1000, 300},
      {"document_softcap", f16, 256, 256, 1, 8, 2, 4097, 4097},
      with({"relative_bias", bf16, 256, 256, 1, 2, 2, 1000, 1000}, "mma", mma_family),
      with({"causal", bf16, 256, 256, 1, 4, 2, 1000, 1000}, "cpasync",
           [](FwdCase& c) { c.cp_async_kv = true; }),
      {"none", bf16, 96, 96, 1, 4, 1, 17, 17},
      with({"document_softcap", f16, 40, 40, 1, 4, 1, 1000, 1000}, "mma", mma_family),
      with({"alibi_slopes", bf16, 80, 80, 1, 8, 2, 1000, 17}, "mma", mma_family),
      // Three consumer warpgroups between 64 and 96 (192x112, the default without mods; the
      // masks' blocks regrouped into 192x112): tails, causal, document + softcap (160
      // registers), sliding with GQA, V narrower than QK, cp.async K/V with strided operands.
      {"none", f16, 80, 80, 2, 4, 2, 1000, 777},
      with({"causal", bf16, 96, 96, 1, 4, 1, 4097, 4097}, "tile192x112", tile192x112),
      with({"document_softcap", f16, 80, 80, 1, 2, 2, 17, 1000}, "tile192x112", tile192x112),
      with({"sliding", bf16, 72, 72, 1, 8, 2, 1000, 4097, 200}, "tile192x112", tile192x112),
      with({"causal_alibi", f16, 96, 64, 2, 4, 4, 1000, 777}, "tile192x112s2",
           [](FwdCase& c) { tile192x112(c), c.tile.stages = 2; }),
      with({"prefix_lm", bf16, 96, 96, 1, 4, 2, 1000, 1000, 300}, "tile192x112_cpasync_noncontig",
           [](FwdCase& c) { tile192x112(c), c.cp_async_kv = true, c.noncontig = true; }),
      // The persistent forward (dense, K/V by TMA, three-consumer tiles first) with its CTAs capped at
      // 2 or 3, so each takes many query blocks in turn: every block of a head a CTA's neighbour
      // also walks, empty walks (padding's masked rows), walks of every length (sliding,
      // document), GQA, Lq != Lkv both ways, a tail block, f16 and bf16, 192x112 s2 at d80, and
      // operands TMA cannot map (the cp.async twin, one block per CTA, takes those).
      with({"none", bf16, 64, 64, 2, 4, 1, 1000, 1000}, "ctas3", [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"causal", f16, 64, 64, 1, 8, 2, 1000, 1000}, "ctas2", [](FwdCase& c) { c.persistent_ctas = 2; }),
      with({"document_softcap", bf16, 64, 64, 2, 4, 2, 1000, 1000}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"sliding", f16, 64, 64, 2, 4, 4, 1000, 1000, 100}, "ctas2",
           [](FwdCase& c) { c.persistent_ctas = 2; }),
      with({"padding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 333}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"alibi_slopes", f16, 64, 64, 2, 8, 2, 300, 4097}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"causal", bf16, 32, 32, 1, 4, 4, 4097, 777}, "ctas2", [](FwdCase& c) { c.persistent_ctas = 2; }),
      with({"causal_alibi", bf16, 80, 80, 1, 4, 1, 1000, 1000}, "tile192x112s2_ctas3",
           [](FwdCase& c) { tile192x112(c), c.tile.stages = 2, c.persistent_ctas = 3; }),
      with({"none", f16, 64, 64, 2, 4, 2, 1000, 1000}, "noncontig_ctas3",
           [](FwdCase& c) { c.noncontig = true, c.persistent_ctas = 3; }),
      // Two-consumer persistent tiles (128 rows; at d128 only 128x128 s2 leaves room for the
      // second Q region, so it is forced where the default is s3) with capped CTAs: a block whose
      // second warpgroup has no live rows (Lq 900: rows 960.. of the last block), masks built at
      // 64-row blocks, whose regrouped tiles carry sub-block kinds, so one warpgroup skips tiles
      // the other computes (document; sliding 48, where the second warpgroup skips each walk's
      // first tile), a score_mod, GQA, Lq != Lkv.
      with({"none", bf16, 128, 128, 2, 4, 2, 900, 4097}, "tile128x128s2_ctas2",
           [](FwdCase& c) { tile128x128s2(c), c.persistent_ctas = 2; }),
      with({"document_softcap", f16, 128, 128, 1, 4, 2, 1000, 1000}, "qb64_tile128x128s2_ctas2",
           [](FwdCase& c) { tile128x128s2(c), c.q_block = 64, c.persistent_ctas = 2; }),
      with({"sliding", bf16, 128, 128, 2, 4, 4, 2000, 2000, 48}, "qb64_ctas3",
           [](FwdCase& c) { c.q_block = 64, c.persistent_ctas = 3; }),
      with({"causal_alibi", f16, 128, 128, 1, 8, 4, 1000, 1000}, "tile128x128s2_ctas2",
           [](FwdCase& c) { tile128x128s2(c), c.persistent_ctas = 2; }),
      with({"padding", bf16, 96, 96, 2, 4, 1, 900, 1000, 333}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      // The persistent forward with its partial query block first (detail::lead_rows: 192-row tiles,
      // Lq % 192 == 64, a causal-like mask; the tables' first block starts 128 rows before query
      // 0): capped CTAs and not, GQA, Lq != Lkv, f16 and bf16, max_scores, 192x112 s2 at d96, a
      // mask of every head (head_sliding); Lq %
      // 192 == 128, 128-row tiles (d128 s2, d64 with a score_mod), a full mask and a mask on device
      // tables keep 0.
      with({"causal", bf16, 64, 64, 2, 4, 2, 1024, 1024}, "led", [](FwdCase& c) { c.lead = 128; }),
      with({"causal", f16, 64, 64, 1, 8, 2, 448, 448}, "led_ctas3",
           [](FwdCase& c) { c.lead = 128, c.persistent_ctas = 3; }),
      with({"sliding", bf16, 64, 64, 2, 4, 4, 1024, 1000, 100}, "led_ctas2",
           [](FwdCase& c) { c.lead = 128, c.persistent_ctas = 2; }),
      with({"prefix_lm", f16, 64, 64, 1, 4, 1, 1024, 1024, 300}, "led", [](FwdCase& c) { c.lead = 128; }),
      with({"causal", bf16, 64, 64, 1, 4, 1, 1024, 1024}, "led_max_ctas3",
           [](FwdCase& c) { c.lead = 128, c.max_scores = true, c.persistent_ctas = 3; }),
      with({"sliding", f16, 96, 96, 1, 4, 2, 832, 832, 100}, "led_tile192x112s2",
           [](FwdCase& c) { tile192x112(c), c.tile.stages = 2, c.lead = 128; }),
      with({"head_sliding", bf16, 64, 64, 2, 4, 2, 1024, 1024, 100}, "led_ctas3",
           [](FwdCase& c) { c.lead = 128, c.persistent_ctas = 3; }),
      with({"causal", f16, 64, 64, 1, 4, 2, 896, 896}, "led", [](FwdCase& c) { c.lead = 0; }),
      with({"causal", bf16, 128, 128, 1, 4, 2, 960, 960}, "led_ctas2",
           [](FwdCase& c) { c.lead = 0, c.persistent_ctas = 2; }),
      with({"causal_alibi", f16, 64, 64, 2, 4, 2, 960, 960}, "led", [](FwdCase& c) { c.lead = 0; }),
      with({"none", bf16, 64, 64, 1, 4, 1, 1024, 1024}, "led", [](FwdCase& c) { c.lead = 0; }),
      with({"causal", bf16, 64, 64, 1, 4, 1, 1024, 1024}, "led_device_tables",
           [](FwdCase& c) { c.lead = 0, on_device_tables(c); }),
      // Three consumers at 128 keys above DV 64 (192x128 s2, P staged in shared memory for P·V; the
      // default at d113-d128 without mods): no mask (Lq != Lkv), causal at 4097 (regrouped from 128-row
      // blocks, sub-blocks skipped), a document mask (its column loads), padding with Lkv 17 (masked
      // rows), sliding at d112, ALiBi at d96 and d80 with GQA (a score_mod above 96 spills: not a tile
      // there), f16 and bf16, max_scores, V narrower than QK (72), the cp.async twin (K/V the driver
      // cannot map) on non-contiguous tensors.
      with({"none", bf16, 128, 128, 2, 4, 2, 1000, 4097}, "tile192x128s2", tile192x128s2),
      with({"causal", f16, 128, 128, 1, 4, 1, 4097, 4097}, "tile192x128s2", tile192x128s2),
      with({"document2d_causal", bf16, 128, 128, 2, 8, 2, 1000, 1000}, "tile192x128s2", tile192x128s2),
      with({"padding", f16, 128, 128, 2, 4, 4, 1000, 17, 5}, "tile192x128s2", tile192x128s2),
      with({"sliding", bf16, 112, 112, 2, 4, 4, 1000, 1000, 100}, "tile192x128s2", tile192x128s2),
      with({"causal_alibi", f16, 96, 96, 1, 8, 4, 1000, 1000}, "tile192x128s2", tile192x128s2),
      with({"alibi_slopes", bf16, 80, 80, 2, 4, 2, 777, 1000}, "tile192x128s2", tile192x128s2),
      with({"causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "tile192x128s2_max",
           [](FwdCase& c) { tile192x128s2(c), c.max_scores = true; }),
      with({"prefix_lm", f16, 112, 72, 1, 4, 1, 1000, 1000, 300}, "tile192x128s2", tile192x128s2),
      with({"none", f16, 128, 128, 1, 4, 2, 1000, 1000}, "tile192x128s2_cpasync_noncontig",
           [](FwdCase& c) { tile192x128s2(c), c.cp_async_kv = true, c.noncontig = true; }),
      // Column values gathered across the warp (key_pad_bias: a float for score_mod, a bool for
      // mask_mod): the three-consumer tile (4 slots of 32 columns), 192x112 (the last slot
      // half used), 128x128 at d128, tails (Lkv 777, 17), GQA, persistent and not.
      {"key_pad_bias", bf16, 64, 64, 2, 4, 2, 1000, 777},
      {"key_pad_bias", f16, 128, 128, 1, 4, 1, 17, 4097},
      with({"key_pad_bias", bf16, 80, 80, 2, 4, 4, 1000, 777}, "tile192x112", tile192x112),
      with({"key_pad_bias", f16, 64, 64, 2, 4, 2, 1000, 1000}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"key_pad_bias", bf16, 128, 128, 1, 8, 2, 1000, 4097}, "mma", mma_family),
      // the decoding kernel up to head dim 64 (a GQA group's heads packed into one tile: rows
      // of several heads), one query and 16, several splits
      {"key_keep_bias", bf16, 64, 64, 2, 8, 2, 16, 3000},
      {"key_keep_bias", f16, 48, 64, 1, 8, 8, 1, 4097},
      {"key_keep_bias", bf16, 128, 128, 1, 8, 2, 1, 5000},  // above 64: the plain calls
      // the mma.sync forward gathers them too up to d64: two m-tiles a warp sharing the shuffled
      // columns (4 warps), 32-key tiles (one slot), tails; and a document mask at d96 (the
      // plain calls: no m-tile shares a shuffle there)
      with({"key_pad_bias", bf16, 64, 64, 2, 4, 2, 1000, 777}, "mma", mma_family),
      with({"document2d_causal", f16, 96, 96, 2, 4, 4, 1000, 4097}, "mma", mma_family),
      with({"key_pad_bias", f16, 64, 64, 1, 4, 1, 17, 1000}, "mma_tile64x32w4s2",
           [](FwdCase& c) {
             c.family = fa::KernelFamily::kMmaSync, c.tile = fa::TileConfig{64, 32, 4, 2};
           }),
      // two consumer warpgroups: the d128 and d96 default for a mask_mod alone (128x128 s2), and
      // 128x128 s3 at d64
      with({"document2d_causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "ctas3",
           [](FwdCase& c) { c.persistent_ctas = 3; }),
      with({"sliding", f16, 96, 96, 2, 4, 4, 1000, 1000, 100}, "ctas2",
           [](FwdCase& c) { c.persistent_ctas = 2; }),
      with({"padding", f16, 64, 64, 2, 4, 1, 1000, 1000, 333}, "tile128x128s3_ctas3",
           [](FwdCase& c) {
             c.tile = fa::TileConfig{128, 128, 12, 3}, c.family = fa::KernelFamily::kWgmma,
             c.persistent_ctas = 3;
           }),
      // Masks of 256-key blocks: the wgmma forward splits them into its BLOCK_N (one tile a block)
      // on the three-consumer tile (with the query blocks regrouped to 192) and on 128x128, the
      // persistent form with its CTAs capped, a tail block, and the cp.async twin.
      with({"sliding", f16, 64, 64, 2, 4, 2, 1000, 1000, 300}, "kvb256_ctas3",
           [](FwdCase& c) { c.kv_block = 256, c.persistent_ctas = 3; }),
      with({"document2d_causal", bf16, 128, 128, 2, 4, 2, 1000, 4097}, "kvb256",
           [](FwdCase& c) { c.kv_block = 256; }),
      with({"causal_alibi", bf16, 64, 64, 1, 4, 4, 1000, 777}, "kvb256",
           [](FwdCase& c) { c.kv_block = 256; }),
      with({"prefix_lm", f16, 128, 128, 1, 4, 2, 1000, 1000, 300}, "kvb256_cpasync",
           [](FwdCase& c) { c.kv_block = 256, c.cp_async_kv = true; }),
      // The Hopper forward's cp.async K/V path (FAJIT_TMA=0), which it takes where the driver
      // refuses a tensor map: whole and padded rows, a tail tile, non-contiguous operands.
      with({"causal", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "cpasync",
           [](FwdCase& c) { c.cp_async_kv = true; }),
      with({"document_softcap", f16, 80, 80, 1, 4, 2, 1000, 777}, "cpasync",
           [](FwdCase& c) { c.cp_async_kv = true; }),
      with({"sliding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 200}, "cpasync_noncontig",
           [](FwdCase& c) { c.cp_async_kv = true, c.noncontig = true; }),
      // A row max that climbs tile by tile: the softmax's reference stays for a tile or two,
      // then moves (conditional rescale), on every forward kernel family.
      {"kv_ramp", bf16, 128, 128, 1, 4, 2, 1000, 4097},
      {"kv_ramp", f16, 64, 64, 2, 4, 1, 1000, 1000, 40},
      {"kv_ramp", f16, 80, 80, 1, 4, 2, 16, 9000, 20},  // the decoding kernel
      with({"kv_ramp", bf16, 96, 96, 1, 4, 1, 1000, 1000, 60}, "tile192x112", tile192x112),
      with({"kv_ramp", f16, 128, 128, 1, 4, 2, 1000, 1000}, "mma", mma_family),
      {"head_offset", bf16, 128, 128, 1, 6, 2, 1000, 1000},
      // Slopes the kv-linear form leaves to the plain one (inf, NaN, 2^80, FLT_MAX) beside
      // ordinary ones: the Hopper forward (192-row tiles at d64), the decoder, mma.sync.
      {"slope_extremes", bf16, 64, 64, 2, 8, 4, 1000, 1000},
      {"slope_extremes", bf16, 128, 128, 1, 8, 2, 1000, 4097},
      {"slope_extremes", f16, 64, 64, 1, 8, 8, 16, 3000},
      with({"slope_extremes", f16, 128, 64, 1, 8, 1, 1000, 1000}, "mma", mma_family),
      // Interval masks (kMaskKvRange) with bounds at int32's ends, wrapped and empty (12 heads:
      // each of the variant's six kinds, every fourth head's first rows empty): the Hopper
      // forward (192-row tiles at d64), a 4097-key tail, the decoder, mma.sync split and plain.
      {"kv_range_extremes", bf16, 64, 64, 2, 12, 4, 1000, 1000},
      {"kv_range_extremes", f16, 128, 128, 1, 12, 2, 1000, 4097},
      {"kv_range_extremes", bf16, 64, 64, 1, 12, 4, 16, 3000},
      with({"kv_range_extremes", f16, 128, 64, 1, 12, 1, 1000, 1000}, "mma", mma_family),
      with({"kv_range_extremes", bf16, 64, 64, 1, 12, 3, 777, 1000}, "mma", mma_family),
      {"query_slope", bf16, 64, 64, 2, 4, 2, 1000, 1000},
      {"query_slope", f16, 128, 128, 2, 4, 4, 16, 4097},
      with({"query_slope", bf16, 64, 64, 2, 4, 1, 1000, 777}, "mma", mma_family),
      {"head_offset", f16, 64, 64, 2, 6, 3, 17, 4097},  // the decoding kernel and its combine
      with({"head_offset", f16, 96, 64, 1, 6, 6, 1000, 1000}, "mma", mma_family),
      // The mma.sync kernel on the same device (the default above is wgmma on Hopper).
      with({"causal_alibi", bf16, 128, 128, 1, 8, 1, 1000, 1000}, "mma", mma_family),
      with({"document_softcap", f16, 64, 128, 1, 4, 1, 4097, 4097}, "mma", mma_family),
      with({"padding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 333}, "mma", mma_family),
      with({"sliding", f16, 128, 64, 2, 4, 2, 17, 4097, 100}, "mma", mma_family),
      with({"relative_bias", bf16, 128, 128, 1, 2, 1, 4097, 17}, "mma", mma_family),
      // Autotuned (Options::autotune): the first launch times the candidates on these tensors,
      // then the chosen one writes O (checked like every case).
      with({"causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "autotune",
           [](FwdCase& c) { c.autotune = true; }),
      with({"document_softcap", f16, 64, 64, 1, 4, 1, 4097, 4097}, "autotune",
           [](FwdCase& c) { c.autotune = true; }),
      with({"sliding", bf16, 256, 256, 1, 2, 2, 1000, 777, 100}, "autotune",
           [](FwdCase& c) { c.autotune = true; }),
      // Each row's largest score (ForwardOptions::max_scores, the row-max twins) on every forward
      // kernel: the persistent Hopper forward, 192-row tiles with a score_mod, mma.sync with
      // fully masked rows, raw q·k times a scale, the decoder and its combine (huge per-head
      // offsets, a key mask with no causality), autotuned; LSE and O checked as always.
      with({"causal", bf16, 128, 128, 2, 8, 2, 1000, 1000}, "max", [](FwdCase& c) { c.max_scores = true; }),
      with({"document_softcap", f16, 64, 64, 2, 4, 2, 1000, 1000}, "max",
           [](FwdCase& c) { c.max_scores = true; }),
      with({"padding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 333}, "mma_max",
           [](FwdCase& c) { c.family = fa::KernelFamily::kMmaSync, c.max_scores = true; }),
      with({"none", f16, 64, 64, 1, 2, 2, 1000, 1000}, "scale_max",
           [](FwdCase& c) { c.scale = 0.3f, c.max_scores = true; }),
      with({"kv_ramp", f16, 80, 80, 1, 4, 2, 16, 9000, 20}, "max", [](FwdCase& c) { c.max_scores = true; }),
      with({"head_offset", f16, 64, 64, 2, 6, 3, 17, 4097}, "max", [](FwdCase& c) { c.max_scores = true; }),
      with({"key_keep_bias", bf16, 64, 64, 2, 8, 2, 16, 3000}, "max_splits7",
           [](FwdCase& c) { c.max_scores = true, c.splits = 7; }),
      with({"head_offset", bf16, 128, 128, 1, 6, 2, 1000, 1000}, "max",
           [](FwdCase& c) { c.max_scores = true; }),
      with({"document_softcap", f16, 64, 64, 1, 4, 1, 4097, 4097}, "autotune_max",
           [](FwdCase& c) { c.autotune = true, c.max_scores = true; }),
      // +inf and NaN scores (rows NaN, maxima +inf / NaN) on each family and the decoder; the
      // persistent forward with 3 CTAs walking many blocks each; the wide-captures twin's twin
      with({"inf_nan_keys", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "max",
           [](FwdCase& c) { c.max_scores = true; }),
      with({"inf_nan_keys", f16, 64, 64, 2, 4, 4, 300, 300}, "mma_max",
           [](FwdCase& c) { c.family = fa::KernelFamily::kMmaSync, c.max_scores = true; }),
      with({"inf_nan_keys", bf16, 64, 64, 2, 4, 1, 16, 3000}, "max_splits5",
           [](FwdCase& c) { c.max_scores = true, c.splits = 5; }),
      with({"causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "ctas3_max",
           [](FwdCase& c) { c.persistent_ctas = 3, c.max_scores = true; }),
      with({"relative_bias", f16, 64, 64, 2, 4, 1, 1000, 1000}, "stridedcaps_max",
           [](FwdCase& c) { c.strided_captures = true, c.max_scores = true; }),
  };
  return all;
}

// Element offset and strides of one [B, H, L, D] operand inside a case's input buffer.
struct Operand {
  int64_t offset = 0;
  std::array<int64_t, 4> stride{};
};

struct Prepared {
  std::optional<fa::Kernel> kernel;
  CaptureSet caps;
  fa::Captures captures;
  fa::BlockMask mask;
  std::vector<uint16_t> in_bits;  // Q, K and V, rounded to the dtype
  std::vector<float> in_vals;     // the same values as float
  Operand q, k, v;
  fa::ReferenceResult ref;
  double compile_s = 0, ref_s = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::shared_ptr<Prepared> prepare(const FwdCase& c) {
  auto t0 = std::chrono::steady_clock::now();
  auto p = std::make_shared<Prepared>();
  const Variant& var = variant(c.variant);
  fa::ScoreMod score = var.score();
  if (c.salt != 0.0f)  // a constant shift: the same O, the LSE moved by salt, a new cache key
    score.fn = [inner = score.fn, salt = c.salt](fa::Score s, fa::Index b, fa::Index h, fa::Index q,
                                                 fa::Index kv) {
      return inner(s, b, h, q, kv) + fa::Score(salt);
    };
  p->kernel.emplace(fa::compile(score, var.mask(), c.options()));
  p->compile_s = seconds_since(t0);

  std::mt19937 rng(static_cast<uint32_t>(fnv1a(c.name())));
  var.fill(p->caps, Dims{c.B, c.Hq, c.Lq, c.Lkv}, c.param, rng);
  p->caps.upload(c.strided_captures);
  p->captures = p->caps.captures();
  fa::BlockMaskOptions bo;
  bo.q_block = c.q_block, bo.kv_block = c.kv_block;
  p->mask = p->kernel->block_mask(c.B, c.Hq, c.Lq, c.Lkv, p->captures, bo);

  // Inputs.
  int64_t total = 0;
  if (c.noncontig) {
    // every slot as wide as the wider head dim (V may be wider than Q/K: 72/136)
    const int64_t L = std::max(c.Lq, c.Lkv), Ht = c.Hq + 2 * c.Hkv, D = std::max(c.dqk, c.dv);
    const std::array<int64_t, 4> s{L * Ht * D, D, Ht * D, 1};
    p->q = {0, s}, p->k = {c.Hq * D, s}, p->v = {(c.Hq + c.Hkv) * D, s};
    total = c.B * L * Ht * D;
  } else {
    auto contiguous = [&](int H, int L, int D) {
      Operand o{total, {int64_t(H) * L * D, int64_t(L) * D, D, 1}};
      total += int64_t(c.B) * H * L * D;
      total = (total + 63) / 64 * 64;  // keep each operand 128-byte aligned
      return o;
    };
    p->q = contiguous(c.Hq, c.Lq, c.dqk);
    p->k = contiguous(c.Hkv, c.Lkv, c.dqk);
    p->v = contiguous(c.Hkv, c.Lkv, c.dv);
  }
  p->in_bits.resize(size_t(total));
  p->in_vals.resize(size_t(total));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int64_t i = 0; i < total; ++i) {
    p->in_bits[size_t(i)] = to_bits(c.dtype, u(rng));
    p->in_vals[size_t(i)] = from_bits(c.dtype, p->in_bits[size_t(i)]);
  }

  // Reference.
  auto t1 = std::chrono::steady_clock::now();
  ModPrograms progs = mod_programs(p->kernel->program());
  fa::Bindings env = p->caps.bindings();
  fa::ReferenceShape shape{c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.dqk, c.dv};
  fa::ReferenceOptions ro;
  if (c.scale != 0.0f) ro.scale = double(c.scale);
  ro.score_mod = &progs.score, ro.mask_mod = &progs.mask, ro.bindings = &env;
  ro.q_strides = p->q.stride, ro.k_strides = p->k.stride, ro.v_strides = p->v.stride;
  p->ref = fa::reference_attention(shape, p->in_vals.data() + p->q.offset, p->in_vals.data() + p->k.offset,
                                   p->in_vals.data() + p->v.offset, ro);
  p->ref_s = seconds_since(t1);
  return p;
}

// Cases prepared (or being prepared) by name.
std::mutex g_mu;
std::map<std::string, std::shared_future<std::shared_ptr<Prepared>>> g_prepared;

std::shared_future<std::shared_ptr<Prepared>> start(const FwdCase& c) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_prepared.find(c.name());
  if (it != g_prepared.end()) return it->second;
  auto f = std::async(std::launch::async, [c] { return prepare(c); }).share();
  g_prepared.emplace(c.name(), f);
  return f;
}

struct Summary {
  std::string name;
  double rel, row_rel, lse_err, max_abs, compile_s, ref_s, gpu_ms;
  long masked_rows;
  double max_err;  // max |max_scores - ref| (-1: not asked)
};
std::vector<Summary> g_summary;

// Starts every selected forward case at once, and prints the error summary at the end.
class PrepareEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!fa::rt::cuda_available()) return;
    {
      fa::rt::ContextGuard guard;
      const fa::rt::DeviceInfo& d = fa::rt::current_device_info();
      std::printf("[ device   ] %s (%s, %d SMs)\n", d.name.c_str(), d.arch().c_str(), d.sm_count);
    }
    auto* ut = ::testing::UnitTest::GetInstance();
    int n = 0;
    for (int i = 0; i < ut->total_test_suite_count(); ++i) {
      const ::testing::TestSuite* ts = ut->GetTestSuite(i);
      for (int j = 0; j < ts->total_test_count(); ++j) {
        const ::testing::TestInfo* ti = ts->GetTestInfo(j);
        if (!ti->should_run()) continue;
        const std::string full = std::string(ts->name()) + "." + ti->name();
        for (const FwdCase& c : cases()) {
          const std::string suffix = "/" + c.name();
          if (full.size() >= suffix.size() &&
              full.compare(full.size() - suffix.size(), suffix.size(), suffix) == 0) {
            start(c);
            ++n;
          }
        }
      }
    }
    std::printf(
        "[ prepare  ] compiling kernels and computing references of %d forward cases in the background\n", n);
  }
  void TearDown() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      for (auto& [name, f] : g_prepared) f.wait();
      g_prepared.clear();  // device buffers freed before static destruction
    }
    if (g_summary.empty()) return;
    std::printf(
        "\nforward summary (rel = ||O-ref||/||ref||, row = worst row of the same, lse = max |LSE-ref|, "
        "rowmax = max |max_scores-ref|)\n");
    std::printf("%-52s %9s %9s %9s %9s %9s %6s %8s %7s %8s\n", "case", "rel", "row", "lse", "rowmax",
                "max_abs", "masked", "compile", "ref", "gpu_ms");
    for (const Summary& s : g_summary)
      std::printf("%-52s %9.2e %9.2e %9.2e %9s %9.2e %6ld %7.1fs %6.1fs %8.3f\n", s.name.c_str(), s.rel,
                  s.row_rel, s.lse_err, s.max_err < 0 ? "-" : fmt::format("{:.2e}", s.max_err).c_str(),
                  s.max_abs, s.masked_rows, s.compile_s, s.ref_s, s.gpu_ms);
  }
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new PrepareEnvironment);

struct Stats {
  double rel = 0, row_rel = 0, lse_err = 0, max_abs = 0;
  long nan_o = 0, nan_lse = 0, masked_rows = 0, bad_masked = 0, bad_lse = 0, gap_written = 0;
  long nan_rows = 0, bad_nan_rows = 0;  // rows the reference makes NaN (a NaN or +inf score)
  double max_err = -1;                  // max_scores: the largest |max_scores - ref| (-1: not asked)
  long bad_max = 0;                     // max_scores entries off (or not -inf / NaN where the reference is)
  std::string first_bad;
};

// Launches c's kernel once (O and LSE poisoned first) and compares with `ref`.
Stats launch_and_check(const FwdCase& c, const fa::Kernel& kernel, const Prepared& in,
                       const fa::BlockMask& mask, const fa::Captures& captures,
                       const fa::ReferenceResult& ref, double* gpu_ms = nullptr) {
  fa::rt::ContextGuard guard;
  fa::rt::DeviceBuffer d_in(in.in_bits.size() * 2);
  d_in.upload(in.in_bits.data(), in.in_bits.size() * 2);
  auto* base = d_in.as<uint16_t>();
  auto view = [&](const Operand& o, int H, int L, int D) {
    return fa::TensorView(base + o.offset, c.dtype, {c.B, H, L, D},
                          {o.stride[0], o.stride[1], o.stride[2], 1});
  };
  const fa::TensorView q = view(in.q, c.Hq, c.Lq, c.dqk), k = view(in.k, c.Hkv, c.Lkv, c.dqk),
                       v = view(in.v, c.Hkv, c.Lkv, c.dv);
  // O: contiguous, or [B, Lq, Hq + 1, Dv] whose extra head is a gap that must stay poisoned.
  const int64_t oh = c.noncontig ? c.Hq + 1 : c.Hq;
  const std::array<int64_t, 4> os =
      c.noncontig ? std::array<int64_t, 4>{c.Lq * oh * c.dv, c.dv, oh * c.dv, 1}
                  : std::array<int64_t, 4>{c.Hq * int64_t(c.Lq) * c.dv, int64_t(c.Lq) * c.dv, c.dv, 1};
  const size_t o_elems = size_t(c.B) * c.Lq * oh * c.dv, rows = size_t(c.B) * c.Hq * c.Lq;
  fa::rt::DeviceBuffer d_o(o_elems * 2), d_lse(rows * 4), d_max(rows * 4);
  d_o.memset8(0xFF);  // kPoison16
  d_lse.memset32(kPoison32);
  d_max.memset32(kPoison32);
  const fa::TensorView max_scores(d_max.as<void>(), fa::DType::f32, {c.B, c.Hq, c.Lq});
  const fa::TensorView o(d_o.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv}, {os[0], os[1], os[2], 1});
  const fa::TensorView lse(d_lse.as<void>(), fa::DType::f32, {c.B, c.Hq, c.Lq});
  fa::ForwardOptions fo;
  fo.scale = c.scale;
  fo.lse = c.no_lse ? nullptr : &lse;
  fo.max_scores = c.max_scores ? &max_scores : nullptr;
  fo.path = c.path;
  fo.decode_splits = c.splits;
  fa::rt::synchronize(nullptr);  // the poison memsets are asynchronous
  CUstream stream = nullptr;
  if (c.own_stream) FA_CU(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  if (c.cp_async_kv) setenv("FAJIT_TMA", "0", 1);
  if (c.persistent_ctas > 0) {
    // The cap applies to the persistent form only: a case whose tile is not persistent tests nothing of it.
    if (kernel.spec().arch == "sm_90a") {
      EXPECT_TRUE(fa::sm90_forward_persistent(kernel.spec()))
          << "capped CTAs on a tile that is not persistent: " << kernel.spec().to_string();
    }
    setenv("FAJIT_PERSISTENT_CTAS", std::to_string(c.persistent_ctas).c_str(), 1);
  }
  if (c.lead >= 0 && kernel.spec().arch == "sm_90a") {
    EXPECT_EQ(fa::detail::lead_rows(kernel.spec(), mask), c.lead) << kernel.spec().to_string();
  }
  auto t0 = std::chrono::steady_clock::now();
  kernel.forward(q, k, v, o, mask, captures, fo, reinterpret_cast<fa::Stream>(stream));
  if (c.cp_async_kv) unsetenv("FAJIT_TMA");
  if (c.persistent_ctas > 0) unsetenv("FAJIT_PERSISTENT_CTAS");
  fa::rt::synchronize(stream);
  if (gpu_ms) *gpu_ms = seconds_since(t0) * 1e3;
  if (stream) FA_CU(cuStreamDestroy, stream);

  std::vector<uint16_t> h_o(o_elems);
  std::vector<float> h_lse(rows), h_max(rows);
  d_o.download(h_o.data(), o_elems * 2);
  d_lse.download(h_lse.data(), rows * 4);
  d_max.download(h_max.data(), rows * 4);

  Stats s;
  double err2 = 0, ref2 = 0;
  auto note = [&](const std::string& what) {
    if (s.first_bad.empty()) s.first_bad = what;
  };
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Lq; ++i) {
        const size_t ri = (size_t(b) * c.Hq + h) * c.Lq + i;
        const std::string where =
            "b=" + std::to_string(b) + " h=" + std::to_string(h) + " q=" + std::to_string(i);
        const double rl = ref.lse[ri];
        const float gl = h_lse[ri];
        const uint16_t* orow = h_o.data() + b * os[0] + h * os[1] + int64_t(i) * os[2];
        const double* rrow = ref.out.data() + ri * c.dv;
        if (c.max_scores) {  // -inf / +inf / NaN exactly where the reference has them, else close
          const double rm = ref.max_score[ri], gm = h_max[ri];
          const bool ok = std::isnan(rm)   ? std::isnan(gm)
                          : std::isinf(rm) ? gm == rm
                                           : std::abs(gm - rm) < 5e-4 + std::abs(rm) * 0x1p-18;
          if (std::isfinite(rm) && std::isfinite(gm)) s.max_err = std::max(s.max_err, std::abs(gm - rm));
          if (!ok) {
            ++s.bad_max;
            note("max_scores " + std::to_string(gm) + " vs " + std::to_string(rm) + " at " + where);
          }
        }
        if (std::isnan(rl)) {  // a NaN or +inf score: O and LSE NaN, as softmax gives
          ++s.nan_rows;
          bool ok = c.no_lse || std::isnan(gl);
          for (int d = 0; d < c.dv; ++d) ok = ok && std::isnan(from_bits(c.dtype, orow[d]));
          if (!ok) ++s.bad_nan_rows, note("row not NaN (O and LSE) where the reference is, at " + where);
          continue;
        }
        if (c.no_lse) {
          // Nothing may be written to the LSE buffer the kernel was not given.
          uint32_t bits;
          std::memcpy(&bits, &gl, 4);
          if (bits != kPoison32) ++s.bad_lse, note("LSE buffer written without an LSE output at " + where);
        } else if (std::isnan(gl)) {
          ++s.nan_lse, note("LSE NaN at " + where);
        }
        if (std::isinf(rl)) {  // fully masked row: O exactly 0, LSE -inf
          ++s.masked_rows;
          bool ok = c.no_lse || gl == -std::numeric_limits<float>::infinity();
          for (int d = 0; d < c.dv; ++d) ok = ok && (orow[d] & 0x7fff) == 0;
          if (!ok) ++s.bad_masked, note("fully masked row not O=0/LSE=-inf at " + where);
          continue;
        }
        if (!c.no_lse && !std::isnan(gl)) {
          const double e =
              std::isfinite(gl) ? std::abs(double(gl) - rl) : std::numeric_limits<double>::infinity();
          if (e > s.lse_err) s.lse_err = e;
          if (!(e < 2e-2 + std::abs(rl) * 0x1p-21))
            ++s.bad_lse, note("LSE " + std::to_string(gl) + " vs " + std::to_string(rl) + " at " + where);
        }
        double re2 = 0, rr2 = 0;
        for (int d = 0; d < c.dv; ++d) {
          const float g = from_bits(c.dtype, orow[d]);
          if (std::isnan(g)) {
            ++s.nan_o,
                note("O NaN (bits " + std::to_string(orow[d]) + ") at " + where + " d=" + std::to_string(d));
            continue;
          }
          const double e = double(g) - rrow[d];
          re2 += e * e, rr2 += rrow[d] * rrow[d];
          s.max_abs = std::max(s.max_abs, std::abs(e));
        }
        err2 += re2, ref2 += rr2;
        const double row = std::sqrt(re2) / std::max(std::sqrt(rr2), 1e-6);
        if (row > s.row_rel) {
          s.row_rel = row;
          if (row > (c.dtype == bf16 ? 4e-2 : 2e-2))
            note("row error " + std::to_string(row) + " at " + where);
        }
      }
  s.rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (c.noncontig)
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < c.Lq; ++i)
        for (int d = 0; d < c.dv; ++d)
          if (h_o[size_t(b * os[0] + c.Hq * os[1] + int64_t(i) * os[2] + d)] != kPoison16) ++s.gap_written;
  return s;
}

void expect_good(const FwdCase& c, const Stats& s) {
  const double tol = c.dtype == bf16 ? 1e-2 : 5e-3, row_tol = c.dtype == bf16 ? 4e-2 : 2e-2;
  EXPECT_EQ(s.nan_o, 0) << "O elements NaN / never written; first: " << s.first_bad;
  EXPECT_EQ(s.nan_lse, 0) << "LSE NaN / never written; first: " << s.first_bad;
  EXPECT_EQ(s.bad_masked, 0) << "fully masked rows wrong; first: " << s.first_bad;
  EXPECT_EQ(s.bad_lse, 0) << "LSE off by >= 2e-2 + |ref|·2^-21; first: " << s.first_bad;
  EXPECT_EQ(s.gap_written, 0) << "O elements outside the view were written";
  EXPECT_EQ(s.bad_nan_rows, 0) << "rows not NaN where the reference is; first: " << s.first_bad;
  EXPECT_EQ(s.bad_max, 0) << "max_scores off by >= 5e-4 + |ref|·2^-18 (or not -inf / +inf / NaN); first: "
                          << s.first_bad;
  EXPECT_LT(s.rel, tol) << s.first_bad;
  EXPECT_LT(s.row_rel, row_tol) << s.first_bad;
}

class ForwardTest : public ::testing::TestWithParam<FwdCase> {};

TEST_P(ForwardTest, MatchesReference) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const FwdCase& c = GetParam();
  std::shared_ptr<Prepared> p = start(c).get();
  const Variant& var = variant(c.variant);
  EXPECT_EQ(p->mask.batch(), var.mask_batch ? c.B : 1);
  EXPECT_EQ(p->mask.heads(), var.mask_heads ? c.Hq : 1);
  double ms = 0;
  const std::unique_ptr<DeviceTablesMask> dt = c.device_tables ? device_tables_of(p->mask) : nullptr;
  Stats s = launch_and_check(c, *p->kernel, *p, dt ? dt->mask : p->mask, p->captures, p->ref, &ms);
  std::printf(
      "[ stats    ] rel %.2e  row %.2e  lse %.2e  max_abs %.2e  masked rows %ld  (compile %.1f s, ref %.1f "
      "s,%s)\n",
      s.rel, s.row_rel, s.lse_err, s.max_abs, s.masked_rows, p->compile_s, p->ref_s,
      p->caps.describe().c_str());
  g_summary.push_back({c.name(), s.rel, s.row_rel, s.lse_err, s.max_abs, p->compile_s, p->ref_s, ms,
                       s.masked_rows, s.max_err});
  expect_good(c, s);
  if (c.variant == "padding" && c.param >= c.Lq) {
    EXPECT_EQ(s.masked_rows, long(c.B) * c.Hq * c.Lq);
  }
  if (c.variant == "padding" && c.param < c.Lq) {
    EXPECT_EQ(s.masked_rows, long(c.B) * c.Hq * c.param);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ForwardTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FwdCase>& i) { return i.param.name(); });

// Runtime scalars are kernel arguments: two windows, one compiled kernel (one cache key), both
// launches right.
TEST(ForwardScalars, WindowChangesWithoutRecompiling) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  FwdCase c{"sliding", bf16, 64, 64, 1, 2, 2, 1000, 1000};
  const Variant& var = variant(c.variant);
  std::shared_ptr<Prepared> base;
  {
    FwdCase c7 = c;
    c7.param = 7;
    base = prepare(c7);
  }
  const fa::Kernel again = fa::compile(var.score(), var.mask(), c.options());
  EXPECT_EQ(again.cache_key(), base->kernel->cache_key());
  EXPECT_EQ(again.origin(), fa::CacheOrigin::kMemory);

  CaptureSet caps300;
  caps300.scalar_i32("window", 300);
  const fa::Captures cap300 = caps300.captures();
  const fa::BlockMask mask300 = again.block_mask(c.B, c.Hq, c.Lq, c.Lkv, cap300);
  EXPECT_NE(mask300.density().fraction, base->mask.density().fraction);
  ModPrograms progs = mod_programs(again.program());
  fa::Bindings env = caps300.bindings();
  fa::ReferenceOptions ro;
  ro.score_mod = &progs.score, ro.mask_mod = &progs.mask, ro.bindings = &env;
  ro.q_strides = base->q.stride, ro.k_strides = base->k.stride, ro.v_strides = base->v.stride;
  const fa::ReferenceResult ref300 = fa::reference_attention(
      {c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.dqk, c.dv}, base->in_vals.data() + base->q.offset,
      base->in_vals.data() + base->k.offset, base->in_vals.data() + base->v.offset, ro);

  // window 7 with the first kernel, then window 300 with the second handle (same module).
  Stats s7 = launch_and_check(c, *base->kernel, *base, base->mask, base->captures, base->ref);
  expect_good(c, s7);
  Stats s300 = launch_and_check(c, again, *base, mask300, cap300, ref300);
  expect_good(c, s300);
  // And the two references really differ (the scalar changed the result).
  double diff = 0;
  for (size_t i = 0; i < ref300.out.size(); ++i)
    diff = std::max(diff, std::abs(ref300.out[i] - base->ref.out[i]));
  EXPECT_GT(diff, 1e-2);
  std::printf("[ stats    ] window 7: rel %.2e row %.2e; window 300: rel %.2e row %.2e\n", s7.rel, s7.row_rel,
              s300.rel, s300.row_rel);
}

// ---- query rows of the tile vs the mask's blocks ---------------------------------------------

// Hopper's forward runs 192 query rows a CTA up to head dim 96 (192x128 to 64, 192x112 above
// without mods) and, without mods, at 113-128 (192x128 s2, P through shared memory); masks built from the
// kernel's mask_mod are regrouped to that (BlockMask::regrouped, covered by every such case above). Tables
// given as such keep flex_attention's meaning, where a full or empty tile overrides mask_mod, so they run on
// the 128x128 kernel instead: here block-causal tables (the diagonal tiles full) with a kernel whose mask_mod
// keeps everything must give block-causal attention, which a regrouping (a partial tile evaluating mask_mod)
// would not. Kv blocks of 256 are split into the wgmma kernel's BLOCK_N (one tile a block), which is exact
// for any tables.
TEST(ForwardTiles, GivenTablesKeepTheirMeaningOnTheWideTileKernel) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  for (const auto& [d, tile] : {std::pair{64, fa::TileConfig{192, 128, 16, 3}},
                                {96, fa::TileConfig{192, 112, 16, 3}},
                                {128, fa::TileConfig{192, 128, 16, 2}}})
    for (const int kvb : {128, 256}) {
      SCOPED_TRACE("d" + std::to_string(d) + " kv_block " + std::to_string(kvb));
      const FwdCase c{"none", bf16, d, d, 1, 2, 2, 1000, 1000};
      std::shared_ptr<Prepared> p = start(c).get();
      // Query block i (128 rows) sees the kv blocks j <= i * 128 / kvb, each full.
      const int nq = (c.Lq + 127) / 128, nkv = (c.Lkv + kvb - 1) / kvb;
      std::vector<int32_t> num(nq, 0), idx(size_t(nq) * nkv, 0), full_num(nq), full_idx(size_t(nq) * nkv, 0);
      for (int i = 0; i < nq; ++i) {
        full_num[size_t(i)] = i * 128 / kvb + 1;
        for (int j = 0; j <= i * 128 / kvb; ++j) full_idx[size_t(i) * nkv + j] = j;
      }
      const fa::BlockMask given =
          fa::BlockMask::from_kv_blocks(1, 1, c.Lq, c.Lkv, num, idx, full_num, full_idx, 128, kvb);
      EXPECT_FALSE(given.regroupable());
      EXPECT_TRUE(p->mask.matches_mask_mod());  // Kernel::block_mask's
      if (fa::rt::current_device_info().cc_major == 9) {
        EXPECT_EQ(p->kernel->spec().tile.block_m, tile.block_m) << p->kernel->spec().to_string();
        EXPECT_EQ(p->kernel->spec().tile.block_n, tile.block_n) << p->kernel->spec().to_string();
      }

      const fa::Program block_causal = fa::trace(
          fa::identity_score(), {"block_causal", [kvb](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                                   return kv / fa::Index(kvb) <= q / fa::Index(kvb);
                                 }});
      ModPrograms progs = mod_programs(block_causal);
      fa::ReferenceOptions ro;
      ro.mask_mod = &progs.mask;
      ro.q_strides = p->q.stride, ro.k_strides = p->k.stride, ro.v_strides = p->v.stride;
      const fa::ReferenceResult ref = fa::reference_attention(
          fa::ReferenceShape{c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.dqk, c.dv}, p->in_vals.data() + p->q.offset,
          p->in_vals.data() + p->k.offset, p->in_vals.data() + p->v.offset, ro);
      const Stats s = launch_and_check(c, *p->kernel, *p, given, p->captures, ref);
      std::printf(
          "[ stats    ] d%d, given block-causal tables, kv blocks of %d: rel %.2e row %.2e lse %.2e\n", d,
          kvb, s.rel, s.row_rel, s.lse_err);
      expect_good(c, s);
      // Merging such tables into taller blocks is refused with what to do instead.
      if (tile.block_m != 128) {
        const std::string from = "128x" + std::to_string(kvb),
                          to = std::to_string(tile.block_m) + "x" + std::to_string(tile.block_n);
        EXPECT_EQ(error_of([&, t = tile] { given.regrouped(t.block_m, t.block_n); }),
                  "block mask: its " + from + " blocks can be regrouped into " + to +
                      " only when the tables agree with mask_mod (a mask built by Kernel::block_mask or "
                      "create_block_mask) or hold one kind of tile; given tables, build them with blocks " +
                      to);
      }
    }
}

// ---- kv tables kept on the device (BlockMask::from_device_kv_blocks) -------------------------

// The kernels read such tables in place (the "devtables" cases above); what needs them on the
// host — kinds, the text form, the transposed tables — comes from one checked copy, equal to the
// host mask's; bad entries are reported there, and before a launch with
// FAJIT_CHECK_DEVICE_TABLES=1, naming the table and the tile.
TEST(DeviceTables, HostViewsComeFromOneCheckedCopy) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const FwdCase c{"sliding", f16, 64, 64, 2, 4, 1, 1000, 1000, 100};
  std::shared_ptr<Prepared> p = start(c).get();
  const std::unique_ptr<DeviceTablesMask> dt = device_tables_of(p->mask);
  EXPECT_TRUE(dt->mask.on_device());
  EXPECT_FALSE(p->mask.on_device());
  EXPECT_EQ(dt->mask.kinds(), p->mask.kinds());
  EXPECT_FALSE(dt->mask.regroupable());  // not looked for (a sync); the host mask's comes from mask_mod
  EXPECT_EQ(error_of([&] { (void)dt->mask.regrouped(128, 64); }),
            "block mask: its tables are on the device (from_device_kv_blocks), so its 128x128 blocks are not "
            "regrouped into 128x64; regroup a host_copy() (the tables as they are now)");
  EXPECT_EQ(dt->mask.host_copy().kinds(), p->mask.kinds());
  EXPECT_FALSE(dt->mask.host_copy().on_device());
  EXPECT_TRUE(p->mask.regroupable());
  EXPECT_EQ(dt->mask.to_string(), p->mask.to_string());
  EXPECT_EQ(dt->mask.q_indices(), p->mask.q_indices());
  EXPECT_EQ(dt->mask.full_q_num_blocks(), p->mask.full_q_num_blocks());

  // One bad entry among causal tables [1, 1, 8] / [1, 1, 8, 8].
  const int n = 8;
  std::vector<int32_t> tables(size_t(n) + size_t(n) * n, 0);
  for (int i = 0; i < n; ++i) {
    tables[size_t(i)] = i + 1;
    for (int j = 0; j <= i; ++j) tables[size_t(n) + size_t(i) * n + j] = j;
  }
  tables[size_t(n) + 5 * n + 2] = 99;
  fa::rt::DeviceBuffer buf(tables.size() * sizeof(int32_t));
  buf.upload(tables.data(), tables.size() * sizeof(int32_t));
  const fa::BlockMask bad = fa::BlockMask::from_device_kv_blocks(
      1, 1, c.Lq, c.Lkv, buf.as<const int32_t>(), buf.as<const int32_t>() + n, nullptr, nullptr);
  const std::string want = "kv_indices: entry 2 at (b=0, h=0, q-block=5) is 99, outside [0, 8)";
  EXPECT_EQ(error_of([&] { (void)bad.density(); }), want);
  // On a d128 kernel (its 128x128 tile takes the mask as it is: nothing else copies the tables).
  const FwdCase c128{"none", bf16, 128, 128, 2, 2, 2, 1000, 1000};
  std::shared_ptr<Prepared> p128 = start(c128).get();
  const fa::BlockMask bad2 = fa::BlockMask::from_device_kv_blocks(
      1, 1, c.Lq, c.Lkv, buf.as<const int32_t>(), buf.as<const int32_t>() + n, nullptr, nullptr);
  setenv("FAJIT_CHECK_DEVICE_TABLES", "1", 1);
  const std::string launched =
      error_of([&] { launch_and_check(c128, *p128->kernel, *p128, bad2, p128->captures, p128->ref); });
  unsetenv("FAJIT_CHECK_DEVICE_TABLES");
  EXPECT_NE(launched.find(want), std::string::npos) << launched;
  EXPECT_EQ(error_of([&] {
              fa::BlockMask::from_device_kv_blocks(1, 1, 100, 100, nullptr, nullptr, nullptr, nullptr);
            }),
            "block mask: kv_num_blocks and kv_indices are required (device tables)");
}

// A prepared case's Q, K and V uploaded once, as views with the case's strides.
struct DeviceInputs {
  fa::rt::DeviceBuffer buf;
  fa::TensorView q, k, v;
  DeviceInputs(const FwdCase& c, const Prepared& p) : buf(p.in_bits.size() * 2) {
    buf.upload(p.in_bits.data(), p.in_bits.size() * 2);
    auto view = [&](const Operand& o, int H, int L, int D) {
      return fa::TensorView(buf.as<uint16_t>() + o.offset, c.dtype, {c.B, H, L, D},
                            {o.stride[0], o.stride[1], o.stride[2], 1});
    };
    q = view(p.q, c.Hq, c.Lq, c.dqk), k = view(p.k, c.Hkv, c.Lkv, c.dqk), v = view(p.v, c.Hkv, c.Lkv, c.dv);
  }
};

// A mask the GPU builds (documents: its tiles are the GPU's to decide) has its tables built there
// too, and the d64 Hopper forward's 192x128 tile regroups it there: kept per stream; inside a
// CUDA-graph capture, made for the captured launch (its memory and kernels part of the graph),
// whose replay gives the eager call's bits. A mask is not built while its stream captures.
TEST(DeviceBuiltMask, RegroupedPerStreamAndInsideAGraph) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const FwdCase c{"document2d_causal", bf16, 64, 64, 3, 2, 2, 1000, 1000};  // the 192x128 tile
  std::shared_ptr<Prepared> p = start(c).get();
  ASSERT_TRUE(p->mask.built_on_device());
  fa::rt::ContextGuard guard;
  CUstream s1 = nullptr, s2 = nullptr, s3 = nullptr;
  for (CUstream* s : {&s1, &s2, &s3}) FA_CU(cuStreamCreate, s, CU_STREAM_NON_BLOCKING);
  const auto st1 = reinterpret_cast<fa::Stream>(s1), st2 = reinterpret_cast<fa::Stream>(s2);
  // A mask of the test's own, built on s1 (its memory freed there: it goes before the streams).
  std::optional<fa::BlockMask> own(p->kernel->block_mask(c.B, c.Hq, c.Lq, c.Lkv, p->captures, {}, st1));
  const fa::BlockMask& mask = *own;
  ASSERT_TRUE(mask.built_on_device());
  EXPECT_FALSE(mask.on_device());
  EXPECT_TRUE(mask.regroupable());  // built from the kernel's mask_mod
  EXPECT_EQ(mask.kinds(), p->mask.kinds());
  {
    const fa::BlockMask& r1 = mask.regrouped(192, 128, st1);
    EXPECT_EQ(&mask.regrouped(192, 128, st1), &r1);  // once per stream
    EXPECT_NE(&mask.regrouped(192, 128, st2), &r1);
    EXPECT_TRUE(r1.built_on_device());
    EXPECT_EQ(r1.kinds(), mask.host_copy().set_matches_mask_mod().regrouped(192, 128).kinds());
  }
  const DeviceInputs in(c, *p);
  const fa::TensorView &q = in.q, &k = in.k, &v = in.v;
  const size_t o_elems = size_t(c.B) * c.Hq * c.Lq * c.dv;
  fa::rt::DeviceBuffer d_eager(o_elems * 2), d_graph(o_elems * 2);
  const fa::TensorView o_eager(d_eager.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv}),
      o_graph(d_graph.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv});
  p->kernel->forward(q, k, v, o_eager, mask, p->captures, {}, st1);
  fa::rt::synchronize(s1);
  std::vector<uint16_t> eager(o_elems), graphed(o_elems);
  d_eager.download(eager.data(), o_elems * 2);

  // On s3, where the mask was never regrouped: the captured launch gets a regrouping of its own.
  d_graph.memset8(0xff);
  FA_CU(cuStreamBeginCapture, s3, CU_STREAM_CAPTURE_MODE_RELAXED);
  std::string captured_error;
  try {
    p->kernel->forward(q, k, v, o_graph, mask, p->captures, {}, reinterpret_cast<fa::Stream>(s3));
  } catch (const fa::Error& e) {
    captured_error = e.what();
  }
  CUgraph graph = nullptr;
  FA_CU(cuStreamEndCapture, s3, &graph);
  ASSERT_EQ(captured_error, "");
  ASSERT_NE(graph, nullptr);
  CUgraphExec exec = nullptr;
  FA_CU(cuGraphInstantiateWithFlags, &exec, graph, 0);
  for (int replay = 0; replay < 2; ++replay) {
    FA_CU(cuGraphLaunch, exec, s3);
    fa::rt::synchronize(s3);
    d_graph.download(graphed.data(), o_elems * 2);
    EXPECT_EQ(graphed, eager) << "replay " << replay;
    d_graph.memset8(0xff);
  }
  FA_CU(cuGraphExecDestroy, exec);
  FA_CU(cuGraphDestroy, graph);

  // Building a mask inside a capture is refused, naming what to do.
  FA_CU(cuStreamBeginCapture, s3, CU_STREAM_CAPTURE_MODE_RELAXED);
  const std::string build_error = error_of([&] {
    (void)p->kernel->block_mask(c.B, c.Hq, c.Lq, c.Lkv, p->captures, {}, reinterpret_cast<fa::Stream>(s3));
  });
  graph = nullptr;
  FA_CU(cuStreamEndCapture, s3, &graph);
  if (graph) FA_CU(cuGraphDestroy, graph);
  EXPECT_EQ(
      build_error,
      "block mask: not built while its stream is capturing a CUDA graph; build it before the capture (the "
      "graph's launches read its tables in place)");
  own.reset();  // the mask and its regroupings are freed on s1 and s2: before those go
  for (CUstream s : {s1, s2, s3}) {
    fa::rt::synchronize(s);
    FA_CU(cuStreamDestroy, s);
  }
}

// The kernels read device tables as they are at each call: rewritten between two launches (the
// same addresses, as a CUDA graph's replays see them), the second launch follows. With the
// mask's own tile (read in place) and with a tile that splits its kv blocks (V head dim 256:
// BLOCK_N 64, regrouped from a copy taken at each call). The tables alone decide: block-causal
// full tiles, then every tile full, under a kernel without mask_mod.
TEST(DeviceTables, KernelsReadTheTablesAsTheyAreAtEachCall) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const fa::Program block_causal =
      fa::trace(fa::identity_score(), {"block_causal", [](fa::Index, fa::Index, fa::Index q, fa::Index kv) {
                                         return kv / fa::Index(128) <= q / fa::Index(128);
                                       }});
  ModPrograms progs = mod_programs(block_causal);
  for (const int dv : {128, 256}) {
    SCOPED_TRACE("dv " + std::to_string(dv));
    const FwdCase c{"none", bf16, 128, dv, 1, 2, 2, 1000, 1000};
    std::shared_ptr<Prepared> p = start(c).get();
    fa::ReferenceOptions ro;
    ro.mask_mod = &progs.mask;
    ro.q_strides = p->q.stride, ro.k_strides = p->k.stride, ro.v_strides = p->v.stride;
    const fa::ReferenceResult ref_bc = fa::reference_attention(
        fa::ReferenceShape{c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.dqk, c.dv}, p->in_vals.data() + p->q.offset,
        p->in_vals.data() + p->k.offset, p->in_vals.data() + p->v.offset, ro);
    const int n = 8;  // 128-row and 128-key blocks of 1000
    // [num | idx | full_num | full_idx]: no partial tiles; full ones block-causal, then all.
    auto tables = [&](bool all) {
      std::vector<int32_t> t(size_t(2 * n + 2 * n * n), 0);
      for (int i = 0; i < n; ++i) {
        t[size_t(n + n * n + i)] = all ? n : i + 1;
        for (int j = 0; j < (all ? n : i + 1); ++j) t[size_t(2 * n + n * n + i * n + j)] = j;
      }
      return t;
    };
    fa::rt::DeviceBuffer buf(size_t(2 * n + 2 * n * n) * 4);
    const int32_t* at = buf.as<const int32_t>();
    const fa::BlockMask m = fa::BlockMask::from_device_kv_blocks(1, 1, c.Lq, c.Lkv, at, at + n,
                                                                 at + n + n * n, at + 2 * n + n * n);
    std::vector<int32_t> t = tables(false);
    buf.upload(t.data(), t.size() * 4);
    expect_good(c, launch_and_check(c, *p->kernel, *p, m, p->captures, ref_bc));
    t = tables(true);
    buf.upload(t.data(), t.size() * 4);
    expect_good(c, launch_and_check(c, *p->kernel, *p, m, p->captures, p->ref));
  }
}

// ---- autotuning (Options::autotune) ---------------------------------------------------------

// Every configuration autotuning may pick is right: each candidate compiled explicitly and
// checked like a case.
class AutotuneCandidates : public ::testing::TestWithParam<FwdCase> {};

TEST_P(AutotuneCandidates, EachMatchesTheReference) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const FwdCase& c = GetParam();
  std::shared_ptr<Prepared> p = start(c).get();
  const bool has_score_mod = !p->kernel->program().score_is_identity();
  const std::vector<fa::KernelSpec> specs = fa::forward_tune_candidates(p->kernel->spec(), has_score_mod);
  EXPECT_GE(specs.size(), 2u);
  for (const fa::KernelSpec& spec : specs) {
    SCOPED_TRACE(spec.to_string());
    FwdCase e = c;
    e.family = spec.family, e.tile = spec.tile;
    const fa::Kernel k = fa::compile(p->kernel->program(), e.options());
    EXPECT_EQ(k.spec(), spec);
    const Stats s = launch_and_check(e, k, *p, p->mask, p->captures, p->ref);
    std::printf("[ stats    ] %s: rel %.2e row %.2e lse %.2e\n", spec.to_string().c_str(), s.rel, s.row_rel,
                s.lse_err);
    expect_good(e, s);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, AutotuneCandidates,
                         ::testing::Values(FwdCase{"causal_alibi", bf16, 128, 128, 1, 4, 2, 1000, 777},
                                           FwdCase{"document_softcap", f16, 64, 64, 1, 4, 1, 1000, 1000},
                                           FwdCase{"sliding", bf16, 80, 80, 2, 2, 1, 1000, 1000, 100},
                                           FwdCase{"prefix_lm", f16, 192, 128, 1, 2, 2, 1000, 1000, 300},
                                           FwdCase{"padding", bf16, 256, 256, 1, 2, 1, 777, 1000, 333}),
                         [](const ::testing::TestParamInfo<FwdCase>& i) { return i.param.name(); });

// A variant no earlier run has tuned (its choice would be in the cache directory already).
float fresh_salt() {
  static std::mt19937 rng(std::random_device{}());
  return 0.5f + float(rng() % 1000000) * 1e-6f;
}

TEST(Autotune, ChoosesOncePerShapeClassAndFindsTheChoiceAgainInTheCache) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  FwdCase c{"causal", bf16, 128, 128, 2, 8, 2, 2048, 2048};
  c.autotune = true, c.salt = fresh_salt();
  std::shared_ptr<Prepared> p = prepare(c);
  const fa::Kernel& k = *p->kernel;
  ASSERT_TRUE(k.autotunes());
  expect_good(c, launch_and_check(c, k, *p, p->mask, p->captures, p->ref));
  const std::vector<fa::TuneRecord> r = k.tune_records();
  ASSERT_EQ(r.size(), 1u);
  std::printf("[ autotune ] %s\n", fa::to_string(r[0]).c_str());
  EXPECT_EQ(r[0].origin, fa::TuneRecord::Origin::kTuned);
  EXPECT_EQ(r[0].shape_class, "bh16 q2048 kv2048 blk128x128");
  const std::vector<fa::KernelSpec> specs = fa::forward_tune_candidates(k.spec(), true);
  EXPECT_EQ(r[0].timed.size(), specs.size()) << "every candidate compiled, launched and timed";
  EXPECT_NE(std::find(specs.begin(), specs.end(), r[0].chosen), specs.end());
  for (const auto& [spec, ms] : r[0].timed) EXPECT_GT(ms, 0.0f) << spec.to_string();
  // The timing budget is 200 ms plus one launch of each candidate (tens of microseconds here).
  EXPECT_LT(r[0].time_s, 0.5);

  // The same class again: the choice stands, nothing is timed.
  expect_good(c, launch_and_check(c, k, *p, p->mask, p->captures, p->ref));
  EXPECT_EQ(k.tune_records().size(), 1u);
  // A second Kernel of the variant (a new process would read the same record from disk).
  const fa::Kernel again = fa::compile(k.program(), c.options());
  expect_good(c, launch_and_check(c, again, *p, p->mask, p->captures, p->ref));
  const std::vector<fa::TuneRecord> r2 = again.tune_records();
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].origin, fa::TuneRecord::Origin::kStored);
  EXPECT_EQ(r2[0].chosen, r[0].chosen);
  EXPECT_EQ(r2[0].device, r[0].device);
}

// With autotuning on, fa::compile starts the candidates' compiles on background threads beside
// the default's (kernel.cpp, start_candidate_compiles), so the first call of a shape class finds
// them compiled, or waits for compiles already running, instead of compiling them itself. A
// fresh variant has none of them in the cache; with earlier tests' background compiles joined
// first, every slot but the one kept for a backward takes a candidate, and those are not
// compiled at the call.
TEST(Autotune, CompilesTheCandidatesBesideTheDefault) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  fa::detail::wait_for_background_compiles();
  FwdCase c{"causal", bf16, 64, 64, 1, 4, 2, 1000, 1000};
  c.autotune = true, c.salt = fresh_salt();
  std::shared_ptr<Prepared> p = prepare(c);
  const fa::Kernel& k = *p->kernel;
  EXPECT_EQ(k.origin(), fa::CacheOrigin::kCompiled) << "a fresh variant";
  expect_good(c, launch_and_check(c, k, *p, p->mask, p->captures, p->ref));
  const std::vector<fa::TuneRecord> r = k.tune_records();
  ASSERT_EQ(r.size(), 1u);
  std::printf("[ autotune ] %s\n", fa::to_string(r[0]).c_str());
  ASSERT_EQ(r[0].origin, fa::TuneRecord::Origin::kTuned);
  const int others = static_cast<int>(fa::forward_tune_candidates(k.spec(), true).size()) - 1;
  const int started = static_cast<int>(fa::detail::background_compile_slots()) - 1;
  ASSERT_GE(others, 2);
  EXPECT_EQ(r[0].compiled_at_call, std::max(0, others - started))
      << others << " candidates, " << started << " started in the background";
}

// A choice an earlier process stored (written into the cache here first) that is not the
// default: the forward runs it without timing anything, and its output is right.
TEST(Autotune, RunsAStoredChoiceThatIsNotTheDefault) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  FwdCase c{"causal_alibi", bf16, 128, 128, 1, 4, 2, 1000, 1000};
  c.autotune = true, c.salt = fresh_salt();
  std::shared_ptr<Prepared> p = prepare(c);
  const fa::Kernel& k = *p->kernel;
  const std::vector<fa::KernelSpec> specs = fa::forward_tune_candidates(k.spec(), true);
  ASSERT_GE(specs.size(), 3u);
  std::string device;
  {
    fa::rt::ContextGuard guard;
    device = fa::rt::current_device_info().name;
  }
  fa::TuneRecord stored;
  stored.shape_class = fa::detail::shape_class({int64_t(c.B) * c.Hq, c.Lq, c.Lkv, 128, 128});
  stored.device = device;
  stored.chosen = specs.back();  // mma.sync 64x64: never the default on sm_90a
  const std::string text = fa::detail::tune_record_text(stored);
  fa::jit::Cache::global().get_or_compile(
      fa::detail::tune_record_key(k.cache_key(), device, stored.shape_class, specs), [&] { return text; },
      "autotune (test)");
  expect_good(c, launch_and_check(c, k, *p, p->mask, p->captures, p->ref));
  const std::vector<fa::TuneRecord> r = k.tune_records();
  ASSERT_EQ(r.size(), 1u);
  std::printf("[ autotune ] %s\n", fa::to_string(r[0]).c_str());
  EXPECT_EQ(r[0].origin, fa::TuneRecord::Origin::kStored);
  EXPECT_EQ(r[0].chosen, specs.back());
  EXPECT_FALSE(r[0].chosen == k.spec());
}

TEST(Autotune, NotTimedWhenOffWhenOHoldsAnInputOrWhileAGraphIsCaptured) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  FwdCase c{"causal", bf16, 64, 64, 1, 4, 4, 1000, 1000};
  c.autotune = true, c.salt = fresh_salt();
  std::shared_ptr<Prepared> p = prepare(c);
  {
    fa::test::ScopedEnv env("FAJIT_AUTOTUNE", "0");
    fa::Options o = c.options();
    o.autotune.reset();
    const fa::Kernel off = fa::compile(p->kernel->program(), o);
    EXPECT_FALSE(off.autotunes());
    expect_good(c, launch_and_check(c, off, *p, p->mask, p->captures, p->ref));
    EXPECT_TRUE(off.tune_records().empty());
  }
  fa::rt::ContextGuard guard;
  const DeviceInputs in(c, *p);
  const fa::TensorView &q = in.q, &k = in.k, &v = in.v;
  fa::rt::DeviceBuffer d_o(size_t(c.B) * c.Hq * c.Lq * c.dv * 2);
  const fa::TensorView o(d_o.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv});
  // O in Q's memory (timing would run the kernel on its own output) is refused before anything
  // runs or is timed.
  EXPECT_EQ(fa::test::error_of([&] { p->kernel->forward(q, k, v, q, p->mask, p->captures); }),
            "o: its memory overlaps that of q; give it a buffer of its own");
  EXPECT_TRUE(p->kernel->tune_records().empty());

  // Captured into a graph: no synchronization is allowed, the default kernel is captured.
  CUstream stream = nullptr;
  FA_CU(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  FA_CU(cuStreamBeginCapture, stream, CU_STREAM_CAPTURE_MODE_RELAXED);
  p->kernel->forward(q, k, v, o, p->mask, p->captures, {}, reinterpret_cast<fa::Stream>(stream));
  CUgraph graph = nullptr;
  FA_CU(cuStreamEndCapture, stream, &graph);
  ASSERT_NE(graph, nullptr);
  FA_CU(cuGraphDestroy, graph);
  EXPECT_TRUE(p->kernel->tune_records().empty());
  FA_CU(cuStreamDestroy, stream);

  // An ordinary call of the same class then tunes it.
  expect_good(c, launch_and_check(c, *p->kernel, *p, p->mask, p->captures, p->ref));
  const std::vector<fa::TuneRecord> r = p->kernel->tune_records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].origin, fa::TuneRecord::Origin::kTuned);
  std::printf("[ autotune ] %s\n", fa::to_string(r[0]).c_str());
}

}  // namespace
}  // namespace fa_gpu_test
