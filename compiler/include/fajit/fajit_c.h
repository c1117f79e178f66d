/* fajit C API: a stable ABI for embedding fajit in other frameworks' graph compilers and in
 * Python (ctypes). Every call returns a status; on failure fajit_last_error() holds the
 * message (thread-local, valid until the next failing call on this thread).
 *
 *   fajit_kernel* k;
 *   fajit_options o = fajit_default_options();
 *   if (fajit_compile_mlir(mlir_text, &o, &k) != FAJIT_OK) puts(fajit_last_error());
 *   fajit_block_mask* m;
 *   fajit_kernel_block_mask(k, B, H, L, L, NULL, stream, &m);
 *   fajit_kernel_forward(k, &q, &k_, &v, &o, NULL, 0.0f, m, NULL, stream);
 */
#ifndef FAJIT_C_H
#define FAJIT_C_H

#include <stddef.h>
#include <stdint.h>

#include "fajit/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fajit_status {
  FAJIT_OK = 0,
  FAJIT_ERROR_INVALID_ARGUMENT = 1,
  FAJIT_ERROR_COMPILE = 2,
  FAJIT_ERROR_CUDA = 3,
  FAJIT_ERROR_IO = 4,
  FAJIT_ERROR_INTERNAL = 5
} fajit_status;

/* Element types; values match fa::DType. */
typedef enum fajit_dtype { FAJIT_F16 = 0, FAJIT_BF16 = 1, FAJIT_F32 = 2, FAJIT_I32 = 3 } fajit_dtype;

typedef struct fajit_options {
  fajit_dtype dtype; /* FAJIT_BF16 or FAJIT_F16 */
  int head_dim_qk;   /* a multiple of 8 from 32 to 256 */
  int head_dim_v;    /* a multiple of 8 from 32 to 256 */
  const char* arch;  /* NULL or "" = the current GPU's (sm_90a without one) */
} fajit_options;

/* A device tensor: rank <= 4, element strides, last stride 1. */
typedef struct fajit_tensor {
  void* data;
  fajit_dtype dtype;
  int rank;
  int64_t shape[4];
  int64_t stride[4];
} fajit_tensor;

typedef struct fajit_buffer_capture {
  const char* name;
  fajit_tensor tensor; /* f32 or i32 */
} fajit_buffer_capture;

typedef struct fajit_scalar_capture {
  const char* name;
  int is_float;
  float f;
  int32_t i;
} fajit_scalar_capture;

typedef struct fajit_captures {
  const fajit_buffer_capture* buffers;
  int num_buffers;
  const fajit_scalar_capture* scalars;
  int num_scalars;
} fajit_captures;

typedef struct fajit_kernel fajit_kernel;
typedef struct fajit_block_mask fajit_block_mask;

FA_API const char* fajit_last_error(void);
FA_API fajit_options fajit_default_options(void);

/* Compile from fa-dialect MLIR text (at most one fa.score_mod and one fa.mask_mod). */
FA_API fajit_status fajit_compile_mlir(const char* mlir_text, const fajit_options* options,
                                       fajit_kernel** out);
/* Compile from CLI presets ("causal", "sliding:W", ...; NULL = noop / identity). */
FA_API fajit_status fajit_compile_preset(const char* mask_preset, const char* score_preset,
                                         const fajit_options* options, fajit_kernel** out);
FA_API void fajit_kernel_destroy(fajit_kernel* kernel);

FA_API const char* fajit_kernel_cuda_source(const fajit_kernel* kernel);
FA_API const char* fajit_kernel_mlir(const fajit_kernel* kernel);
FA_API const char* fajit_kernel_cache_key(const fajit_kernel* kernel);
/* "memory", "disk" or "compiled". */
FA_API const char* fajit_kernel_origin(const fajit_kernel* kernel);
FA_API const void* fajit_kernel_cubin(const fajit_kernel* kernel, size_t* size);
/* What autotuning chose so far (fa::Options::autotune; $FAJIT_AUTOTUNE=0 turns it off): one
   line per shape class, "" when nothing was tuned or tuning is off. Owned by the kernel, valid
   until the next call of this function on it. */
FA_API const char* fajit_kernel_autotune_report(fajit_kernel* kernel);
/* PTX, compiled on first request; owned by the kernel. */
FA_API fajit_status fajit_kernel_ptx(fajit_kernel* kernel, const char** ptx);

/* The kernels fajit_kernel_warm compiles now instead of on first use (flags, OR-ed). */
typedef enum fajit_warm_flag {
  FAJIT_WARM_BLOCK_MASK = 1,    /* the block-mask builder: classifier (none for a no-op mask), table kernels */
  FAJIT_WARM_BACKWARD = 2,      /* the backward kernels */
  FAJIT_WARM_DETERMINISTIC = 4, /* the backward kernels of deterministic mode */
  FAJIT_WARM_DECODE = 8,        /* the split-KV decoding kernel */
  FAJIT_WARM_RAGGED = 16,       /* the packed (cu_seqlens) prefill and decoding kernels */
  FAJIT_WARM_PAGED = 32,        /* the paged-KV prefill and decoding kernels */
  FAJIT_WARM_ROW_MAX = 64,      /* also the row-max twins (max_scores) of the forward-side kernels named */
  FAJIT_WARM_CANDIDATES = 128   /* the dense forward's autotuning candidates (a first tuning only times them;
                                   compiled whatever the kernel's autotune setting) */
} fajit_warm_flag;
/* Compiles now, through the memory and disk caches, the kernels `flags` names (fa::Kernel::warm).
 * *kernels (optional) gets how many kernels the variant has compiled or found, the forward
 * included. An unknown flag bit is FAJIT_ERROR_INVALID_ARGUMENT; a score_mod without a
 * derivative and FAJIT_WARM_BACKWARD fails as the first backward would. */
FA_API fajit_status fajit_kernel_warm(const fajit_kernel* kernel, unsigned flags, int* kernels);

/* A parsed, verified and simplified fa module (what fajit_compile_mlir compiles), for callers
 * that want the canonical IR, its captures or block masks without compiling a forward kernel
 * (the Python package traces mods to fa text and goes through these). */
typedef struct fajit_program fajit_program;

FA_API fajit_status fajit_program_parse(const char* mlir_text, fajit_program** out);
/* The library mods by CLI preset name, as fajit_compile_preset traces them. */
FA_API fajit_status fajit_program_preset(const char* mask_preset, const char* score_preset,
                                         fajit_program** out);
FA_API void fajit_program_destroy(fajit_program* program);
/* The canonical fa-dialect text (owned by the program). */
FA_API const char* fajit_program_mlir(const fajit_program* program);
/* The score_mod's derivative (fa.score_grad) as text, or FAJIT_ERROR_COMPILE naming the op
 * that has none. Owned by the program. */
FA_API fajit_status fajit_program_score_grad_mlir(fajit_program* program, const char** text);

typedef struct fajit_capture_info {
  const char* name; /* owned by the program */
  int is_buffer;    /* else a runtime scalar */
  int is_float;     /* f32, else i32 */
  int rank;         /* buffers only */
  int used_by_score;
  int used_by_mask;
  int has_gradient; /* an f32 buffer the score_mod reads: fajit_kernel_backward can give its gradient */
} fajit_capture_info;

/* Captured buffers (first-use order) then scalars (by name). */
FA_API int fajit_program_num_captures(const fajit_program* program);
FA_API fajit_status fajit_program_capture(const fajit_program* program, int index, fajit_capture_info* out);

/* The program's mods evaluated on the CPU as the kernels evaluate them (f32 arithmetic, i32
 * indices wrapping; fajit's interpreter, the one its float64 reference uses) at n points: with
 * score_out, score_out[i] = score_mod(score[i], b[i], h[i], q[i], kv[i]); with mask_out,
 * mask_out[i] = mask_mod(b[i], h[i], q[i], kv[i]) (0 or 1). Either may be NULL, not both; the
 * identity / noop where the program has none. Captured buffers are host memory here (f32 or
 * i32, strides in elements). For checking a translated mod against its source framework's
 * semantics; a load out of a buffer's bounds or an integer division by zero is an error
 * naming it. */
FA_API fajit_status fajit_program_evaluate(const fajit_program* program, int64_t n, const int32_t* b,
                                           const int32_t* h, const int32_t* q, const int32_t* kv,
                                           const float* score, const fajit_captures* captures, float* score_out,
                                           uint8_t* mask_out);

FA_API fajit_status fajit_compile_program(const fajit_program* program, const fajit_options* options,
                                          fajit_kernel** out);
/* fajit_compile_program, with the kernels `background` names (fajit_warm_flag bits: only
 * FAJIT_WARM_BACKWARD) compiled on a background thread while the forward compiles
 * (fa::Options::backward_in_background), so that training's first backward finds them ready.
 * Another bit is FAJIT_ERROR_INVALID_ARGUMENT; a failure in the background (a score_mod without
 * a derivative) is reported by the first backward, as without the flag. */
FA_API fajit_status fajit_compile_program_background(const fajit_program* program,
                                                     const fajit_options* options, unsigned background,
                                                     fajit_kernel** out);

/* The program's mask_mod as a block mask for [B, H, Lq, Lkv] with q_block x kv_block tiles
 * (0 = 128), without a kernel: blocks the symbolic analysis decides need nothing compiled;
 * the rest are evaluated on the GPU by a builder compiled from the mask_mod (options: its
 * element type, head dims and arch; NULL = defaults). */
FA_API fajit_status fajit_program_block_mask(const fajit_program* program, int batch, int heads,
                                             int64_t len_q, int64_t len_kv, int q_block, int kv_block,
                                             const fajit_captures* captures, const fajit_options* options,
                                             void* cu_stream, fajit_block_mask** out);

FA_API fajit_status fajit_kernel_block_mask(const fajit_kernel* kernel, int batch, int heads, int64_t len_q,
                                            int64_t len_kv, const fajit_captures* captures, void* cu_stream,
                                            fajit_block_mask** out);
/* fajit_kernel_block_mask with q_block x kv_block tiles (0 = 128). */
FA_API fajit_status fajit_kernel_block_mask_sized(const fajit_kernel* kernel, int batch, int heads,
                                                  int64_t len_q, int64_t len_kv, int q_block, int kv_block,
                                                  const fajit_captures* captures, void* cu_stream,
                                                  fajit_block_mask** out);
/* From flex_attention's kv tables on the host (torch's BlockMask layout, int32, contiguous):
 * kv_num_blocks [Bm, Hm, nq], kv_indices [Bm, Hm, nq, nkv], likewise full_kv_* (both NULL = no
 * full blocks); Bm is 1 or B, Hm 1 or H, nq = ceil(len_q / q_block), nkv = ceil(len_kv /
 * kv_block). Only each row's first count entries are read. */
FA_API fajit_status fajit_block_mask_from_kv_blocks(int batch, int heads, int64_t len_q, int64_t len_kv,
                                                    int q_block, int kv_block, const int32_t* kv_num_blocks,
                                                    const int32_t* kv_indices,
                                                    const int32_t* full_kv_num_blocks,
                                                    const int32_t* full_kv_indices, fajit_block_mask** out);
/* The same tables kept on the device (int32, contiguous, device pointers of the current
 * context): the forward and decoding kernels read them in place, so the mask costs no copy and
 * no sync, and a launch with it can be captured in a CUDA graph (a replay reads the tables'
 * values then). What a call needs beyond them (the backward's transposed tables, a tile that
 * splits the blocks) is derived from them on the device at each call, with no sync. The caller
 * keeps them alive while the mask lives and their entries valid: they are checked, from one host
 * copy made after cuCtxSynchronize, only where the host needs them (density, to_string, table
 * getters) and on every launch with FAJIT_CHECK_DEVICE_TABLES=1 (elsewhere bad entries are
 * skipped, never read out of bounds). */
FA_API fajit_status fajit_block_mask_from_device_kv_blocks(
    int batch, int heads, int64_t len_q, int64_t len_kv, int q_block, int kv_block,
    const int32_t* kv_num_blocks, const int32_t* kv_indices, const int32_t* full_kv_num_blocks,
    const int32_t* full_kv_indices, fajit_block_mask** out);
/* Every block full (no mask_mod). */
FA_API fajit_status fajit_block_mask_all_full(int batch, int heads, int64_t len_q, int64_t len_kv,
                                              int q_block, int kv_block, fajit_block_mask** out);
FA_API void fajit_block_mask_destroy(fajit_block_mask* mask);

typedef struct fajit_block_mask_info {
  int batch, heads; /* Bm, Hm: 1 (broadcast) or B, H */
  int64_t len_q, len_kv;
  int q_block, kv_block;
  int num_q_blocks, num_kv_blocks;
} fajit_block_mask_info;
FA_API fajit_status fajit_block_mask_get_info(const fajit_block_mask* mask, fajit_block_mask_info* out);

/* The eight tables (flex_attention's names); num_blocks tables hold Bm*Hm*rows entries, index
 * tables Bm*Hm*rows*cols (rows = num_q_blocks for kv_*, num_kv_blocks for q_*), each row padded
 * with 0 after its count. */
typedef enum fajit_block_table {
  FAJIT_KV_NUM_BLOCKS = 0,
  FAJIT_KV_INDICES = 1,
  FAJIT_FULL_KV_NUM_BLOCKS = 2,
  FAJIT_FULL_KV_INDICES = 3,
  FAJIT_Q_NUM_BLOCKS = 4,
  FAJIT_Q_INDICES = 5,
  FAJIT_FULL_Q_NUM_BLOCKS = 6,
  FAJIT_FULL_Q_INDICES = 7
} fajit_block_table;
/* Copies table `which` into out[0..count): count must be its size (FAJIT_ERROR_INVALID_ARGUMENT
 * naming the size otherwise; out = NULL and count = 0 only ask: *size gets it, may be NULL). */
FA_API fajit_status fajit_block_mask_table(const fajit_block_mask* mask, fajit_block_table which,
                                           int32_t* out, size_t count, size_t* size);
/* Copies all eight tables, back to back in fajit_block_table's order, each of the size
 * fajit_block_mask_table reports (Bm*Hm*rows or Bm*Hm*rows*cols entries), into device memory
 * out[0..count) of the current context, asynchronously on cu_stream: count must be their total.
 * A mask built on the GPU (fajit_block_mask_built_on_device) is copied device to device and a
 * host mask's tables through a pinned staging buffer: neither waits for the stream (a mask over
 * device kv tables, fajit_block_mask_from_device_kv_blocks, is read back once first: a sync). */
FA_API fajit_status fajit_block_mask_copy_tables(const fajit_block_mask* mask, int32_t* out, size_t count,
                                                 void* cu_stream);
/* *out = 1 where the mask was classified on the GPU with its tables built there (what
 * fajit_program_block_mask and fajit_kernel_block_mask return where the GPU evaluates mask_mod):
 * its tables stay on the device, made without a sync and ordered on the stream it was built on,
 * as a stream-ordered allocation is: the captures are read there after the call returns, the
 * tables are ready once that stream has run, and their memory is freed there when the mask is
 * destroyed (order that stream after uses on other streams first; keep it alive meanwhile).
 * Table getters, density and to_string copy its tile kinds to the host once (a sync). Such a
 * mask is not built while its stream captures a CUDA graph. 0 otherwise. */
FA_API fajit_status fajit_block_mask_built_on_device(const fajit_block_mask* mask, int* out);
/* One line per q block of batch b, head h: '#' full, '+' partial, '.' empty (owned by the
 * mask until the next call on it). */
FA_API const char* fajit_block_mask_to_string(fajit_block_mask* mask, int b, int h);
/* Fraction of non-empty blocks, and the counts of full / partial / empty ones (any may be NULL). */
FA_API fajit_status fajit_block_mask_density(const fajit_block_mask* mask, double* fraction, int64_t* full,
                                             int64_t* partial, int64_t* empty);

/* O = attention(Q, K, V); lse may be NULL; scale 0 = 1/sqrt(head_dim_qk). Asynchronous on
 * cu_stream (a CUstream; NULL = the default stream). Outputs (o, lse, max_scores) must not
 * share memory with an input, a captured buffer, a sequence table or each other
 * (FAJIT_ERROR_INVALID_ARGUMENT naming both); the backward's gradients likewise. */
FA_API fajit_status fajit_kernel_forward(const fajit_kernel* kernel, const fajit_tensor* q,
                                         const fajit_tensor* k, const fajit_tensor* v, const fajit_tensor* o,
                                         const fajit_tensor* lse, float scale, const fajit_block_mask* mask,
                                         const fajit_captures* captures, void* cu_stream);

/* The forward's options beyond fajit_kernel_forward's: the kernel path, decoding splits,
 * ragged / paged layouts (fajit/sequences.h describes the shapes) and the rows' maxima. Start
 * from fajit_forward_options_init (below: it records the caller's sizeof in struct_size, which
 * lets this struct grow compatibly). */
typedef enum fajit_forward_path {
  FAJIT_PATH_AUTO = 0,    /* decoding for len_q <= 64 within one block row and <= 128 packed rows per
                            KV head (len_q x the GQA group), else prefill (fa::ForwardPath::kAuto) */
  FAJIT_PATH_PREFILL = 1, /* always the query-block (prefill) kernel */
  FAJIT_PATH_DECODE = 2   /* always the split-KV decoding kernel (error for a longer query) */
} fajit_forward_path;
typedef struct fajit_forward_options {
  size_t struct_size;
  float scale; /* 0 = 1/sqrt(head_dim_qk) */
  fajit_forward_path path;
  int decode_splits; /* 0 = enough CTAs for every SM */
  /* Ragged / paged (all may be NULL): int32 device tables. With cu_seqlens_q, q and o are
   * packed [total_q, Hq, D] and lse is [Hq, total_q]; with cu_seqlens_k, k and v are packed
   * [total_kv, Hkv, D]; with page_table ([B, max_pages], needs seqlens_k [B]), k and v are
   * pools [num_pages, page_size, Hkv, D]. The block mask is for [B or 1, H, max_seqlen_q,
   * max_seqlen_k]. check_tables != 0 copies the tables to the host and checks them first. */
  const fajit_tensor* cu_seqlens_q;
  const fajit_tensor* cu_seqlens_k;
  const fajit_tensor* seqlens_k;
  const fajit_tensor* page_table;
  int max_seqlen_q;
  int max_seqlen_k;
  int check_tables;
  /* Appended later (a caller built against the struct without it passes the smaller
   * struct_size and asks for none): fp32 [B, Hq, Lq] ([Hq, total_q] with cu_seqlens_q), may be
   * NULL: each row's largest score after score_mod and mask_mod, in natural units (-inf for a
   * row with nothing unmasked; fa::ForwardOptions::max_scores). */
  const fajit_tensor* max_scores;
} fajit_forward_options;
/* Sets the defaults in the first `size` bytes of *options (the caller's sizeof; a size this
 * library does not know leaves the struct untouched but for struct_size, which the forward then
 * refuses) and struct_size = size. */
FA_API void fajit_forward_options_init_sized(fajit_forward_options* options, size_t size);
/* The exported symbol sets the struct as it was laid out before max_scores was appended (what
 * binaries built against that header hold); code compiled with this header calls the sized form
 * through the macro, with its own sizeof. */
FA_API void fajit_forward_options_init(fajit_forward_options* options);
#define fajit_forward_options_init(options) fajit_forward_options_init_sized((options), sizeof *(options))

/* fajit_kernel_forward with options (NULL = the defaults). */
FA_API fajit_status fajit_kernel_forward_ex(const fajit_kernel* kernel, const fajit_tensor* q,
                                            const fajit_tensor* k, const fajit_tensor* v,
                                            const fajit_tensor* o, const fajit_tensor* lse,
                                            const fajit_forward_options* options,
                                            const fajit_block_mask* mask, const fajit_captures* captures,
                                            void* cu_stream);

/* dQ, dK, dV of attention(Q, K, V) from the forward's O and LSE (fajit_kernel_forward with an
 * lse output) and dO; dlse (fp32 [B, Hq, Lq], the gradient of a loss that also uses the LSE)
 * may be NULL; scale must be the forward's (0 = 1/sqrt(head_dim_qk)). Gradients have their
 * primal's shape and dtype. The backward kernels are compiled on the first call. Asynchronous
 * on cu_stream; fp32 scratch is allocated and freed in stream order. buffer_grads (may be NULL;
 * only its buffers are read) names fp32 tensors, one per captured f32 buffer whose gradient
 * is wanted, of that buffer's shape: the gradient is added to what they hold. deterministic != 0:
 * bit-identical dQ, dK, dV run to run (dQ's fp32 sums in a fixed order: BackwardOptions::
 * deterministic in fajit/kernel.h). */
FA_API fajit_status fajit_kernel_backward(const fajit_kernel* kernel, const fajit_tensor* q,
                                          const fajit_tensor* k, const fajit_tensor* v, const fajit_tensor* o,
                                          const fajit_tensor* lse, const fajit_tensor* dout,
                                          const fajit_tensor* dq, const fajit_tensor* dk,
                                          const fajit_tensor* dv, const fajit_tensor* dlse, float scale,
                                          const fajit_block_mask* mask, const fajit_captures* captures,
                                          const fajit_captures* buffer_grads, int deterministic,
                                          void* cu_stream);

/* The backward's options beyond fajit_kernel_backward's, with a packed (cu_seqlens) batch: the
 * forward's tables and maxima (fajit_forward_options), dout and dq packed like q [total_q, Hq, D],
 * dk and dv like k [total_kv, Hkv, D], lse and dlse [Hq, total_q]. Rows of dq / dk / dv in no
 * sequence are not written; paged or padded (seqlens_k) keys are refused (inference layouts).
 * Start from fajit_backward_options_init (it sets struct_size). */
typedef struct fajit_backward_options {
  size_t struct_size;
  float scale;              /* the forward's; 0 = 1/sqrt(head_dim_qk) */
  const fajit_tensor* dlse; /* may be NULL */
  int deterministic;        /* != 0: bit-identical dQ, dK, dV run to run */
  const fajit_tensor* cu_seqlens_q;
  const fajit_tensor* cu_seqlens_k;
  int max_seqlen_q;
  int max_seqlen_k;
  int check_tables;
} fajit_backward_options;
FA_API void fajit_backward_options_init(fajit_backward_options* options);

/* fajit_kernel_backward with options (NULL = the defaults). */
FA_API fajit_status fajit_kernel_backward_ex(const fajit_kernel* kernel, const fajit_tensor* q,
                                             const fajit_tensor* k, const fajit_tensor* v,
                                             const fajit_tensor* o, const fajit_tensor* lse,
                                             const fajit_tensor* dout, const fajit_tensor* dq,
                                             const fajit_tensor* dk, const fajit_tensor* dv,
                                             const fajit_backward_options* options,
                                             const fajit_block_mask* mask, const fajit_captures* captures,
                                             const fajit_captures* buffer_grads, void* cu_stream);

#ifdef __cplusplus
}
#endif

#endif /* FAJIT_C_H */
