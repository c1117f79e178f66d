// Block-mask builder: one kernel per mask_mod that classifies score-matrix tiles into
// empty / partial / full (see FaBlockMaskParams in params.h). NVRTC-only device code: it
// includes nothing but params.h. Usage in a generated translation unit:
//
//   #include "fajit/params.h"
//   struct FaMods { ... mask_mod(b, h, q, kv, cap) ... };      // templates/README.md
//   #include "fajit/block_mask.cuh"
//   FAJIT_DEFINE_BLOCK_MASK(fa_block_mask, FaMods)
//
// defines   extern "C" __global__ void fa_block_mask(FaBlockMaskParams p, FaCaptures cap)
// launched with FA_BLOCK_MASK_THREADS threads per CTA and any number of CTAs (grid-stride
// over tiles; the host uses a few CTAs per SM), no dynamic shared memory.
#ifndef FAJIT_BLOCK_MASK_CUH
#define FAJIT_BLOCK_MASK_CUH

#include "fajit/params.h"

#define FA_BLOCK_MASK_THREADS 256
// Elements each thread evaluates between two CTA-wide votes; a tile stops early once it has
// seen both a true and a false element (it is partial whatever the rest holds).
#define FA_BLOCK_MASK_ELEMS_PER_VOTE 4

// Kind of one tile, computed by the whole CTA (every thread returns the same value).
template <class Mods>
__device__ __forceinline__ int fa_block_mask_tile(const FaBlockMaskParams& p, const FaCaptures& cap, int b,
                                                  int h, int qb, int kb) {
  if (!Mods::kHasMaskMod) return kFaBlockFull;
  const int q0 = qb * p.q_block;
  const int kv0 = kb * p.kv_block;
  const int q_count = p.len_q - q0 < p.q_block ? p.len_q - q0 : p.q_block;
  const int kv_count = p.len_kv - kv0 < p.kv_block ? p.len_kv - kv0 : p.kv_block;
  const int elems = q_count * kv_count;
  const int step = FA_BLOCK_MASK_THREADS * FA_BLOCK_MASK_ELEMS_PER_VOTE;
  int any_true = 0, any_false = 0;
  int seen_true = 0, seen_false = 0;
  for (int base = 0; base < elems; base += step) {
#pragma unroll
    for (int j = 0; j < FA_BLOCK_MASK_ELEMS_PER_VOTE; ++j) {
      // Row-major within the tile: neighbouring threads read neighbouring kv positions.
      const int e = base + j * FA_BLOCK_MASK_THREADS + (int)threadIdx.x;
      if (e < elems) {
        const int qi = e / kv_count;
        const int ki = e - qi * kv_count;
        const bool keep = Mods::mask_mod(b, h, q0 + qi, kv0 + ki, cap);
        any_true |= keep ? 1 : 0;
        any_false |= keep ? 0 : 1;
      }
    }
    seen_true = __syncthreads_or(any_true);
    seen_false = __syncthreads_or(any_false);
    if (seen_true && seen_false) break;  // uniform: both votes are CTA-wide
  }
  if (seen_true && seen_false) return kFaBlockPartial;
  return seen_true ? kFaBlockFull : kFaBlockEmpty;
}

template <class Mods>
__device__ __forceinline__ void fa_block_mask_classify(const FaBlockMaskParams& p, const FaCaptures& cap) {
  for (long long tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    const int kb = (int)(tile % p.num_kv_blocks);
    long long rest = tile / p.num_kv_blocks;
    const int qb = (int)(rest % p.num_q_blocks);
    rest /= p.num_q_blocks;
    const int h = (int)(rest % p.heads);
    const int b = (int)(rest / p.heads);
    int kind = p.known ? (int)p.known[tile] : kFaBlockUndecided;
    if (kind > kFaBlockFull) kind = fa_block_mask_tile<Mods>(p, cap, b, h, qb, kb);
    if (threadIdx.x == 0) p.kinds[tile] = (unsigned char)kind;
  }
}

#define FAJIT_DEFINE_BLOCK_MASK(name, Mods)                           \
  extern "C" __global__ void __launch_bounds__(FA_BLOCK_MASK_THREADS) \
      name(const FaBlockMaskParams p, const FaCaptures cap) {         \
    fa_block_mask_classify<Mods>(p, cap);                             \
  }

#endif  // FAJIT_BLOCK_MASK_CUH
