#include "fajit/kernel_spec.h"

#include <algorithm>

#include <fmt/format.h>

#include "fajit/error.h"
#include "fajit/jit/arch.h"

namespace fa {

TileConfig default_tile(int head_dim_qk, int head_dim_v, bool has_score_mod, KernelFamily family,
                        KernelKind kind) {
  const bool wide = head_dim_qk > 64 || head_dim_v > 64;
  if (kind == KernelKind::kBackward) {
    if (family == KernelFamily::kWgmma)  // block_m queries x 128 keys, 3 warpgroups
      return TileConfig{wide || has_score_mod ? 64 : 128, 128, 12, 2};
    return wide ? TileConfig{64, 128, 8, 2} : TileConfig{64, 64, 4, 2};
  }
  if (family == KernelFamily::kWgmma) return TileConfig{128, 128, 12, wide ? 3 : 2};
  return TileConfig{128, 64, has_score_mod && wide ? 8 : 4, 2};
}

KernelSpec KernelSpec::resolved(bool has_score_mod) const {
  if (deterministic && kind != KernelKind::kBackward)
    throw Error("deterministic applies to the backward kernels only");
  KernelSpec s = *this;
  if (s.dtype != DType::f16 && s.dtype != DType::bf16)
    throw Error(fmt::format("kernel dtype must be f16 or bf16, got {}", dtype_name(s.dtype)));
  for (auto [name, v] :
       {std::pair<const char*, int>{"head_dim_qk", s.head_dim_qk}, {"head_dim_v", s.head_dim_v}})
    if (v != 64 && v != 128) throw Error(fmt::format("{} must be 64 or 128, got {}", name, v));
  s.arch = jit::validate_arch(s.arch);
  if (s.kind == KernelKind::kBackward) {
    // wgmma (backward_sm90.cuh) on sm_90a when the head dims agree, unless mma.sync was asked
    // for; mma.sync (backward.cuh) everywhere else.
    if (s.family == KernelFamily::kWgmma && s.arch != "sm_90a")
      throw Error(fmt::format("the wgmma kernel needs arch sm_90a, got {}", s.arch));
    const bool wgmma_ok = s.arch == "sm_90a" && s.head_dim_qk == s.head_dim_v;
    s.family = s.family != KernelFamily::kMmaSync && wgmma_ok ? KernelFamily::kWgmma : KernelFamily::kMmaSync;
    const TileConfig want = default_tile(s.head_dim_qk, s.head_dim_v, has_score_mod, s.family, s.kind);
    if (!s.tile.is_default() && !(s.tile == want))
      throw Error(fmt::format("the backward kernel has a fixed tile {}x{}w{}s{}; leave the tile empty",
                              want.block_m, want.block_n, want.warps, want.stages));
    s.tile = want;
    return s;
  }
  if (s.family == KernelFamily::kAuto)
    s.family = s.arch == "sm_90a" && s.tile.is_default() ? KernelFamily::kWgmma : KernelFamily::kMmaSync;
  if (s.family == KernelFamily::kWgmma) {
    if (s.arch != "sm_90a") throw Error(fmt::format("the wgmma kernel needs arch sm_90a, got {}", s.arch));
    const TileConfig want = default_tile(s.head_dim_qk, s.head_dim_v, has_score_mod, KernelFamily::kWgmma);
    if (!s.tile.is_default() && !(s.tile == want))
      throw Error(fmt::format("the wgmma kernel has a fixed tile {}x{}w{}s{}; leave the tile empty",
                              want.block_m, want.block_n, want.warps, want.stages));
    s.tile = want;
    return s;
  }
  if (s.tile.is_default()) s.tile = default_tile(s.head_dim_qk, s.head_dim_v, has_score_mod);
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
  return s;
}

std::string KernelSpec::to_string() const {
  const char* k = kind == KernelKind::kForward    ? "forward"
                  : kind == KernelKind::kBackward ? "backward"
                                                  : "block_mask";
  if (kind == KernelKind::kBlockMask) return fmt::format("{} {}", k, arch);
  const char* fam = family == KernelFamily::kWgmma     ? "wgmma"
                    : family == KernelFamily::kMmaSync ? "mma"
                                                       : "auto";
  return fmt::format("{} {} qk{} v{} {} tile{}x{}w{}s{} {}{}", k, dtype_name(dtype), head_dim_qk, head_dim_v,
                     fam, tile.block_m, tile.block_n, tile.warps, tile.stages, arch,
                     deterministic ? " deterministic" : "");
}

int KernelSpec::threads() const { return tile.warps * 32; }

int KernelSpec::smem_bytes() const {
  if (kind == KernelKind::kBackward && family == KernelFamily::kWgmma) {
    // templates/fajit/backward_sm90.cuh, Sm90BwdConfig::kSmemBytes: alignment slack, K, V,
    // stages of Q and dO, two dSᵀ buffers, stages of LSE and delta rows, mbarriers
    const int m = tile.block_m, n = tile.block_n, d = head_dim_qk;
    return 1024 + 2 * n * 2 * d + tile.stages * 2 * m * 2 * d + 2 * 2 * n * m + tile.stages * m * 8 +
           8 * (1 + 2 * tile.stages);
  }
  if (kind == KernelKind::kBackward) {  // templates/fajit/backward.cuh, BwdConfig::kSmemBytes
    const int m = tile.block_m, n = tile.block_n;
    const int stage = 2 * m * (head_dim_qk + head_dim_v) + 2 * m * 4;  // Q, dO, LSE, delta
    return 2 * n * (head_dim_qk + head_dim_v) + tile.stages * stage + 2 * n * m;
  }
  int dmax = std::max(head_dim_qk, head_dim_v);
  int tiles = 2 * (tile.block_m * dmax + tile.stages * tile.block_n * (head_dim_qk + head_dim_v));
  if (family == KernelFamily::kWgmma) return 1024 + tiles + 8 * (1 + 3 * tile.stages);  // + mbarriers
  return tiles;
}

}  // namespace fa
