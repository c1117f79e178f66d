// fa::Kernel::backward on the GPU against fa::reference_attention_backward (float64) over the
// interpreter programs of the same fa IR.
//
// Per case: random Q, K, V, dO (and dLSE where the case says), rounded to the dtype on the host so
// the reference reads exactly what the GPU reads; the forward kernel produces O and LSE, then
// dQ, dK, dV (poisoned with NaN first) come from the backward. Every element must be written,
// nothing may be NaN, rows the mask empties and keys no query sees must get exactly zero, and
//   ||dX - ref|| / ||ref||  < 3e-2 bf16, 1e-2 f16   for X = Q, K, V (whole tensors)
// (P and dS enter the MMAs as 16-bit values, and Δ uses the kernel's own 16-bit O).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

#include "fajit/detail/program_impl.h"
#include "fajit/runtime/device.h"
#include "gpu_harness.h"

namespace fa_gpu_test {
namespace {

struct BwdCase {
  std::string variant;
  fa::DType dtype;
  int dqk, dv;
  int B, Hq, Hkv, Lq, Lkv;
  int param = -1;  // the variant's knob (window, prefix, n_pad, ...); < 0: default
  std::string tag = "";
  bool dlse = false;           // the loss also uses the LSE (dLSE != 0)
  bool noncontig = false;      // inputs and gradients as slices of [B, L, Hq + 2 Hkv, D] buffers
  float scale = 0.0f;          // 0: default 1/sqrt(dqk)
  bool deterministic = false;  // BackwardOptions::deterministic: also bit-identical over two runs
  // kAuto: the backward the host picks (wgmma on sm_90a); kMmaSync: forced
  // (fa::Options::family, which the backward follows).
  fa::KernelFamily family = fa::KernelFamily::kAuto;
  bool row_reductions = false;    // FAJIT_TMA=0: the Hopper dK/dV kernel reduces dQ row by row
  bool strided_captures = false;  // buffers at an innermost stride of 2: the wide-captures twins
  int kv_block = 0;               // the block mask's kv_block (0: the default, 128)
  bool device_tables = false;     // the mask's kv tables on the device (device_tables_of): the
                                  // forward reads them in place, the backward's q tables are derived
                                  // from them on the GPU (rt::derive_device_kinds)

  std::string name() const {
    std::string n = variant + "_" + fa::dtype_name(dtype) + "_d" + std::to_string(dqk) + "x" +
                    std::to_string(dv) + "_b" + std::to_string(B) + "h" + std::to_string(Hq) + "g" +
                    std::to_string(Hq / Hkv) + "_" + std::to_string(Lq) + "x" + std::to_string(Lkv);
    if (!tag.empty()) n += "_" + tag;
    if (family == fa::KernelFamily::kMmaSync) n += "_mma";
    return n;
  }
};
void PrintTo(const BwdCase& c, std::ostream* os) { *os << c.name(); }

constexpr fa::DType bf16 = fa::DType::bf16, f16 = fa::DType::f16;

BwdCase with(BwdCase c, const std::string& tag, std::function<void(BwdCase&)> f) {
  c.tag = tag;
  f(c);
  return c;
}

// The mask-only library mods (score_mod gradients arrive with the differentiation pass) at both
// dtypes and every head-dim pair, lengths 1 / 17 / 1000 / 4097 with Lq != Lkv both ways, GQA 1,
// 2, 4, 8, fully masked rows, keys no query sees, dLSE, a scale, non-contiguous tensors.
const std::vector<BwdCase>& cases() {
  static const std::vector<BwdCase> all = {
      //  variant              dtype dqk  dv  B  Hq Hkv   Lq    Lkv  param
      {"none", bf16, 128, 128, 2, 2, 2, 1000, 1000},
      {"none", f16, 64, 64, 1, 8, 1, 17, 17},
      with({"none", f16, 64, 64, 1, 2, 2, 1000, 1000}, "scale", [](BwdCase& c) { c.scale = 0.3f; }),
      {"causal", bf16, 64, 64, 1, 2, 2, 4097, 4097},
      {"causal", f16, 128, 64, 2, 4, 1, 1000, 4097},
      {"causal", bf16, 128, 128, 1, 4, 1, 1, 1},
      with({"causal", bf16, 64, 128, 1, 4, 4, 4097, 1000}, "dlse", [](BwdCase& c) { c.dlse = true; }),
      {"sliding", bf16, 128, 128, 1, 8, 1, 4097, 4097, 200},
      {"sliding", f16, 64, 64, 2, 4, 1, 1000, 1000, 100},
      {"sliding", bf16, 64, 128, 1, 4, 4, 17, 17, 5},
      {"document2d_causal", bf16, 64, 64, 3, 2, 2, 1000, 1000},
      {"head_sliding", f16, 128, 128, 1, 4, 2, 1000, 1000},
      with({"prefix_lm", f16, 128, 128, 1, 4, 2, 1000, 1000, 300}, "dlse", [](BwdCase& c) { c.dlse = true; }),
      {"prefix_lm", bf16, 128, 64, 2, 8, 1, 17, 17, 5},
      {"padding", bf16, 64, 64, 2, 4, 4, 1000, 1000, 333},
      with({"padding", f16, 128, 64, 1, 4, 4, 17, 1000, 17}, "allmasked", [](BwdCase&) {}),
      // a NaN dLSE on rows with no key (0 · NaN of a torch.where guarding the -inf LSE upstream):
      // the backward drops Δ there, so no gradient turns NaN (also deterministic, and wide heads)
      with({"padding", bf16, 128, 128, 1, 4, 2, 17, 1000, 17}, "allmasked_nandlse",
           [](BwdCase& c) { c.dlse = true; }),
      with({"padding", f16, 64, 64, 1, 4, 4, 17, 300, 17}, "allmasked_nandlse_det",
           [](BwdCase& c) { c.dlse = true, c.deterministic = true; }),
      with({"padding", bf16, 192, 128, 1, 4, 2, 17, 300, 17}, "allmasked_nandlse",
           [](BwdCase& c) { c.dlse = true; }),
      {"dilated", f16, 64, 128, 1, 4, 1, 4097, 1000, 200},
      with({"document2d_causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "devtables",
           [](BwdCase& c) { c.device_tables = true; }),
      // device kv tables whose transposed tables are derived on the GPU: GQA, Lq != Lkv with tail
      // blocks, deterministic, a broadcast head
      with({"sliding", f16, 64, 64, 2, 8, 2, 777, 1000, 300}, "devtables_det",
           [](BwdCase& c) { c.device_tables = true, c.deterministic = true; }),
      with({"causal", bf16, 128, 128, 1, 4, 4, 1000, 4097}, "devtables",
           [](BwdCase& c) { c.device_tables = true; }),
      with({"causal", bf16, 128, 128, 2, 4, 2, 1000, 1000}, "noncontig",
           [](BwdCase& c) { c.noncontig = true; }),
      with({"sliding", f16, 64, 64, 1, 8, 1, 17, 1000, 300}, "noncontig_dlse",
           [](BwdCase& c) { c.noncontig = true, c.dlse = true; }),
      // score_mods through their derivative (fa-differentiate): ALiBi (dS = dT), softcap
      // (1 - tanh^2), and captured-bias gradients (slopes[h], rel_bias[q - kv + offset]).
      {"causal_alibi", bf16, 128, 128, 1, 8, 1, 1000, 1000},
      {"causal_alibi", f16, 64, 128, 2, 4, 4, 17, 1000},
      {"alibi_slopes", f16, 128, 128, 1, 4, 1, 1000, 17},
      {"alibi_slopes", bf16, 64, 64, 2, 8, 2, 1, 4097},
      // kv-linear with slopes of 2^80 and FLT_MAX beside ordinary ones: the dK/dV kernel's FMA
      // form and its plain fallback in one CTA row, whole and tail query tiles.
      {"slope_extremes", bf16, 128, 128, 1, 8, 2, 1000, 1000, 1},
      {"slope_extremes", f16, 64, 64, 2, 4, 4, 256, 4097, 1},
      // Interval masks (kMaskKvRange: the dQ side masks partial tiles by their bounds), bounds at
      // int32's ends, empty rows, tails both ways.
      {"kv_range_extremes", bf16, 128, 128, 1, 12, 2, 1000, 1000},
      {"kv_range_extremes", f16, 64, 64, 2, 12, 4, 17, 1000},
      {"kv_range_extremes", bf16, 192, 128, 1, 12, 3, 1000, 777},  // the wide-head Hopper kernels
      {"query_slope", bf16, 128, 128, 2, 4, 2, 1000, 1000},
      {"document_softcap", bf16, 64, 128, 1, 4, 1, 4097, 4097},
      {"document_softcap", f16, 128, 128, 1, 2, 2, 17, 1000},
      // The mods' values by query gathered across a warp ahead of Sᵀ and shuffled (a float for
      // score_mod, a bool for mask_mod; by key once per CTA) on the Hopper dK/dV kernel: both
      // BLOCK_Ms, tails both ways, GQA, and the buffer gradient of the per-key bias.
      {"key_pad_bias", bf16, 64, 64, 2, 4, 2, 1000, 777},
      {"key_pad_bias", f16, 128, 128, 1, 8, 2, 17, 4097},
      {"key_pad_bias", bf16, 64, 64, 1, 4, 4, 4097, 1000},
      // Key blocks no query sees (CTAs of the Hopper dK/dV kernel with no tile to walk: the
      // consumers' stagger and tile-end barriers must not wait for one), at D 128 and in the
      // split-by-keys dQ configuration (D 64 with a score_mod that keeps a value per score).
      {"sliding", bf16, 128, 128, 1, 4, 2, 17, 1000, 100},
      {"document_softcap", bf16, 64, 64, 1, 4, 2, 17, 1000},
      {"relative_bias", bf16, 128, 64, 1, 2, 1, 17, 4097},
      {"relative_bias", f16, 64, 64, 2, 4, 4, 1000, 1000},
      // buffers at an innermost stride of 2 (poison between): the wide-captures twins, with the
      // buffer gradient
      with({"relative_bias", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "stridedcaps",
           [](BwdCase& c) { c.strided_captures = true; }),
      with({"document_softcap", f16, 64, 64, 1, 4, 1, 1000, 1000}, "stridedcaps",
           [](BwdCase& c) { c.strided_captures = true; }),
      // d64 with a score_mod (BLOCK_M 64 on sm_90a): GQA groups and several query tiles per
      // key block, so the consumer warpgroups' dQ parts and stages interleave.
      {"document_softcap", bf16, 64, 64, 1, 4, 2, 300, 300},
      // scores far past the cap (scale 2: tanh saturated, its derivative near 0) and near it
      with({"document_softcap", f16, 128, 128, 1, 4, 2, 1000, 1000}, "hot",
           [](BwdCase& c) { c.scale = 2.0f; }),
      {"causal_alibi", f16, 64, 64, 1, 8, 2, 1000, 1000},
      // The Hopper dK/dV kernel's row-by-row dQ reductions (FAJIT_TMA=0, also taken where the
      // driver refuses the dQ accumulator's tensor map): dQ parts split by columns (d128, its
      // 256-byte staging rows with 3 stages), by rows (d64), by keys (d64 with a score_mod
      // whose derivative keeps a value per score: both warpgroups reduce into the same rows);
      // tail tiles, GQA, non-contiguous.
      with({"causal", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"sliding", f16, 64, 64, 2, 4, 4, 700, 700, 200}, "rowred_noncontig",
           [](BwdCase& c) { c.row_reductions = true, c.noncontig = true; }),
      with({"causal_alibi", bf16, 64, 64, 1, 8, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"document_softcap", bf16, 64, 64, 1, 4, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"relative_bias", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      // 256-key blocks: several dK/dV CTAs (BLOCK_N 128 on sm_90a, 64 or 128 on mma.sync) walk each
      // transposed row, and the forward walks two or more key tiles per block.
      with({"causal", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "kvb256", [](BwdCase& c) { c.kv_block = 256; }),
      with({"document_softcap", f16, 64, 64, 1, 4, 2, 1000, 777}, "kvb256",
           [](BwdCase& c) { c.kv_block = 256; }),
      {"self_ratio", f16, 64, 128, 1, 6, 3, 201, 182},
      {"self_ratio", bf16, 128, 128, 1, 4, 2, 1000, 1000},
      with({"self_ratio", bf16, 64, 64, 1, 4, 4, 17, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      // Deterministic mode: dQ's sums in a fixed order (sm_90a up to 128: in the dK/dV kernel,
      // key-block order; mma.sync and wide heads: its own kernel over the forward tables).
      with({"causal", bf16, 128, 128, 2, 8, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"padding", f16, 64, 64, 2, 4, 4, 1000, 1000, 333}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"sliding", bf16, 64, 128, 1, 4, 1, 4097, 1000, 200}, "det_dlse",
           [](BwdCase& c) { c.deterministic = true, c.dlse = true; }),
      with({"document2d_causal", f16, 128, 64, 2, 2, 1, 17, 1000}, "det_noncontig",
           [](BwdCase& c) { c.deterministic = true, c.noncontig = true; }),
      // A mask_mod that reads a buffer without a score_mod, up to head dim 64 (BLOCK_M 128 on
      // sm_90a): the producer publishes each tile to the consumers (TileInfo). GQA 4 over keys no
      // query sees (CTAs with no tile: the end marker alone), deterministic, 32 columns, dLSE
      // with non-contiguous tensors, 256-key blocks.
      {"document2d_causal", f16, 64, 64, 2, 8, 2, 17, 1000},
      with({"document2d_causal", bf16, 64, 64, 1, 4, 2, 1000, 777}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      {"document2d_causal", bf16, 32, 32, 2, 4, 4, 300, 300},
      with({"document2d_causal", f16, 64, 64, 2, 4, 1, 4097, 1000}, "dlse_noncontig",
           [](BwdCase& c) { c.dlse = true, c.noncontig = true; }),
      with({"document2d_causal", bf16, 64, 64, 1, 4, 2, 1000, 1000}, "kvb256",
           [](BwdCase& c) { c.kv_block = 256; }),
      // Head dims beyond 64 / 128: odd chunk counts (40, 72, 80, 136), padded shared rows, QK !=
      // V; above 256 columns (192/128, 256/256, 200/72) the mma.sync dK/dV grid splits in a dV
      // part and a dK + dQ part (buffer gradients in the dK part only, once). On sm_90a every
      // one takes the Hopper kernel, above 128 its wide-head config; up to 128 dQ split by rows (32, 40
      // without a score_mod),
      // by keys (40, 48 with one: n 48), by 64-column blocks (72 .. 112: the second block's
      // columns past D dropped), each through the tensor map and row by row.
      {"causal", bf16, 32, 32, 2, 4, 2, 1000, 1000},
      {"document_softcap", f16, 40, 40, 1, 4, 1, 17, 1000},
      {"alibi_slopes", bf16, 80, 80, 1, 4, 4, 1000, 4097},
      {"sliding", f16, 96, 96, 2, 4, 2, 4097, 4097, 200},
      {"relative_bias", bf16, 136, 112, 1, 2, 1, 1000, 1000},
      with({"causal_alibi", bf16, 96, 64, 1, 4, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"prefix_lm", f16, 80, 48, 1, 4, 2, 1000, 1000, 300}, "noncontig_dlse",
           [](BwdCase& c) { c.noncontig = true, c.dlse = true; }),
      {"causal", bf16, 192, 128, 2, 4, 1, 1000, 1000},
      {"relative_bias", f16, 256, 256, 1, 4, 2, 17, 1000},
      {"document_softcap", bf16, 256, 256, 1, 2, 2, 1000, 1000},
      with({"sliding", f16, 200, 72, 1, 4, 4, 1000, 4097, 200}, "dlse", [](BwdCase& c) { c.dlse = true; }),
      with({"causal", bf16, 96, 96, 2, 4, 2, 1000, 1000}, "noncontig",
           [](BwdCase& c) { c.noncontig = true; }),
      with({"document_softcap", bf16, 72, 72, 1, 4, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"causal_alibi", f16, 112, 112, 1, 8, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      {"relative_bias", bf16, 48, 48, 1, 4, 4, 300, 700},
      {"sliding", bf16, 80, 80, 1, 4, 1, 17, 1000, 100},
      with({"none", bf16, 40, 40, 2, 4, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"document_softcap", f16, 80, 80, 1, 4, 2, 1000, 1000}, "rowred",
           [](BwdCase& c) { c.row_reductions = true; }),
      with({"alibi_slopes", bf16, 192, 128, 1, 4, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"causal", f16, 256, 256, 2, 2, 1, 17, 1000}, "noncontig", [](BwdCase& c) { c.noncontig = true; }),
      // The wide-head Hopper kernel (a head dim above 128): 64-key CTAs, dK / dV transposed; at
      // 160 the dQ blocks past the pitch, at 64/256 one QK block (warpgroup 1's dQ part all past
      // DQK), 256/128 and 128/256 blocks of their own, zero-tile CTAs (Lq 17), GQA 8.
      {"causal", f16, 160, 160, 1, 4, 2, 1000, 1000},
      {"sliding", bf16, 64, 256, 1, 4, 2, 1000, 1000, 200},
      {"alibi_slopes", bf16, 256, 128, 1, 8, 1, 1000, 1000},
      {"document_softcap", f16, 128, 256, 1, 4, 4, 17, 1000},
      with({"relative_bias", bf16, 256, 256, 1, 2, 1, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"prefix_lm", bf16, 144, 144, 2, 2, 2, 1000, 700, 300}, "dlse", [](BwdCase& c) { c.dlse = true; }),
      // Deterministic mode on the Hopper kernel up to 128 (dQ parts added in key-block order, a
      // counter per 64 query rows): 33 CTAs into every query tile (by turns, GQA 4; split by
      // rows at BLOCK_M 128), split by columns (softcap at 128), 256-key blocks (two CTAs a
      // block), row-by-row reductions.
      with({"none", bf16, 128, 128, 1, 4, 1, 300, 4097}, "det", [](BwdCase& c) { c.deterministic = true; }),
      with({"causal", f16, 64, 64, 1, 4, 2, 4097, 4097}, "det", [](BwdCase& c) { c.deterministic = true; }),
      with({"document_softcap", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "det",
           [](BwdCase& c) { c.deterministic = true; }),
      with({"causal", bf16, 128, 128, 1, 4, 2, 1000, 1000}, "kvb256_det",
           [](BwdCase& c) { c.kv_block = 256, c.deterministic = true; }),
      with({"causal_alibi", bf16, 64, 64, 1, 8, 2, 1000, 1000}, "rowred_det",
           [](BwdCase& c) { c.row_reductions = true, c.deterministic = true; }),
      // At BLOCK_M 128 a last tile whose second 64 rows lie past Lq (300 = 2 x 128 + 44): that
      // part's counter lies past ceil(Lq / 64), and 8 CTAs write every tile of 4 heads.
      with({"none", f16, 64, 64, 1, 4, 2, 300, 1000}, "det", [](BwdCase& c) { c.deterministic = true; }),
  };
  return all;
}

struct Operand {
  int64_t offset = 0;
  std::array<int64_t, 4> stride{};
};

// One [B, H, L, D] operand layout per tensor; the gradient buffer mirrors the input buffer.
struct Layout {
  Operand q, k, v;
  int64_t total = 0;
};

Layout layout_of(const BwdCase& c) {
  Layout l;
  if (c.noncontig) {
    const int64_t L = std::max(c.Lq, c.Lkv), Ht = c.Hq + 2 * c.Hkv, D = std::max(c.dqk, c.dv);
    const std::array<int64_t, 4> s{L * Ht * D, D, Ht * D, 1};
    l.q = {0, s}, l.k = {c.Hq * D, s}, l.v = {(c.Hq + c.Hkv) * D, s};
    l.total = c.B * L * Ht * D;
    return l;
  }
  auto contiguous = [&](int H, int L, int D) {
    Operand o{l.total, {int64_t(H) * L * D, int64_t(L) * D, D, 1}};
    l.total += int64_t(c.B) * H * L * D;
    l.total = (l.total + 63) / 64 * 64;  // 128-byte aligned operands
    return o;
  };
  l.q = contiguous(c.Hq, c.Lq, c.dqk);
  l.k = contiguous(c.Hkv, c.Lkv, c.dqk);
  l.v = contiguous(c.Hkv, c.Lkv, c.dv);
  return l;
}

struct GradStats {
  double rel = 0, max_abs = 0;
  long nan = 0, nonzero_masked = 0;
  std::string first_bad;
};

// Compares one gradient tensor [B, H, L, D] (16-bit, strided) with the reference (contiguous);
// rows with no_flow[(b * H + h) * L + row] set (no gradient can reach them) must be exactly 0.
GradStats compare(const char* what, const BwdCase& c, const std::vector<uint16_t>& bits, const Operand& op,
                  int H, int L, int D, const std::vector<double>& ref, const std::vector<bool>& no_flow) {
  GradStats s;
  double e2 = 0, r2 = 0;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < L; ++i) {
        const double* rrow = ref.data() + ((size_t(b) * H + h) * L + i) * D;
        const uint16_t* grow =
            bits.data() + op.offset + b * op.stride[0] + h * op.stride[1] + int64_t(i) * op.stride[2];
        const bool ref_zero = no_flow[(size_t(b) * H + h) * L + i];
        for (int d = 0; d < D; ++d) {
          const float g = from_bits(c.dtype, grow[d]);
          const std::string where = std::string(what) + " b=" + std::to_string(b) +
                                    " h=" + std::to_string(h) + " row=" + std::to_string(i) +
                                    " d=" + std::to_string(d);
          if (std::isnan(g)) {
            if (s.first_bad.empty()) s.first_bad = "NaN / unwritten at " + where;
            ++s.nan;
            continue;
          }
          if (ref_zero && g != 0.0f) {
            if (s.first_bad.empty())
              s.first_bad = "nonzero " + std::to_string(g) + " where no gradient flows, " + where;
            ++s.nonzero_masked;
          }
          const double e = double(g) - rrow[d];
          e2 += e * e, r2 += rrow[d] * rrow[d];
          s.max_abs = std::max(s.max_abs, std::abs(e));
        }
      }
  s.rel = r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
  return s;
}

class BackwardTest : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardTest, MatchesReference) {
  if (!fa::rt::cuda_available()) GTEST_SKIP() << "no CUDA device: " << fa::rt::cuda_unavailable_reason();
  const BwdCase& c = GetParam();
  const Variant& var = variant(c.variant);
  fa::Options opt;
  opt.dtype = c.dtype, opt.head_dim_qk = c.dqk, opt.head_dim_v = c.dv;
  opt.family = c.family;
  const fa::Kernel kernel = fa::compile(var.score(), var.mask(), opt);
  const bool want_wgmma = c.family != fa::KernelFamily::kMmaSync && kernel.spec().arch == "sm_90a";
  EXPECT_EQ(kernel.backward_spec().family, want_wgmma ? fa::KernelFamily::kWgmma : fa::KernelFamily::kMmaSync)
      << kernel.backward_spec().to_string();

  std::mt19937 rng(static_cast<uint32_t>(fnv1a(c.name())));
  CaptureSet caps;
  var.fill(caps, Dims{c.B, c.Hq, c.Lq, c.Lkv}, c.param, rng);
  caps.upload(c.strided_captures);
  const fa::Captures captures = caps.captures();
  fa::BlockMaskOptions mask_options;
  if (c.kv_block > 0) mask_options.kv_block = c.kv_block;
  const fa::BlockMask built = kernel.block_mask(c.B, c.Hq, c.Lq, c.Lkv, captures, mask_options);
  const std::unique_ptr<DeviceTablesMask> dt = c.device_tables ? device_tables_of(built) : nullptr;
  const fa::BlockMask& mask = dt ? dt->mask : built;

  // Host inputs: Q, K, V in one buffer; dO and dLSE contiguous.
  const Layout lay = layout_of(c);
  std::vector<uint16_t> in_bits(size_t(lay.total));
  std::vector<float> in_vals(size_t(lay.total));
  std::uniform_real_distribution<float> u(-2.0f, 2.0f), ud(-1.0f, 1.0f);
  for (size_t i = 0; i < in_bits.size(); ++i) {
    in_bits[i] = to_bits(c.dtype, u(rng));
    in_vals[i] = from_bits(c.dtype, in_bits[i]);
  }
  const size_t rows = size_t(c.B) * c.Hq * c.Lq, o_elems = rows * c.dv;
  std::vector<uint16_t> do_bits(o_elems);
  std::vector<double> do_vals(o_elems), dlse_vals(rows, 0.0);
  std::vector<float> dlse_f(rows, 0.f);
  for (size_t i = 0; i < o_elems; ++i) {
    do_bits[i] = to_bits(c.dtype, ud(rng));
    do_vals[i] = from_bits(c.dtype, do_bits[i]);
  }
  const bool all_masked = c.tag.rfind("allmasked", 0) == 0;
  if (c.dlse)
    for (size_t i = 0; i < rows; ++i) dlse_vals[i] = dlse_f[i] = ud(rng);
  if (c.tag.rfind("allmasked_nandlse", 0) == 0)  // no row has a key: dLSE has no effect (reference: 0)
    for (size_t i = 0; i < rows; ++i) dlse_vals[i] = 0.0, dlse_f[i] = std::numeric_limits<float>::quiet_NaN();

  // Device: forward for O and LSE, then the backward into poisoned gradients.
  fa::rt::ContextGuard guard;
  fa::rt::DeviceBuffer d_in(in_bits.size() * 2), d_grad(in_bits.size() * 2), d_o(o_elems * 2),
      d_do(o_elems * 2), d_lse(rows * 4), d_dlse(rows * 4);
  d_in.upload(in_bits.data(), in_bits.size() * 2);
  d_do.upload(do_bits.data(), o_elems * 2);
  d_dlse.upload(dlse_f.data(), rows * 4);
  d_grad.memset8(0xFF);  // kPoison16 everywhere, gaps included
  auto view = [&](const fa::rt::DeviceBuffer& buf, const Operand& o, int H, int L, int D) {
    return fa::TensorView(buf.as<uint16_t>() + o.offset, c.dtype, {c.B, H, L, D},
                          {o.stride[0], o.stride[1], o.stride[2], 1});
  };
  const fa::TensorView q = view(d_in, lay.q, c.Hq, c.Lq, c.dqk), k = view(d_in, lay.k, c.Hkv, c.Lkv, c.dqk),
                       v = view(d_in, lay.v, c.Hkv, c.Lkv, c.dv);
  const fa::TensorView dq = view(d_grad, lay.q, c.Hq, c.Lq, c.dqk),
                       dk = view(d_grad, lay.k, c.Hkv, c.Lkv, c.dqk),
                       dv = view(d_grad, lay.v, c.Hkv, c.Lkv, c.dv);
  const fa::TensorView o(d_o.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv});
  const fa::TensorView dout(d_do.as<void>(), c.dtype, {c.B, c.Hq, c.Lq, c.dv});
  const fa::TensorView lse(d_lse.as<void>(), fa::DType::f32, {c.B, c.Hq, c.Lq});
  const fa::TensorView dlse(d_dlse.as<void>(), fa::DType::f32, {c.B, c.Hq, c.Lq});
  fa::ForwardOptions fo;
  fo.scale = c.scale, fo.lse = &lse;
  kernel.forward(q, k, v, o, mask, captures, fo);
  // Reference.
  const auto t0 = std::chrono::steady_clock::now();
  ModPrograms progs = mod_programs(kernel.program());
  std::optional<fa::ModProgram> grad;
  fa::Bindings env = caps.bindings();
  fa::ReferenceOptions ro;
  if (c.scale != 0.0f) ro.scale = double(c.scale);
  ro.mask_mod = &progs.mask, ro.bindings = &env;
  if (!kernel.program().score_is_identity()) {
    grad.emplace(fa::ModProgram::grad_of(kernel.program()));
    ro.score_mod = &progs.score, ro.score_grad = &*grad;
  }
  ro.q_strides = lay.q.stride, ro.k_strides = lay.k.stride, ro.v_strides = lay.v.stride;
  // Δ from the kernel's own O (rounded to the dtype), as the kernel's preprocess computes it.
  std::vector<uint16_t> o_bits(o_elems);
  fa::rt::synchronize(nullptr);
  d_o.download(o_bits.data(), o_elems * 2);
  std::vector<double> o_vals(o_elems);
  for (size_t i = 0; i < o_elems; ++i) o_vals[i] = from_bits(c.dtype, o_bits[i]);
  ro.delta_out = o_vals.data();
  const fa::ReferenceGrads ref = fa::reference_attention_backward(
      {c.B, c.Hq, c.Hkv, c.Lq, c.Lkv, c.dqk, c.dv}, in_vals.data() + lay.q.offset,
      in_vals.data() + lay.k.offset, in_vals.data() + lay.v.offset, do_vals.data(),
      c.dlse ? dlse_vals.data() : nullptr, ro);
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Gradients of every f32 buffer the score_mod reads, into zeroed fp32 tensors.
  std::map<std::string, fa::rt::DeviceBuffer> d_bgrad;
  fa::BackwardOptions bo;
  for (const std::string& name : fa::detail::gradient_buffers(kernel.program())) {
    const fa::TensorView& primal = captures.buffers().at(name);
    fa::rt::DeviceBuffer& buf = d_bgrad[name];
    buf = fa::rt::DeviceBuffer(size_t(primal.numel()) * 4);
    buf.memset8(0);
    std::vector<int64_t> shape(primal.shape, primal.shape + primal.rank);
    bo.buffer_grads.emplace(name, shape.size() == 1
                                      ? fa::TensorView(buf.as<void>(), fa::DType::f32, {shape[0]})
                                      : fa::TensorView(buf.as<void>(), fa::DType::f32, {shape[0], shape[1]}));
  }
  bo.scale = c.scale;
  bo.dlse = c.dlse ? &dlse : nullptr;
  bo.deterministic = c.deterministic;
  if (c.row_reductions) setenv("FAJIT_TMA", "0", 1);
  const auto t1 = std::chrono::steady_clock::now();
  kernel.backward(q, k, v, o, lse, dout, dq, dk, dv, mask, captures, bo);
  fa::rt::synchronize(nullptr);
  if (c.row_reductions) unsetenv("FAJIT_TMA");
  const double gpu_ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() * 1e3;
  std::vector<uint16_t> grad_bits(in_bits.size());
  d_grad.download(grad_bits.data(), grad_bits.size() * 2);
  if (c.deterministic) {  // a second run into re-poisoned gradients gives the same bits
    d_grad.memset8(0xFF);
    for (auto& [name, buf] : d_bgrad) buf.memset8(0);  // buffer gradients accumulate: start again
    fa::rt::synchronize(nullptr);
    kernel.backward(q, k, v, o, lse, dout, dq, dk, dv, mask, captures, bo);
    fa::rt::synchronize(nullptr);
    std::vector<uint16_t> again(grad_bits.size());
    d_grad.download(again.data(), again.size() * 2);
    size_t differ = 0;
    for (size_t i = 0; i < again.size(); ++i) differ += again[i] != grad_bits[i];
    EXPECT_EQ(differ, 0u) << "deterministic mode: gradients differ between two runs";
  }

  // Where no gradient flows: query rows the mask empties (LSE = -inf), keys no query sees (the
  // reference dV row, a sum of P > 0 terms over the queries that see the key, is exactly 0).
  std::vector<bool> masked_q(rows), unseen_kv(size_t(c.B) * c.Hkv * c.Lkv);
  long n_masked_q = 0, n_unseen_kv = 0;
  for (size_t r = 0; r < rows; ++r) n_masked_q += masked_q[r] = std::isinf(ref.forward.lse[r]);
  for (size_t r = 0; r < unseen_kv.size(); ++r) {
    bool zero = true;
    for (int d = 0; d < c.dv; ++d) zero = zero && ref.dv[r * c.dv + d] == 0.0;
    n_unseen_kv += unseen_kv[r] = zero;
  }
  const double tol = c.dtype == bf16 ? 3e-2 : 1e-2;
  const GradStats sq = compare("dq", c, grad_bits, lay.q, c.Hq, c.Lq, c.dqk, ref.dq, masked_q);
  const GradStats sk = compare("dk", c, grad_bits, lay.k, c.Hkv, c.Lkv, c.dqk, ref.dk, unseen_kv);
  const GradStats sv = compare("dv", c, grad_bits, lay.v, c.Hkv, c.Lkv, c.dv, ref.dv, unseen_kv);
  std::printf(
      "[ stats    ] dq rel %.2e max %.2e | dk rel %.2e max %.2e | dv rel %.2e max %.2e  (ref %.1f s, "
      "gpu %.2f ms first call; %ld masked query rows, %ld unseen keys)\n",
      sq.rel, sq.max_abs, sk.rel, sk.max_abs, sv.rel, sv.max_abs, ref_s, gpu_ms, n_masked_q, n_unseen_kv);
  if (all_masked) {
    EXPECT_EQ(n_masked_q, long(rows));
  }
  for (const auto* s : {&sq, &sk, &sv}) {
    EXPECT_EQ(s->nan, 0) << s->first_bad;
    EXPECT_EQ(s->nonzero_masked, 0) << s->first_bad;
  }
  for (auto& [name, buf] : d_bgrad) {  // buffer gradients: fp32, accumulated by reductions
    const std::vector<double>& r = ref.buffer_grads.at(name);
    std::vector<float> got(r.size());
    buf.download(got.data(), got.size() * 4);
    double e2 = 0, r2 = 0;
    long nan = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (std::isnan(got[i])) ++nan;
      e2 += (got[i] - r[i]) * (got[i] - r[i]), r2 += r[i] * r[i];
    }
    const double rel = r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
    std::printf("[ stats    ] d%s rel %.2e (%zu elements, |ref| %.3e)\n", name.c_str(), rel, r.size(),
                std::sqrt(r2));
    EXPECT_EQ(nan, 0) << "d" << name;
    EXPECT_LT(rel, tol) << "d" << name;
  }
  EXPECT_LT(sq.rel, tol) << "dq " << sq.first_bad;
  EXPECT_LT(sk.rel, tol) << "dk " << sk.first_bad;
  EXPECT_LT(sv.rel, tol) << "dv " << sv.first_bad;
}

// Every case with the backward the host picks (on an H100/H200: the wgmma kernel) and again
// with the mma.sync kernel forced.
std::vector<BwdCase> mma_cases() {
  std::vector<BwdCase> v;
  for (BwdCase c : cases()) {
    c.family = fa::KernelFamily::kMmaSync;
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BwdCase>& i) { return i.param.name(); });
INSTANTIATE_TEST_SUITE_P(MmaSync, BackwardTest, ::testing::ValuesIn(mma_cases()),
                         [](const ::testing::TestParamInfo<BwdCase>& i) { return i.param.name(); });

}  // namespace
}  // namespace fa_gpu_test
