// Block-mask builder: one kernel per mask_mod that classifies score-matrix tiles into
// empty / partial / full (see FaBlockMaskParams in params.h). NVRTC-only device code: it
// includes nothing but params.h. Usage in a generated translation unit:
//
//   #include "fajit/params.h"
//   struct FaMods { ... mask_mod(b, h, q, kv, cap) ... };      // templates/README.md
//   #include "fajit/block_mask.cuh"
//   FAJIT_DEFINE_BLOCK_MASK(fa_block_mask, FaMods)
//
// (or FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER(fa_block_mask, FaMods) for the first kernel alone and
// FAJIT_DEFINE_BLOCK_TABLES(fa_block_mask) for the other three, which read no mods: fajit compiles
// those once for every mask_mod, a module of 3/4 of the builder's NVRTC time)
// defines   extern "C" __global__ void fa_block_mask(FaBlockMaskParams p, FaCaptures cap)
//           extern "C" __global__ void fa_block_mask_tables(FaBlockTablesParams p)
//           extern "C" __global__ void fa_block_mask_regroup(FaBlockRegroupParams p)
//           extern "C" __global__ void fa_block_mask_kinds(FaBlockKindsParams p)
// each launched with FA_BLOCK_MASK_THREADS threads per CTA and any number of CTAs (grid-stride
// over tiles, table rows, regrouped tiles; the host uses a few CTAs per SM), no dynamic shared
// memory. The second and third turn the classification into tables on the device, so that a
// mask built per training step needs no copy to the host and no sync (fa::rt::build_block_mask);
// the fourth classifies the tiles of kv tables given on the device (a torch BlockMask), so that
// their transposed tables are built there too (fa::rt::derive_device_kinds).
#ifndef FAJIT_BLOCK_MASK_CUH
#define FAJIT_BLOCK_MASK_CUH

#include "fajit/params.h"

#define FA_BLOCK_MASK_THREADS 256
// Elements each thread evaluates between two CTA-wide votes; a tile stops early once it has
// seen both a true and a false element (it is partial whatever the rest holds).
#define FA_BLOCK_MASK_ELEMS_PER_VOTE 8

// Kind of one tile, computed by the whole CTA (every thread returns the same value). Elements go
// row-major within the tile, neighbouring threads on neighbouring kv positions; each thread
// steps its (row, column) by the CTA's width without a division per element.
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
  const int row_step = FA_BLOCK_MASK_THREADS / kv_count, col_step = FA_BLOCK_MASK_THREADS % kv_count;
  int qi = (int)threadIdx.x / kv_count, ki = (int)threadIdx.x % kv_count;
  int any_true = 0, any_false = 0;
  int seen_true = 0, seen_false = 0;
  for (int base = 0; base < elems; base += step) {
#pragma unroll
    for (int j = 0; j < FA_BLOCK_MASK_ELEMS_PER_VOTE; ++j) {
      if (base + j * FA_BLOCK_MASK_THREADS + (int)threadIdx.x < elems) {
        const bool keep = Mods::mask_mod(b, h, q0 + qi, kv0 + ki, cap);
        any_true |= keep ? 1 : 0;
        any_false |= keep ? 0 : 1;
      }
      qi += row_step;
      ki += col_step;
      if (ki >= kv_count) {
        ki -= kv_count;
        ++qi;
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

// One direction's tables from device kinds (FaBlockTablesParams), a warp per row: each 32
// columns, a ballot per kind places the row's partial and full columns at their ranks.
__device__ __forceinline__ void fa_block_tables_rows(const FaBlockTablesParams& p) {
  const int rows_per_group = p.transposed ? p.num_kv_blocks : p.num_q_blocks;
  const int cols = p.transposed ? p.num_q_blocks : p.num_kv_blocks;
  const long long rows = (long long)p.groups * rows_per_group;
  const long long group_tiles = (long long)p.num_q_blocks * p.num_kv_blocks;
  const int lane = (int)(threadIdx.x & 31);
  const unsigned below = (1u << lane) - 1u;
  const long long warps = blockDim.x >> 5;
  for (long long r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
    const long long g = r / rows_per_group;
    const int i = (int)(r - g * rows_per_group);
    // Column c of row i is tile first + c * step of the kinds.
    const long long first = g * group_tiles + (p.transposed ? i : (long long)i * p.num_kv_blocks);
    const long long step = p.transposed ? p.num_kv_blocks : 1;
    int* idx = p.idx + r * cols;
    int* full = p.full_idx + r * cols;
    unsigned char* sub = p.sub_out ? p.sub_out + r * cols : nullptr;
    int partials = 0, fulls = 0;
    for (int c0 = 0; c0 < cols; c0 += 32) {
      const int c = c0 + lane;
      const long long tile = first + c * step;
      const int kind = c < cols ? p.kinds[tile] : kFaBlockEmpty;
      const unsigned is_partial = __ballot_sync(0xffffffffu, kind == kFaBlockPartial);
      const unsigned is_full = __ballot_sync(0xffffffffu, kind == kFaBlockFull);
      if (kind == kFaBlockPartial) {
        const int at = partials + __popc(is_partial & below);
        idx[at] = c;
        if (sub) sub[at] = p.sub_kinds[tile];
      } else if (kind == kFaBlockFull) {
        full[fulls + __popc(is_full & below)] = c;
      }
      partials += __popc(is_partial);
      fulls += __popc(is_full);
    }
    for (int c = partials + lane; c < cols; c += 32) {
      idx[c] = 0;
      if (sub) sub[c] = 0;
    }
    for (int c = fulls + lane; c < cols; c += 32) full[c] = 0;
    if (lane == 0) {
      p.num[r] = partials;
      p.full_num[r] = fulls;
    }
  }
}

// Tile kinds from kv tables (FaBlockKindsParams), a warp per row: the row cleared, then its
// partial blocks, then its full ones marked.
__device__ __forceinline__ void fa_block_kinds_rows(const FaBlockKindsParams& p) {
  const long long rows = (long long)p.groups * p.num_q_blocks;
  const int cols = p.num_kv_blocks;
  const int lane = (int)(threadIdx.x & 31);
  const long long warps = blockDim.x >> 5;
  for (long long r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
    unsigned char* kinds = p.kinds + r * cols;
    for (int c = lane; c < cols; c += 32) kinds[c] = kFaBlockEmpty;
    __syncwarp();
    for (int pass = 0; pass < 2; ++pass) {
      const int* num = pass == 0 ? p.num : p.full_num;
      if (!num) continue;
      const int* idx = (pass == 0 ? p.idx : p.full_idx) + r * cols;
      const int n = min(max(num[r], 0), cols);
      for (int i = lane; i < n; i += 32) {
        const int kb = idx[i];
        if (kb >= 0 && kb < cols) kinds[kb] = (unsigned char)(pass == 0 ? kFaBlockPartial : kFaBlockFull);
      }
      __syncwarp();
    }
  }
}

// The join of source tiles [q_first, q_last] x [kv_first, kv_last] of one group: their kind
// where they all agree, else partial.
__device__ __forceinline__ int fa_block_join(const unsigned char* kinds, int num_kv_blocks, int q_first,
                                             int q_last, int kv_first, int kv_last) {
  const int join = kinds[(long long)q_first * num_kv_blocks + kv_first];
  for (int qb = q_first; qb <= q_last; ++qb)
    for (int kb = kv_first; kb <= kv_last; ++kb)
      if (kinds[(long long)qb * num_kv_blocks + kb] != join) return kFaBlockPartial;
  return join;
}

// A device mask regrouped into other blocks (FaBlockRegroupParams), a thread per new tile.
__device__ __forceinline__ void fa_block_regroup(const FaBlockRegroupParams& p) {
  const long long tiles = (long long)p.groups * p.out_q_blocks * p.out_kv_blocks;
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < tiles;
       t += (long long)gridDim.x * blockDim.x) {
    const int j = (int)(t % p.out_kv_blocks);
    const long long rest = t / p.out_kv_blocks;
    const int i = (int)(rest % p.out_q_blocks);
    const long long g = rest / p.out_q_blocks;
    const unsigned char* src = p.kinds + g * p.num_q_blocks * (long long)p.num_kv_blocks;
    const long long c0 = (long long)j * p.out_kv_block;
    const long long c1 = (c0 + p.out_kv_block < p.len_kv ? c0 + p.out_kv_block : p.len_kv) - 1;
    const int kv_first = (int)(c0 / p.kv_block), kv_last = (int)(c1 / p.kv_block);
    const long long r0 = (long long)i * p.out_q_block;
    const long long r1 = (r0 + p.out_q_block < p.len_q ? r0 + p.out_q_block : p.len_q) - 1;
    p.out[t] = (unsigned char)fa_block_join(src, p.num_kv_blocks, (int)(r0 / p.q_block), (int)(r1 / p.q_block),
                                            kv_first, kv_last);
    if (!p.sub_out) continue;
    int sub = 0;
    for (int c = 0; c < p.sub_count; ++c) {
      const long long s0 = r0 + 64LL * c;
      if (s0 >= p.len_q) break;  // kFaBlockEmpty
      const long long s1 = (s0 + 64 < p.len_q ? s0 + 64 : p.len_q) - 1;
      sub |= fa_block_join(src, p.num_kv_blocks, (int)(s0 / p.q_block), (int)(s1 / p.q_block), kv_first,
                           kv_last)
             << (2 * c);
    }
    p.sub_out[t] = (unsigned char)sub;
  }
}

// The classifier alone (what depends on the mask_mod), and the three table kernels alone (the
// same for every mask: fajit compiles them once, as a module of their own, codegen's
// generate_block_tables), or all four together.
#define FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER(name, Mods)                                                 \
  extern "C" __global__ void __launch_bounds__(FA_BLOCK_MASK_THREADS)                                  \
      name(const FaBlockMaskParams p, const FaCaptures cap) {                                          \
    fa_block_mask_classify<Mods>(p, cap);                                                              \
  }
#define FAJIT_DEFINE_BLOCK_TABLES(name)                                                                \
  extern "C" __global__ void __launch_bounds__(FA_BLOCK_MASK_THREADS) name##_tables(const FaBlockTablesParams p) { \
    fa_block_tables_rows(p);                                                                           \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(FA_BLOCK_MASK_THREADS)                                  \
      name##_regroup(const FaBlockRegroupParams p) {                                                   \
    fa_block_regroup(p);                                                                               \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(FA_BLOCK_MASK_THREADS) name##_kinds(const FaBlockKindsParams p) { \
    fa_block_kinds_rows(p);                                                                            \
  }
#define FAJIT_DEFINE_BLOCK_MASK(name, Mods)      \
  FAJIT_DEFINE_BLOCK_MASK_CLASSIFIER(name, Mods) \
  FAJIT_DEFINE_BLOCK_TABLES(name)

#endif  // FAJIT_BLOCK_MASK_CUH
