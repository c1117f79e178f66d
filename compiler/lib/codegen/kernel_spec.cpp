#include "fajit/kernel_spec.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "fajit/detail/codegen.h"
#include "fajit/error.h"
#include "fajit/jit/arch.h"

namespace fa {

namespace {

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// The Hopper forward's tiles in order of preference (resolved() takes the first that fits):
// BLOCK_M 128 (two consumer warpgroups), 3 stages (d64 too since its K/V loads no longer wait
// behind the walk: full 0.74 -> 0.65 ms, causal 0.43 -> 0.37 on the H200; 4 stages no better);
// BLOCK_N 128 while O (DV columns) and S fit the consumers' registers together, 64 above DV 128
// or where shared memory needs it (QK 256 / V 128).
// Three consumer warpgroups (BLOCK_M 192, 160 registers each) give one warpgroup's softmax two
// others' GEMMs to hide under, where the GEMMs are short (H200, bf16 B4 H16 S4096):
// - up to head dim 64, 192x128 first: full 0.734 -> 0.611 ms, causal 0.408 -> 0.375, document
//   0.18 -> 0.165. A score_mod keeping more values live spills at 160 registers (softcap causal
//   0.765 -> 0.785), so there it is last.
// - up to 96, 192x112 (BLOCK_N 128 spills there; the masks' 128-column blocks are regrouped):
//   d96 full 0.822 -> 0.753 ms, d80 0.780 -> 0.712, causal 1-2.5 % faster, but document 15-25 %
//   slower (112-key tiles across its 128-key blocks make more of them partial). First without a
//   mask_mod or score_mod, else candidates after the 128-row tiles.
// - above DV 64 up to 128, 192x128 in 2 stages with P through shared memory (in registers it
//   would spill): first at d113-d128 without mods (see below), else a candidate (not with a
//   score_mod above 96).
std::vector<TileConfig> wgmma_forward_tiles(int dqk, int dv, bool has_score_mod, bool has_mask_mod,
                                            bool dense = true) {
  std::vector<TileConfig> tiles;
  const int widest = std::max(head_dim_mma(dqk), head_dim_mma(dv));
  const bool three128 = widest <= 64, three112 = widest > 64 && widest <= 96;
  const TileConfig rows192{192, 128, 16, 3}, rows192n112{192, 112, 16, 3}, rows192n112s2{192, 112, 16, 2};
  // Three consumers at 128 keys above DV 64: P through shared memory, 2 stages (3 do not fit).
  // First at d113-d128 (QK and V) without mods: H200, bf16 B4 H16 S4096, d128 full 0.962 -> 0.893 ms
  // against 128x128 s3, B1 S16384 3.67 -> 3.50; causal 0.509 -> 0.485 against 128x128 s2, but
  // sliding 0.259 -> 0.281 and document 0.170 -> 0.199 (short walks: 192-row blocks regrouped
  // from 128-row masks), so a mask_mod keeps 128 rows first and tuning decides. At d112 the
  // tuner took 128x128 s2 over it (full 0.861 ms), at d80 / d96 192x112 s3: candidates there.
  const TileConfig rows192s2{192, 128, 16, 2};
  // Only where P goes through shared memory (at DV 64 and below P stays in registers and a
  // score_mod spills: 96/64 softcap causal 8 B), not on the ragged and paged layouts (not
  // measured), not with a score_mod above 96 (it spills at 160 registers: d128 softcap causal
  // 116 B, document + softcap 256 B, ALiBi 12 B).
  const bool wide_three =
      dense && widest <= 128 && sm90_forward_p_in_smem(rows192s2, dv) && (widest <= 96 || !has_score_mod);
  const bool wide_three_first =
      wide_three && head_dim_mma(dqk) == 128 && head_dim_mma(dv) == 128 && !has_score_mod && !has_mask_mod;
  if (wide_three_first) tiles.push_back(rows192s2);
  // the three-consumer tile of these head dims, first where it was measured faster
  const bool three_first = three128 ? !has_score_mod : !has_score_mod && !has_mask_mod;
  if (three128 && three_first) tiles.push_back(rows192);
  if (three112 && three_first) tiles.push_back(rows192n112);
  // Above 64 a mask_mod without a score_mod takes 2 stages first on the dense layout: 128x128 s2
  // leaves room for the persistent form's second Q region (s3 does not), and the short walks of
  // data-dependent masks gain most from it (d128 document 0.211 -> 0.190 ms, sliding 0.284 ->
  // 0.266; causal within 1 %; H200). Ragged and paged K/V (cp.async, one block per CTA) keep 3.
  const bool persistent_first = dense && widest > 64 && widest <= 128 && has_mask_mod && !has_score_mod;
  for (int n : {128, 64}) {
    if (n == 128 && head_dim_mma(dv) > 128) continue;
    if (persistent_first) tiles.push_back({128, n, 12, 2});
    tiles.push_back({128, n, 12, 3});
    if (!persistent_first) tiles.push_back({128, n, 12, 2});
  }
  if (three128 && !three_first) tiles.push_back(rows192);
  if (three112 && !three_first) tiles.push_back(rows192n112);
  if (three112) tiles.push_back(rows192n112s2);
  if (wide_three && !wide_three_first) tiles.push_back(rows192s2);
  return tiles;
}

std::string tile_text(const TileConfig& t) {
  return fmt::format("{}x{}w{}s{}", t.block_m, t.block_n, t.warps, t.stages);
}

// Tiles in order of preference for the mma.sync kernels; resolved() takes the first that fits
// the arch's shared memory.
std::vector<TileConfig> mma_tiles(int dqk, int dv, bool has_score_mod, KernelKind kind) {
  const int mq = head_dim_mma(dqk), mv = head_dim_mma(dv);
  // Decoding: 64 packed rows, 4 warps, 2 stages. Measured on the H200 (B4 Hq32 Hkv8, Lq 1/16
  // over 32k/128k keys, bench/RESULTS.md seventeenth session): at d128 2 stages beat 3 by
  // 1-1.5 % (both 2 CTAs per SM), at d64/d96 they tie; BLOCK_N 32 (3-6 stages, up to 3 CTAs
  // per SM) and 128 (1 CTA) are slower.
  if (kind == KernelKind::kDecode) return {{64, 64, 4, 2}, {64, 32, 4, 2}};
  if (kind == KernelKind::kBackward) {
    // 8 warps split dQ's columns in two: whole 16-column pairs need an even step count
    if (mq > 64 || mv > 64) {
      if (mq / 16 % 2 == 0) return {{64, 128, 8, 2}, {64, 64, 4, 2}};
      return {{64, 64, 4, 2}};
    }
    return {{64, 64, 4, 2}};
  }
  if (mq > 128 || mv > 128)  // 16 rows per warp: O of up to 256 columns in registers
    return {{128, 64, 8, 2}, {128, 32, 8, 2}, {64, 64, 4, 2}, {64, 32, 4, 2}};
  const bool wide = dqk > 64 || dv > 64;
  const int warps = has_score_mod && wide ? 8 : 4;
  return {{128, 64, warps, 2}, {128, 32, warps, 2}, {64, 64, 4, 2}, {64, 32, 4, 2}};
}

}  // namespace

static int sm90_backward_smem_bytes(int block_m, int block_n, int head_dim_qk, int head_dim_v, int stages) {
  const int m = block_m, n = block_n;
  const int d = head_dim_pitch(head_dim_qk) + head_dim_pitch(head_dim_v);  // rows of whole 64-column blocks
  // templates/fajit/backward_sm90.cuh: alignment slack, K, V, stages of Q and dO, stages of
  // LSE and delta rows with the tile's TileInfo (16 B), mbarriers, and
  const int common = 1024 + n * 2 * d + stages * m * 2 * d + stages * (m * 8 + 16) + 8 * (1 + 2 * stages);
  // Sm90WideBwdConfig::kSmemBytes: Pᵀ and two dSᵀ buffers (64 x 64, 16-bit)
  if (sm90_backward_wide(head_dim_qk, head_dim_v)) return common + 3 * 2 * n * m;
  // Sm90BwdConfig::kSmemBytes: two dSᵀ buffers and two dQ stagings of 64 rows of 288 B, or
  // 256 B where 288 would not fit
  const int other = common + 2 * 2 * n * m;
  return other + 2 * 64 * (other + 2 * 64 * 288 <= 227 * 1024 ? 288 : 256);
}

bool sm90_backward_wide(int head_dim_qk, int head_dim_v) { return head_dim_qk > 128 || head_dim_v > 128; }

// K released after S = Q·Kᵀ, a tile before its V (forward_sm90.cuh, EARLY_K), on 2-stage rings
// only. H200, bf16 B4 H16 S4096: d256 (2 stages) full 2.415 -> 1.949 ms, causal 1.232 -> 1.026,
// softcap 1.541 -> 1.323; on the 3-stage rings it costs: d64 full 0.662 -> 0.713, causal 0.369 ->
// 0.406 (with a third K stage as well, d256 1.931 / 1.026: no better).
bool sm90_forward_early_k(const TileConfig& tile) { return tile.stages == 2; }

// The persistent forward (forward_sm90.cuh, PERSISTENT): one CTA per SM takes query blocks
// from a counter, so a CTA's start (barrier set-up, the first Q and K loads, the last block's
// epilogue) costs once per SM. A CTA costs ~6 us beside its tiles (H200, d64 192x128 and d128
// 128x128, from S 4096 vs 2048 at equal CTA counts): 10 % of a full S 4096 forward, a quarter
// of a d64 document one. Every dense TMA tile where two Q regions fit takes it. Against one
// block per CTA on the same tile (H200, B4 H16 S4096; 192x128 also H100):
// - d64 192x128 (three consumers): full 1.03x, document 1.03x, sliding 1.10x, causal 0.99x;
// - d128 128x128 s2: document 0.190 vs 0.211 ms, sliding 1024 0.266 vs 0.284, full, causal and
//   ALiBi within 1 %, softcap 3 % slower (s3, one block per CTA, stays its default);
// - d64 128x128 s3: document 0.155 vs 0.178 ms (the 192x128 default: 0.176), full 2 % slower.
// (Two-consumer tiles had measured 11-50 % slower: ~0.1 ms of that was the work counter's
// allocation in host-timed runs, now from rt::stream_alloc's pool, and 8 % a tile was the epilogue
// pushing the tile cursor off ptxas's uniform datapath, fixed in store_rows_read_first.)
// Sm90FwdConfig::kSmemBytes: alignment slack, a Q region per query block, the K/V stages, the
// consumers' P tiles where three consumers take P·V's P from shared memory (128 keys above DV 64),
// mbarriers.
static int sm90_forward_smem_bytes(const KernelSpec& s, bool persistent) {
  const int pq = head_dim_pitch(s.head_dim_qk), pv = head_dim_pitch(s.head_dim_v);
  const TileConfig& t = s.tile;
  const int q_regions = persistent ? 2 : 1;
  const int p_tiles = sm90_forward_p_in_smem(t, s.head_dim_v) ? t.block_m * 128 : 0;  // P's rows x 128 keys
  return 1024 + 2 * (q_regions * t.block_m * std::max(pq, pv) + t.stages * t.block_n * (pq + pv) + p_tiles) +
         8 * (1 + 4 * t.stages + (persistent ? 3 : 0)) + (persistent ? 72 : 0);
}

bool sm90_forward_persistent(const KernelSpec& s) {
  const bool may = s.kind == KernelKind::kForward && s.family == KernelFamily::kWgmma &&
                   s.layout == SequenceLayout::kDense && !s.cp_async_kv;
  return may && sm90_forward_smem_bytes(s, true) <= jit::max_dynamic_smem(s.arch);
}

bool sm90_forward_p_in_smem(const TileConfig& tile, int head_dim_v) {
  return tile.block_m == 192 && tile.block_n == 128 && head_dim_v > 64;
}

bool sm90_forward_takes_tile(const KernelSpec& s, bool has_score_mod, bool has_mask_mod) {
  const std::vector<TileConfig> tiles = wgmma_forward_tiles(s.head_dim_qk, s.head_dim_v, has_score_mod,
                                                            has_mask_mod, s.layout == SequenceLayout::kDense);
  return std::find(tiles.begin(), tiles.end(), s.tile) != tiles.end();
}

int head_dim_mma(int d) { return round_up(d, 16); }
int head_dim_pitch(int d) { return round_up(d, 64); }

TileConfig default_tile(int head_dim_qk, int head_dim_v, bool has_score_mod, KernelFamily family,
                        KernelKind kind, bool has_mask_mod) {
  const bool wide = head_dim_qk > 64 || head_dim_v > 64;
  // block_m x 128 keys, 3 WGs. BLOCK_M 128 up to D 64 unless the score_mod's derivative keeps a
  // value per score (has_score_mod: codegen's score_mod_weighs): softcap causal d64 1.90 ms at
  // 64 vs 2.27 at 128, ALiBi (dS = dT) 1.46 at 64 vs 1.18 at 128 (H200, 2026-11-24).
  // 3 Q/dO stages at D 128 (BLOCK_M 64; they fit with the dQ rows unpadded), so a warpgroup
  // running ahead of the other finds its next tile loaded: H200 d128 full 2.971 -> 2.858 ms,
  // causal 1.636 -> 1.535, softcap 2.099 -> 2.025; at d64 softcap (BLOCK_M 64) 1.577 -> 1.645,
  // so D 64 keeps 2. Between 64 and 128 the rows are whole 64-column blocks (as at 128): 3 stages.
  // Above 128 (the wide-head kernel): 64 x 64, 3 stages where they fit (up to 192 / 192).
  if (kind == KernelKind::kBackward && family == KernelFamily::kWgmma) {
    const bool wide_head = sm90_backward_wide(head_dim_qk, head_dim_v);
    const int block_m = wide || has_score_mod ? 64 : 128, block_n = wide_head ? 64 : 128;
    const bool three =
        wide && sm90_backward_smem_bytes(block_m, block_n, head_dim_qk, head_dim_v, 3) <= 227 * 1024;
    const int stages = three ? 3 : 2;
    return TileConfig{block_m, block_n, 12, stages};
  }
  if (family == KernelFamily::kWgmma)
    return wgmma_forward_tiles(head_dim_qk, head_dim_v, has_score_mod, has_mask_mod).front();
  return mma_tiles(head_dim_qk, head_dim_v, has_score_mod, kind).front();
}

KernelSpec KernelSpec::resolved(bool has_score_mod, bool has_mask_mod) const {
  if (deterministic && kind != KernelKind::kBackward)
    throw Error("deterministic applies to the backward kernels only");
  if (cp_async_kv && kind != KernelKind::kForward)  // the family: below, once resolved
    throw Error("cp_async_kv applies to the wgmma forward kernel only");
  if (row_max && kind != KernelKind::kForward && kind != KernelKind::kDecode)
    throw Error("row_max applies to the forward and decoding kernels only");
  if (layout == SequenceLayout::kRagged && kind == KernelKind::kBlockMask)
    throw Error("the ragged layout applies to the forward, decoding and backward kernels only");
  if (layout == SequenceLayout::kPaged && kind != KernelKind::kForward && kind != KernelKind::kDecode)
    throw Error("the paged layout applies to the forward and decoding kernels only");
  KernelSpec s = *this;
  if (s.dtype != DType::f16 && s.dtype != DType::bf16)
    throw Error(fmt::format("kernel dtype must be f16 or bf16, got {}", dtype_name(s.dtype)));
  for (auto [name, v] :
       {std::pair<const char*, int>{"head_dim_qk", s.head_dim_qk}, {"head_dim_v", s.head_dim_v}})
    if (v % 8 != 0 || v < kMinHeadDim || v > kMaxHeadDim)
      throw Error(
          fmt::format("{} must be a multiple of 8 from {} to {}, got {}", name, kMinHeadDim, kMaxHeadDim, v));
  s.arch = jit::validate_arch(s.arch);
  const int smem_limit = jit::max_dynamic_smem(s.arch);
  if (s.family == KernelFamily::kWgmma && s.arch != "sm_90a")
    throw Error(fmt::format("the wgmma kernel needs arch sm_90a, got {}", s.arch));
  // The tile the spec resolves to, checked against the arch's shared memory (a default tile
  // falls back to smaller ones first).
  auto fit = [&](const std::vector<TileConfig>& candidates, bool fixed) {
    for (const TileConfig& t : candidates) {
      s.tile = t;
      if (s.smem_bytes() <= smem_limit) return;
    }
    throw Error(fmt::format(
        "{} tile {} needs {} bytes of shared memory at head dims {}/{}; {} allows at most {}{}",
        s.kind == KernelKind::kBackward ? "the backward" : "the forward", tile_text(s.tile), s.smem_bytes(),
        s.head_dim_qk, s.head_dim_v, s.arch, smem_limit, fixed ? "" : " (no smaller tile fits either)"));
  };
  if (s.kind == KernelKind::kDecode) {  // decode.cuh: mma.sync on every arch
    s.family = KernelFamily::kMmaSync;
    if (s.tile.is_default()) {
      fit(mma_tiles(s.head_dim_qk, s.head_dim_v, has_score_mod, s.kind), false);
      return s;
    }
    const TileConfig& t = s.tile;
    if (t.block_m != 64 || t.warps != 4 || (t.block_n != 32 && t.block_n != 64 && t.block_n != 128) ||
        t.stages < 2 || t.stages > 6)
      throw Error(fmt::format(
          "the decode kernel takes tiles 64xNw4sS with N 32, 64 or 128 and S 2 to 6, got {}", tile_text(t)));
    fit({t}, true);
    return s;
  }
  if (s.kind == KernelKind::kBackward) {
    // wgmma (backward_sm90.cuh: every head dim, above 128 its wide-head config) on sm_90a
    // unless mma.sync was asked for; mma.sync (backward.cuh) everywhere else.
    s.family = s.family != KernelFamily::kMmaSync && s.arch == "sm_90a" ? KernelFamily::kWgmma
                                                                        : KernelFamily::kMmaSync;
    const TileConfig want = default_tile(s.head_dim_qk, s.head_dim_v, has_score_mod, s.family, s.kind);
    std::vector<TileConfig> candidates = s.family == KernelFamily::kWgmma
                                             ? std::vector<TileConfig>{want}
                                             : mma_tiles(s.head_dim_qk, s.head_dim_v, has_score_mod, s.kind);
    if (!s.tile.is_default()) {
      if (std::find(candidates.begin(), candidates.end(), s.tile) == candidates.end())
        throw Error(
            fmt::format("the backward kernel has a fixed tile {}; leave the tile empty", tile_text(want)));
      candidates = {s.tile};
    }
    fit(candidates, candidates.size() == 1);
    return s;
  }
  if (s.family == KernelFamily::kAuto)
    s.family = s.arch == "sm_90a" && s.tile.is_default() ? KernelFamily::kWgmma : KernelFamily::kMmaSync;
  if (s.cp_async_kv && s.family != KernelFamily::kWgmma)
    throw Error("cp_async_kv applies to the wgmma forward kernel only");
  // The wgmma forward's ragged and paged layouts copy K/V with cp.async: a TMA map would read
  // a sequence's neighbour's rows (or a page's) past its end where cp.async zero-fills.
  if (s.family == KernelFamily::kWgmma && s.layout != SequenceLayout::kDense) s.cp_async_kv = true;
  if (s.family == KernelFamily::kWgmma) {
    const std::vector<TileConfig> tiles = wgmma_forward_tiles(
        s.head_dim_qk, s.head_dim_v, has_score_mod, has_mask_mod, s.layout == SequenceLayout::kDense);
    if (s.tile.is_default()) {
      fit(tiles, false);
      return s;
    }
    if (std::find(tiles.begin(), tiles.end(), s.tile) == tiles.end()) {
      std::string list;
      for (const TileConfig& t : tiles) list += (list.empty() ? "" : ", ") + tile_text(t);
      // what the list depends on besides the head dims: the mods and the layout
      const char* mods = has_score_mod && has_mask_mod ? "a score_mod and a mask_mod"
                         : has_score_mod               ? "a score_mod"
                         : has_mask_mod                ? "a mask_mod"
                                                       : "no mods";
      const char* layout = s.layout == SequenceLayout::kRagged  ? "ragged"
                           : s.layout == SequenceLayout::kPaged ? "paged"
                                                                : "dense";
      throw Error(fmt::format(
          "the wgmma forward kernel takes tiles {} at head dims {}/{} with {} on the {} layout, got {}", list,
          s.head_dim_qk, s.head_dim_v, mods, layout, tile_text(s.tile)));
    }
    fit({s.tile}, true);
    return s;
  }
  if (s.tile.is_default()) {
    fit(mma_tiles(s.head_dim_qk, s.head_dim_v, has_score_mod, s.kind), false);
    return s;
  }
  const TileConfig& t = s.tile;
  if (t.block_m != 64 && t.block_m != 128)
    throw Error(fmt::format("tile block_m must be 64 or 128, got {}", t.block_m));
  if (t.block_n != 32 && t.block_n != 64 && t.block_n != 128)
    throw Error(fmt::format("tile block_n must be 32, 64 or 128, got {}", t.block_n));
  if (t.warps != 4 && t.warps != 8) throw Error(fmt::format("tile warps must be 4 or 8, got {}", t.warps));
  if (t.block_m / t.warps != 16 && t.block_m / t.warps != 32)
    throw Error(
        fmt::format("tile block_m / warps must be 16 or 32 rows per warp, got {}/{}", t.block_m, t.warps));
  if (t.stages < 2 || t.stages > 4) throw Error(fmt::format("tile stages must be 2 to 4, got {}", t.stages));
  if (t.block_m / t.warps == 32 && (head_dim_mma(s.head_dim_qk) > 128 || head_dim_mma(s.head_dim_v) > 128))
    throw Error(fmt::format("tile {}: a head dim above 128 needs 16 rows per warp (block_m / warps), got {}",
                            tile_text(t), t.block_m / t.warps));
  fit({t}, true);
  return s;
}

std::vector<KernelSpec> forward_tune_candidates(const KernelSpec& def, bool has_score_mod,
                                                bool has_mask_mod) {
  if (def.kind != KernelKind::kForward || def.layout != SequenceLayout::kDense)
    throw Error("autotuning takes the dense forward kernel only");
  std::vector<KernelSpec> out{def};
  auto add = [&](KernelFamily family, TileConfig tile) {
    KernelSpec s = def;
    s.family = family;
    s.tile = tile;
    try {
      s = s.resolved(has_score_mod, has_mask_mod);
    } catch (const Error&) {
      return;  // shared memory or the family cannot take it here
    }
    if (out.size() < kMaxTuneCandidates && std::find(out.begin(), out.end(), s) == out.end())
      out.push_back(s);
  };
  const TileConfig mma = default_tile(def.head_dim_qk, def.head_dim_v, has_score_mod);
  if (def.arch == "sm_90a") {
    for (const TileConfig& t :
         wgmma_forward_tiles(def.head_dim_qk, def.head_dim_v, has_score_mod, has_mask_mod))
      add(KernelFamily::kWgmma, t);
    add(KernelFamily::kMmaSync, mma);
    add(KernelFamily::kMmaSync, {64, 64, 4, 2});
    return out;
  }
  // The resolved default's BLOCK_N (shared memory may have cut it to 32) and 32, 2 and 3 stages.
  for (int m : {mma.block_m, 64})
    for (int n : {def.tile.block_n, 32})
      for (int stages : {2, 3}) add(KernelFamily::kMmaSync, {m, n, m == 64 ? 4 : mma.warps, stages});
  return out;
}

std::string KernelSpec::to_string() const {
  const char* k = kind == KernelKind::kForward    ? "forward"
                  : kind == KernelKind::kBackward ? "backward"
                  : kind == KernelKind::kDecode   ? "decode"
                                                  : "block_mask";
  const std::string wide = fmt::format("{}{}{}", wide_captures ? " wide-captures" : "",
                                       cp_async_kv ? " cp-async-kv" : "", row_max ? " row-max" : "");
  if (kind == KernelKind::kBlockMask) return fmt::format("{} {}{}", k, arch, wide);
  const char* fam = family == KernelFamily::kWgmma     ? "wgmma"
                    : family == KernelFamily::kMmaSync ? "mma"
                                                       : "auto";
  return fmt::format("{} {} qk{} v{} {} tile{}x{}w{}s{} {}{}{}{}", k, dtype_name(dtype), head_dim_qk,
                     head_dim_v, fam, tile.block_m, tile.block_n, tile.warps, tile.stages, arch,
                     deterministic ? " deterministic" : "",
                     layout == SequenceLayout::kRagged  ? " ragged"
                     : layout == SequenceLayout::kPaged ? " paged"
                                                        : "",
                     wide);
}

bool needs_wide_captures(int rank, const int64_t* shape, const int64_t* stride) {
  constexpr int64_t kNarrowSpan = int64_t(1) << 31;  // offsets below it fit an int
  int64_t span = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] <= 1) continue;
    if (d == rank - 1 && stride[d] != 1) return true;
    if (stride[d] < 0 || stride[d] >= kNarrowSpan || shape[d] - 1 >= kNarrowSpan) return true;
    span += (shape[d] - 1) * stride[d];  // < 2^62: no overflow
    if (span >= kNarrowSpan) return true;
  }
  return false;
}

int KernelSpec::threads() const { return tile.warps * 32; }

int KernelSpec::decode_ctas_per_sm() const {
  // Per SM: the largest dynamic allocation plus the 1 KiB the driver reserves per CTA.
  const int per_sm = jit::max_dynamic_smem(arch) + 1024, per_cta = smem_bytes() + 1024;
  return std::clamp(per_sm / per_cta, 1, 3);
}

int KernelSpec::smem_bytes() const {
  const int pq = head_dim_pitch(head_dim_qk), pv = head_dim_pitch(head_dim_v);
  if (kind == KernelKind::kBackward && family == KernelFamily::kWgmma)
    return sm90_backward_smem_bytes(tile.block_m, tile.block_n, head_dim_qk, head_dim_v, tile.stages);
  if (kind == KernelKind::kBackward) {  // templates/fajit/backward.cuh, BwdConfig::kSmemBytes
    const int m = tile.block_m, n = tile.block_n;
    const int stage = 2 * m * (pq + pv) + 2 * m * 4;  // Q, dO, LSE, delta
    return 2 * n * (pq + pv) + tile.stages * stage + 2 * n * m;
  }
  if (kind == KernelKind::kDecode)  // templates/fajit/decode.cuh, DecodeConfig::kSmemBytes
    return 2 * (tile.block_m * pq + tile.stages * tile.block_n * (pq + pv));
  // Shared rows are padded to multiples of 64 elements (templates/fajit/prelude.cuh, HeadRow)
  // in both kernels (Sm90FwdConfig::kSmemBytes, FwdConfig::kSmemBytes).
  if (family == KernelFamily::kWgmma) return sm90_forward_smem_bytes(*this, sm90_forward_persistent(*this));
  return 2 * (tile.block_m * std::max(pq, pv) + tile.stages * tile.block_n * (pq + pv));
}

}  // namespace fa
