// fajit device prelude: element types, conversions, fast math, warp shuffles and global /
// shared-memory movement as small inline-PTX primitives. NVRTC compiles this with no CUDA
// toolkit header, so nothing here includes anything; every primitive is one job, destination
// first. sm_80+ (cp.async, cvt.*x2.f32, bf16 mma).
#ifndef FAJIT_PRELUDE_CUH
#define FAJIT_PRELUDE_CUH

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace fa {

typedef unsigned int u32;
typedef unsigned long long u64;

// ---- element types -----------------------------------------------------------------------
// 16-bit storage types selected by a kernel config (`using Element = fa::bf16_t;`). They are
// only bit containers: arithmetic happens in fp32 or inside mma.sync.
struct f16_t {
  unsigned short bits;
};
struct bf16_t {
  unsigned short bits;
};

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = exp2(x * kLog2e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2):   log(x) = log2(x) * kLn2

// ---- conversions -------------------------------------------------------------------------
// Two fp32 values rounded to nearest-even and packed: `lo` in bits 0..15, `hi` in 16..31.
__device__ __forceinline__ u32 pack2(f16_t*, float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ u32 pack2(bf16_t*, float lo, float hi) {
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
template <typename Element>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  return pack2(static_cast<Element*>(nullptr), lo, hi);
}

// The two 16-bit values of a packed pair as fp32 (`lo` = bits 0..15).
__device__ __forceinline__ void unpack2(f16_t*, u32 v, float& lo, float& hi) {
  asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(v));
}
__device__ __forceinline__ void unpack2(bf16_t*, u32 v, float& lo, float& hi) {
  lo = __uint_as_float(v << 16);
  hi = __uint_as_float(v & 0xffff0000u);
}
template <typename Element>
__device__ __forceinline__ void unpack2(u32 v, float& lo, float& hi) {
  unpack2(static_cast<Element*>(nullptr), v, lo, hi);
}

// ---- math --------------------------------------------------------------------------------
// 2^x, approximate (2 ulp); ex2(-inf) = +0, so masked scores vanish without a branch.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// log2(x), approximate; lg2(0) = -inf.
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- warp shuffles -----------------------------------------------------------------------
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
// Max / sum over the 4 lanes of an mma quad (lanes 4g..4g+3 hold one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, shfl_xor(v, 1));
  return fmaxf(v, shfl_xor(v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}
// Max / sum over the 32 lanes of a warp (every lane gets the result).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v = fmaxf(v, shfl_xor(v, m));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v += shfl_xor(v, m);
  return v;
}

// ---- programmatic dependent launch (sm_90+; no-ops before) -------------------------------
// A kernel launched after this one with rt::launch_dependent may start now: its CTAs are
// scheduled once every CTA of this grid has called this (or exited), and wait in
// wait_for_prior_grids before they read what this grid writes.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Blocks until the grids this one depends on have finished and their writes are visible.
__device__ __forceinline__ void wait_for_prior_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- shared memory -----------------------------------------------------------------------
// Shared-window address of a generic pointer (what ldmatrix/cp.async/st.shared take).
__device__ __forceinline__ u32 smem_addr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void st_shared_b32(u32 addr, u32 v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v));
}
__device__ __forceinline__ u32 ld_shared_b32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
struct u32x4 {
  u32 x, y, z, w;
};
__device__ __forceinline__ u32x4 ld_shared_v4(u32 addr) {
  u32x4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
// Every element of an array of accumulator fragments (N fragments of 4 floats) set to 0.
template <int N>
__device__ __forceinline__ void zero_frags(float (&a)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[j][i] = 0.f;
}

__device__ __forceinline__ void st_global_v4(void* p, u32x4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 4 bytes (a packed 16-bit pair) / two fp32 values (8-byte aligned) to global memory.
__device__ __forceinline__ void st_global_b32(void* p, u32 v) {
  asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_global_v2_f32(float* p, float a, float b) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

__device__ __forceinline__ u32x4 ld_global_v4(const void* p) {
  u32x4 v;
  asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ void st_shared_f32(u32 addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
struct f32x2 {
  float x, y;
};
// Two consecutive fp32 values from global memory (8-byte aligned address).
__device__ __forceinline__ f32x2 ld_global_v2_f32(const float* p) {
  f32x2 v;
  asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}
// Two consecutive fp32 values (8-byte aligned address).
__device__ __forceinline__ f32x2 ld_shared_v2_f32(u32 addr) {
  f32x2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_v2_f32(u32 addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
// *p += v in global memory, atomically, no result (fp32 reductions: dQ, buffer gradients).
__device__ __forceinline__ void red_add_f32(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
// p[0] += a, p[1] += b as one vector reduction (8-byte aligned p). sm_90+ only.
__device__ __forceinline__ void red_add_v2_f32(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// ---- cp.async (global -> shared, 16 bytes, L2 only) ------------------------------------
// Copies 16 bytes when `valid`, else writes 16 zero bytes and reads nothing (src-size 0);
// callers still pass an in-bounds `src` so no address is ever formed out of range.
__device__ __forceinline__ void cp_async_16(u32 dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// The smallest power of two >= n (n >= 1).
__host__ __device__ constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

// ---- strided work split -----------------------------------------------------------------
// f(idx) for idx = tid, tid + kThreads, ... below kTotal: kTotal items spread over kThreads
// threads (`tid` the caller's index among them), unrolled; the last round is guarded only when
// kTotal is not a multiple of kThreads.
template <int kTotal, int kThreads, typename F>
__device__ __forceinline__ void for_each_strided(int tid, F&& f) {
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) f(idx);
  }
}

// ---- swizzled tiles ----------------------------------------------------------------------
// A shared tile of rows of kPitch 16-byte chunks (8 elements each). Chunk c of row r is stored
// at chunk (c ^ (r % 8)): the 8 rows an ldmatrix phase reads (same logical chunk) land in 8
// distinct 16-byte bank groups, so ldmatrix, cp.async and the epilogue's 4-byte stores are
// conflict-free. The XOR stays inside a group of 8 chunks, so kPitch is a multiple of 8.
template <int kPitch>
__device__ __forceinline__ u32 swizzle_offset(int row, int chunk) {
  static_assert(kPitch > 0 && kPitch % 8 == 0, "swizzled rows are whole groups of 8 chunks (64 elements)");
  return static_cast<u32>((row * kPitch + (chunk ^ (row & 7))) * 16);
}
// The same layout as a staging-layout type (attention_tile.cuh's epilogue takes any).
template <int kPitch>
struct SwizzledRows {
  static __device__ __forceinline__ u32 offset(int row, int chunk) {
    return swizzle_offset<kPitch>(row, chunk);
  }
};

// A row of kDim 16-bit elements (a head dim: any multiple of 8) as the MMAs and a swizzled
// shared tile see it. Global memory holds kChunks 16-byte chunks; the MMAs work in 16-column
// steps (kSteps), so an odd chunk count is read with one zero chunk after it (kUsed chunks);
// a shared row is kPitch chunks, kUsed rounded up to whole swizzle groups (d 80 -> 16).
template <int kDim>
struct HeadRow {
  static_assert(kDim > 0 && kDim % 8 == 0, "a head dim is a multiple of 8");
  static constexpr int kDimension = kDim;
  static constexpr int kChunks = kDim / 8;
  static constexpr int kSteps = (kChunks + 1) / 2;
  static constexpr int kUsed = 2 * kSteps;
  static constexpr int kPitch = (kUsed + 7) / 8 * 8;
  static constexpr int kRowBytes = kPitch * 16;  // one shared row
};

// cp.async of chunk c of head row r (Row = HeadRow<D>) into a swizzled shared tile, from the
// row that starts at `row` in global memory: zero-filled past the row's kChunks and where
// `valid` is false (neither reads global memory; `row` must still be an in-bounds address).
template <typename Row>
__device__ __forceinline__ void copy_row_chunk_async(u32 dst, int r, int c, const void* row, bool valid) {
  // the zero tail chunk (odd chunk counts) points at the row's last chunk, reads nothing
  const int cs = Row::kUsed == Row::kChunks || c < Row::kChunks ? c : Row::kChunks - 1;
  valid = valid && (Row::kUsed == Row::kChunks || c < Row::kChunks);
  cp_async_16(dst + swizzle_offset<Row::kPitch>(r, c), static_cast<const char*>(row) + cs * 16, valid);
}

// cp.async of kRows head rows (Row = HeadRow<D>) into a swizzled shared tile, spread over
// kThreads threads (`tid` among them): the kUsed chunks of each row, zero-filled past the row's
// kChunks and for rows the source does not have (neither read from global memory).
// row_src(r, valid) gives the global address of row r and sets `valid`; for an invalid row it
// still returns an in-bounds address (cp.async forms it, reads nothing).
template <int kRows, typename Row, int kThreads, typename RowSrc>
__device__ __forceinline__ void load_rows_async(u32 dst, int tid, RowSrc&& row_src) {
  for_each_strided<kRows * Row::kUsed, kThreads>(tid, [&](int idx) {
    const int r = idx / Row::kUsed, c = idx % Row::kUsed;
    bool valid;
    const auto* row = row_src(r, valid);
    copy_row_chunk_async<Row>(dst, r, c, row, valid);
  });
}
// The same for rows row0.. of a [len, D] operand with row stride `stride` elements; rows
// >= len are zero-filled. (Written out rather than through load_rows_async: this form keeps
// the address arithmetic the GPU-verified kernels were measured with, PTX for PTX.)
template <int kRows, typename Row, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(u32 dst, const Element* src, long long stride, int row0,
                                                int len, int tid) {
  for_each_strided<kRows * Row::kUsed, kThreads>(tid, [&](int idx) {
    const int r = idx / Row::kUsed, c = idx % Row::kUsed;
    const bool valid = row0 + r < len && (Row::kUsed == Row::kChunks || c < Row::kChunks);
    const Element* g = src + (valid ? (long long)(row0 + r) * stride + c * 8 : 0ll);
    cp_async_16(dst + swizzle_offset<Row::kPitch>(r, c), g, valid);
  });
}

// A when kFirst, else B (NVRTC's device code has no <type_traits>).
template <bool kFirst, typename A, typename B>
struct PickType {
  using Type = A;
};
template <typename A, typename B>
struct PickType<false, A, B> {
  using Type = B;
};

// A compile-time bool as a value (a generic lambda's `auto` argument picks an instantiation).
template <bool kValue>
struct BoolTag {
  static constexpr bool value = kValue;
};

}  // namespace fa

#endif  // FAJIT_PRELUDE_CUH
