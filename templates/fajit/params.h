// fajit kernel ABI: the parameter blocks shared by the host runtime (C++) and the
// run-time compiled kernels (NVRTC). Plain C, fixed-size types only, no includes, so the
// same header compiles on both sides and the byte layout agrees by construction.
// Bump FAJIT_ABI_VERSION whenever a field changes (it is part of the cache key).
#ifndef FAJIT_PARAMS_H
#define FAJIT_PARAMS_H

#define FAJIT_ABI_VERSION 8

#define FA_MAX_BUFFERS 16
#define FA_MAX_BUFFER_RANK 4
#define FA_MAX_SCALARS 32

// A captured buffer read by score_mod/mask_mod (fa.load): device pointer plus element
// strides of each dimension (rank <= FA_MAX_BUFFER_RANK; unused strides are 0).
typedef struct FaBuffer {
  const void* ptr;
  long long stride[FA_MAX_BUFFER_RANK];
} FaBuffer;

// A runtime scalar (fa.scalar): its value is a kernel argument, so changing it never
// produces a new kernel.
typedef union FaScalar {
  float f;
  int i;
} FaScalar;

// Captures are addressed by slot: codegen assigns each captured buffer/scalar a slot in
// declaration order and the host fills the same slots.
typedef struct FaCaptures {
  FaBuffer buffers[FA_MAX_BUFFERS];
  FaScalar scalars[FA_MAX_SCALARS];
} FaCaptures;

// Block-sparse tables (int32, contiguous):
//   kv_num_blocks      [Bm, Hm, num_q_blocks]
//   kv_indices         [Bm, Hm, num_q_blocks, num_kv_blocks]
//   full_kv_num_blocks [Bm, Hm, num_q_blocks]             (null: no full blocks)
//   full_kv_indices    [Bm, Hm, num_q_blocks, num_kv_blocks]
// Bm is 1 or B, Hm is 1 or Hq; row(b, h, qb) = b*row_stride_b + h*row_stride_h + qb,
// with row_stride_b/h = 0 where the table is broadcast. Query block qb holds rows
// qb*q_block - q_offset .. (qb+1)*q_block - q_offset - 1 (q_offset 0 but for a mask regrouped
// for the persistent Hopper forward with its partial block first: BlockMask::regrouped_led).
//   kv_sub_kinds       [Bm, Hm, num_q_blocks, num_kv_blocks] uint8 (null: none), beside
//                      kv_indices: entry i of a row gives the kinds of the 64-row sub-blocks
//                      of that row's i-th partial tile, 2 bits each (sub-block c at bits
//                      2c..2c+1, kFaBlockEmpty / Partial / Full). A mask regrouped into taller
//                      blocks (BlockMask::regrouped) has them: its partial tile may join an
//                      empty or full sub-block of the original mask to a partial one.
typedef struct FaBlockTables {
  const int* kv_num_blocks;
  const int* kv_indices;
  const int* full_kv_num_blocks;
  const int* full_kv_indices;
  long long row_stride_b;
  long long row_stride_h;
  int num_q_blocks;
  int num_kv_blocks;
  int q_block;   // sparse block size along q (a multiple of the kernel's BLOCK_M)
  int kv_block;  // sparse block size along kv (a multiple of the kernel's BLOCK_N; the wgmma forward's
                 // BLOCK_N)
  const unsigned char* kv_sub_kinds;
  int q_offset;  // rows of the first query block before query 0 (a multiple of 64, below q_block)
} FaBlockTables;

// Forward attention. Element strides; the last (head) dimension is contiguous.
//   Q [B, Hq, Lq, Dqk]  K [B, Hkv, Lkv, Dqk]  V [B, Hkv, Lkv, Dv]  O [B, Hq, Lq, Dv]
//   LSE [B, Hq, Lq] fp32, natural log, null when not wanted.
//   MAX [B, Hq, Lq] fp32: each row's largest modded score (natural units, what the softmax
//       takes; -inf for a row with nothing unmasked), null when not wanted; written only by
//       the kernels compiled with FAJIT_ROW_MAX (KernelSpec::row_max).
// Scores handed to score_mod are already multiplied by `scale` (as in flex_attention).
typedef struct FaFwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  long long q_stride_b, q_stride_h, q_stride_m;
  long long k_stride_b, k_stride_h, k_stride_n;
  long long v_stride_b, v_stride_h, v_stride_n;
  long long o_stride_b, o_stride_h, o_stride_m;
  long long lse_stride_b, lse_stride_h;
  float* max_scores;
  long long max_stride_b, max_stride_h;
  int batch, heads_q, heads_kv, len_q, len_kv;
  float scale;
  FaBlockTables mask;
  // Ragged and paged layouts, read only by kernels compiled for them (fa::SequenceLayout; null
  // and 0 otherwise). The tables are device int32. For sequence b:
  //   cu_seqlens_q [B+1]: its queries are rows cu_seqlens_q[b] .. [b+1]-1 along q_stride_m of
  //                       q and o (q_stride_b = o_stride_b = 0), its LSE and MAX entries
  //                       from cu_seqlens_q[b] on (their batch strides 0); len_q is the longest
  //   cu_seqlens_k [B+1]: its keys are rows cu_seqlens_k[b] .. [b+1]-1 of k and v
  //   seqlens_k    [B]:   its key count (keys at or past it are never read)
  //   page_table   [B, page_table_stride]: key kv is row kv % page_size of page
  //                       page_table[b][kv / page_size]; k_stride_b / v_stride_b are the
  //                       page strides of the pools
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* seqlens_k;
  const int* page_table;
  long long page_table_stride;
  int page_size;
  // The persistent Hopper forward's work counter (device int32, zero at launch; null for every
  // other kernel): the query blocks past the grid's first are handed out by atomicAdd on it.
  int* tile_counter;
} FaFwdParams;

// Two [B, H, L, D] operands of a Hopper kernel as TMA tensor maps, each a CUtensorMap (128
// opaque bytes encoded by the driver on the host, 64-byte aligned) with dims {D, L, H, B},
// boxes of 64 columns x the kernel's tile rows, 128B swizzle, zero fill out of bounds: the
// forward's K (a) and V (b), the backward dK/dV kernel's Q (a) and dO (b). enabled = 0 when
// the driver did not take a tensor (a base or stride not a multiple of 16 bytes, say): the
// kernel's producer copies them with cp.async instead.
typedef struct __attribute__((aligned(64))) FaTensorMap {
  unsigned long long opaque[16];
} FaTensorMap;
typedef struct __attribute__((aligned(64))) FaTmaPair {
  FaTensorMap a;
  FaTensorMap b;
  int enabled;
} FaTmaPair;
// The backward's fp32 dQ accumulator [B, Hq, Lq, D] (contiguous) as a tensor map {D, Lq, Hq, B}
// with boxes of 32 columns x 64 rows, 128B swizzle, for the Hopper dK/dV kernel's dQ writers
// (bulk reductions; rows past Lq are not written). enabled = 0 (FAJIT_TMA=0, or the driver did
// not take it): the writers reduce row by row instead.
typedef struct __attribute__((aligned(64))) FaTmaMap {
  FaTensorMap map;
  int enabled;
} FaTmaMap;

// Split-KV decoding (fajit/decode.cuh): the forward's tensors and tables for a short query
// (len_q <= the q_block of the tables, so one row of block tables), the rows of `heads_per_cta`
// query heads of one GQA group packed into one tile (row r: head h0 + r / len_q, query
// r % len_q; heads_per_cta is the group size when the tables are the same for every head
// (mask.row_stride_h == 0), else 1), and the KV walk cut into `splits` parts over the grid:
//   o_part   [splits, B, Hq, Lq, Dv] fp32: each part's O, normalised by its own row sum
//   m_part   [splits, B, Hq, Lq]     fp32: each part's row max m (score units; -inf: nothing seen)
//   l_part   [splits, B, Hq, Lq]     fp32: log2 of its row sum relative to m·sl2, so the part's
//                                    LSE·log2 e is m·sl2 + l_part (SoftmaxRows::log2_sum)
// One f32 LSE per part would not do: at |LSE| past ~2^17 its rounding alone moves a part's
// weight by more than the tolerance (and at 3e9 the log of a part's row count is lost).
//   x_part   [splits, B, Hq, Lq]     fp32: each part's largest score (score units), for fwd.max_scores;
//                                    null unless the kernel is compiled with FAJIT_ROW_MAX
// (m_part is not that: the conditional rescale keeps a reference up to 8 log2 units below it.)
// The combine kernel weighs the parts by exp2((m_part - M)·sl2 + l_part) into fwd.o, fwd.lse.
typedef struct FaDecodeParams {
  FaFwdParams fwd;
  float* o_part;
  float* m_part;
  float* l_part;
  float* x_part;
  int heads_per_cta;
  int splits;
} FaDecodeParams;

// Backward attention (fajit/backward.cuh). Element strides; the head dimension is contiguous.
// Inputs as in the forward plus O, dO [B, Hq, Lq, Dv] and the forward's LSE [B, Hq, Lq]
// (fp32, natural log); dLSE (same shape, null = 0) is the gradient of a loss that uses the
// LSE too. Outputs dQ [B, Hq, Lq, Dqk], dK [B, Hkv, Lkv, Dqk], dV [B, Hkv, Lkv, Dv] in the
// element type (GQA: a KV head's dK/dV sum over its query heads). Scratch the host provides:
//   delta    fp32 rowsum(dO * O) - dLSE (the preprocess kernel): row (b, h, q) at
//            b * delta_stride_b + h * delta_stride_h + q ([B, Hq, Lq] contiguous when dense,
//            [Hq, total_q] in the ragged layout)
//   dq_accum fp32, the same rows of Dqk values each (row i at i * Dqk): zeroed by the
//            preprocess kernel, accumulated by the dK/dV kernel, scaled and converted into dQ
//            by the last kernel.
// mask_t: the transposed block tables in the FaBlockTables layout, read along the other
// axis: rows are KV blocks, columns query blocks, i.e. kv_num_blocks / kv_indices /
// full_kv_* hold flex's q_num_blocks / q_indices / full_q_*, num_q_blocks is the number of
// KV blocks, num_kv_blocks the number of query blocks, q_block the KV block size and
// kv_block the query block size.
typedef struct FaBwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  const float* dlse;
  void* dq;
  void* dk;
  void* dv;
  float* delta;
  float* dq_accum;
  long long q_stride_b, q_stride_h, q_stride_m;
  long long k_stride_b, k_stride_h, k_stride_n;
  long long v_stride_b, v_stride_h, v_stride_n;
  long long o_stride_b, o_stride_h, o_stride_m;
  long long do_stride_b, do_stride_h, do_stride_m;
  long long dq_stride_b, dq_stride_h, dq_stride_m;
  long long dk_stride_b, dk_stride_h, dk_stride_n;
  long long dv_stride_b, dv_stride_h, dv_stride_n;
  long long lse_stride_b, lse_stride_h;
  long long dlse_stride_b, dlse_stride_h;
  long long delta_stride_b, delta_stride_h;
  int batch, heads_q, heads_kv, len_q, len_kv;
  float scale;
  FaBlockTables mask_t;
  FaBlockTables mask;  // the forward's tables (deterministic mode: the dQ kernel walks them, or
                       // the Hopper dQ writers count a part's place in its rows' order there)
  // The ragged layout (kernels compiled for it; null otherwise), as FaFwdParams': sequence b's
  // queries are rows cu_seqlens_q[b].. of q, o, dout, dq (batch strides 0) and entries
  // cu_seqlens_q[b].. of lse, dlse and delta (their batch strides 0); its keys rows
  // cu_seqlens_k[b].. of k, v, dk, dv. len_q / len_kv are the longest. No paged K/V.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  // Deterministic mode on the Hopper dK/dV kernel (codegen's bwd_orders_dq): one counter per 64
  // query rows of each (sequence b, query head), [B, Hq, dq_order_units] zeroed before the
  // launch; the dQ writers add their parts into dq_accum in ascending key-block order, each
  // waiting for the count of the parts before its own. Null otherwise.
  int* dq_order;
  int dq_order_units;  // counters per (b, query head): ceil(len_q / BLOCK_M) * BLOCK_M / 64, len_q
                       // the longest
} FaBwdParams;

// Gradients of captured float buffers (the backward's third argument): slot i receives the
// gradient of FaCaptures.buffers[i] (fp32, its own strides; null = not wanted), accumulated
// from dS * d(score_mod)/d(buffer) at every element the score_mod read.
typedef struct FaGradBuffer {
  float* ptr;
  long long stride[FA_MAX_BUFFER_RANK];
} FaGradBuffer;
typedef struct FaGradBuffers {
  FaGradBuffer buffers[FA_MAX_BUFFERS];
} FaGradBuffers;

// The kind of a tile of the score matrix, as a byte: the host's fa::BlockKind takes its values
// from here. kFaBlockUndecided marks a tile nothing has classified yet.
enum { kFaBlockEmpty = 0, kFaBlockPartial = 1, kFaBlockFull = 2, kFaBlockUndecided = 255 };

// Block-mask builder (fajit/block_mask.cuh): classifies every (b, h, q-block, kv-block) tile
// of the score matrix by evaluating mask_mod on each in-range element:
//   kinds [Bm, Hm, num_q_blocks, num_kv_blocks] uint8: kFaBlockEmpty, kFaBlockPartial or
//   kFaBlockFull.
// Tile t = ((b * heads + h) * num_q_blocks + qb) * num_kv_blocks + kb; mask_mod sees b = 0
// when batch (Bm) is 1 and h = 0 when heads (Hm) is 1 (broadcast masks).
// `known` (optional, same layout) holds kinds decided beforehand (e.g. by range analysis):
// empty/partial/full entries are copied, any other value (use kFaBlockUndecided) means
// "evaluate".
typedef struct FaBlockMaskParams {
  unsigned char* kinds;
  const unsigned char* known;
  long long num_tiles;  // batch * heads * num_q_blocks * num_kv_blocks
  int batch, heads;     // Bm, Hm
  int len_q, len_kv;
  int num_q_blocks, num_kv_blocks;
  int q_block, kv_block;
} FaBlockMaskParams;

// The tables of a mask whose kinds are on the device (block_mask.cuh's <name>_tables kernel):
// one direction's set from `kinds` [groups, num_q_blocks, num_kv_blocks]. transposed = 0: rows
// are q blocks and columns kv blocks (kv_num_blocks [groups * num_q_blocks], kv_indices
// [.., num_kv_blocks], full_*); 1: rows are kv blocks, columns q blocks (the q_* tables). Each
// row lists its partial / full columns in ascending order, padded with 0 after its count, as
// fa::BlockMask's host tables. `sub_kinds` (same layout as kinds, or null) gives each tile's
// 64-row sub-block kinds; sub_out (rows x columns, or null) receives them in kv_indices' order
// (FaBlockTables::kv_sub_kinds), 0 after the row's last partial tile.
typedef struct FaBlockTablesParams {
  const unsigned char* kinds;
  const unsigned char* sub_kinds;
  int* num;
  int* idx;
  int* full_num;
  int* full_idx;
  unsigned char* sub_out;
  int groups;  // Bm * Hm
  int num_q_blocks, num_kv_blocks;
  int transposed;
} FaBlockTablesParams;

// Tile kinds from kv tables in flex's layout (block_mask.cuh's <name>_kinds kernel): kinds
// [groups, num_q_blocks, num_kv_blocks] is empty except where row r's first num[r] entries of
// idx (partial) and full_num[r] of full_idx (full; null: none) name a block. Counts are clamped to
// [0, num_kv_blocks] and entries outside [0, num_kv_blocks) skipped: bad tables (the caller's to
// keep valid; FAJIT_CHECK_DEVICE_TABLES=1 checks them) never make a write out of bounds.
typedef struct FaBlockKindsParams {
  const int* num;
  const int* idx;
  const int* full_num;
  const int* full_idx;
  unsigned char* kinds;
  int groups;
  int num_q_blocks, num_kv_blocks;
} FaBlockKindsParams;

// A device mask regrouped into other blocks (block_mask.cuh's <name>_regroup kernel), as
// fa::BlockMask::regrouped does on the host: tile (g, i, j) of `out` [groups, out_q_blocks,
// out_kv_blocks] is the join of the source tiles it overlaps (one kind where they all agree,
// else partial; positions past len_q / len_kv belong to no tile). With sub_out (same layout as
// out, or null), each tile's 64-row sub-blocks c < sub_count get the join of the source tiles
// their rows overlap at bits 2c..2c+1 (0 for sub-blocks past len_q).
typedef struct FaBlockRegroupParams {
  const unsigned char* kinds;  // [groups, num_q_blocks, num_kv_blocks]
  unsigned char* out;
  unsigned char* sub_out;
  int groups;
  int len_q, len_kv;
  int num_q_blocks, num_kv_blocks, q_block, kv_block;
  int out_q_blocks, out_kv_blocks, out_q_block, out_kv_block;
  int sub_count;
} FaBlockRegroupParams;

#endif  // FAJIT_PARAMS_H
