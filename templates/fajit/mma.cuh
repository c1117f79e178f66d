// fajit tensor-core primitives for sm_80+: ldmatrix and mma.sync m16n8k16 (fp32 accumulate).
//
// Fragment layouts (lane = 4*g + t, g = lane / 4 in 0..7, t = lane % 4):
//   A 16x16 (row-major), 4 x b32:  a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                                  a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B 16x8 (k x n),      2 x b32:  b0 = B[2t..2t+1][g]    b1 = B[2t+8..2t+9][g]
//   C/D 16x8 fp32,       4 x f32:  c0,c1 = C[g][2t..2t+1] c2,c3 = C[g+8][2t..2t+1]
// So accumulator element i of an n-tile sits at row g + 8*(i/2), column 2t + i%2, and two
// adjacent n-tiles of an accumulator, packed pairwise, are exactly an A fragment (P·V reuses
// the softmax probabilities straight from registers).
#ifndef FAJIT_MMA_CUH
#define FAJIT_MMA_CUH

#include "fajit/prelude.cuh"

namespace fa {

// Four 8x8 b16 matrices; lane l gives the row address of matrix l/8, row l%8.
// Lane l receives element pair (row l/4, cols 2*(l%4)..+1) of each matrix.
__device__ __forceinline__ void ldmatrix_x4(u32 (&d)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}
// Same, transposed: lane l receives (rows 2*(l%4)..+1, col l/4) of each matrix.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&d)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}

// d += a · b on a 16x8x16 tile, fp32 accumulators.
__device__ __forceinline__ void mma_16816(f16_t*, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(bf16_t*, float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  mma_16816(static_cast<Element*>(nullptr), d, a, b0, b1);
}

// ---- ldmatrix lane offsets (bytes, within a swizzled tile of kChunks chunks per row) -------
// The four chunk offsets of this lane for the operand roles of m16n8k16 (k-step kk uses
// off[kk % 4] + (kk / 4) * 128; kk spans 16 columns = 2 chunks); add the tile row base.
//   A (rows = m, k contiguous) and B with .trans (rows = k, n contiguous):
//     lane row (lane & 7) + 8 * ((lane >> 3) & 1), chunk bit lane >> 4
//   B (rows = n, k contiguous) and A with .trans (rows = k, m contiguous):
//     lane row (lane & 7) + 8 * (lane >> 4), chunk bit (lane >> 3) & 1
template <int kChunks>
__device__ __forceinline__ void lane_offsets_a(u32 (&off)[4], int lane) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
    off[c] =
        ((lane & 7) + ((lane >> 3) & 1) * 8) * (kChunks * 16) + (((2 * c) ^ (lane >> 4) ^ (lane & 7)) << 4);
}
template <int kChunks>
__device__ __forceinline__ void lane_offsets_b(u32 (&off)[4], int lane) {
#pragma unroll
  for (int c = 0; c < 4; ++c)
    off[c] =
        ((lane & 7) + (lane >> 4) * 8) * (kChunks * 16) + (((2 * c) ^ ((lane >> 3) & 1) ^ (lane & 7)) << 4);
}
// Byte offset of the 16x16 block (16-row block rb, 16-column step kk) for a lane offset set.
template <int kChunks>
__device__ __forceinline__ u32 frag_at(const u32 (&off)[4], int rb, int kk) {
  return off[kk % 4] + (kk / 4) * 128 + rb * 16 * (kChunks * 16);
}

}  // namespace fa

#endif  // FAJIT_MMA_CUH
