/* libfajit.so from plain C, in a process that already holds another LLVM: the C header must
 * be valid C, the library must not clash with the host's LLVM, and NVRTC must be found at run
 * time (no GPU needed: compiling works without one). */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "fajit/fajit_c.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    void* llvm = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!llvm) {
      fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
      return 1;
    }
  }
  fajit_kernel* k = NULL;
  fajit_options o = fajit_default_options();
  o.arch = "sm_90a";
  if (fajit_compile_preset("causal", "alibi", &o, &k) != FAJIT_OK) {
    fprintf(stderr, "compile failed: %s\n", fajit_last_error());
    return 1;
  }
  size_t size = 0;
  const void* cubin = fajit_kernel_cubin(k, &size);
  if (!cubin || size < 4 ||
      memcmp(cubin,
             "\x7f"
             "ELF",
             4) != 0) {
    fprintf(stderr, "no cubin\n");
    return 1;
  }
  printf("compiled %s: %zu-byte cubin (%s)\n", fajit_kernel_cache_key(k), size, fajit_kernel_origin(k));

  /* fajit_kernel_warm: the lazily compiled kernels now (forward + block-mask builder, its
   * classifier and its table kernels + decode). */
  {
    int n = 0;
    if (fajit_kernel_warm(k, FAJIT_WARM_BLOCK_MASK | FAJIT_WARM_DECODE, &n) != FAJIT_OK || n != 4) {
      fprintf(stderr, "fajit_kernel_warm: %d kernels, %s\n", n, fajit_last_error());
      return 1;
    }
    if (fajit_kernel_warm(k, 1u << 9, NULL) != FAJIT_ERROR_INVALID_ARGUMENT ||
        strcmp(fajit_last_error(), "flags: unknown bits 0x200 (known: fajit_warm_flag, 0xff)") != 0) {
      fprintf(stderr, "expected the unknown-flags error, got: %s\n", fajit_last_error());
      return 1;
    }
    printf("warmed %d kernels\n", n);
  }

  /* fajit_compile_program_background: the backward compiles beside the forward (the first
   * backward, here a warm, finds it ready); a bit other than FAJIT_WARM_BACKWARD is refused. */
  {
    fajit_program* p = NULL;
    fajit_kernel* kb = NULL;
    int n = 0;
    if (fajit_program_preset("sliding:100", "softcap:20", &p) != FAJIT_OK ||
        fajit_compile_program_background(p, &o, FAJIT_WARM_BACKWARD, &kb) != FAJIT_OK ||
        fajit_kernel_warm(kb, FAJIT_WARM_BACKWARD, &n) != FAJIT_OK || n != 2) {
      fprintf(stderr, "fajit_compile_program_background: %d kernels, %s\n", n, fajit_last_error());
      return 1;
    }
    fajit_kernel_destroy(kb);
    kb = NULL;
    if (fajit_compile_program_background(p, &o, FAJIT_WARM_DECODE, &kb) != FAJIT_ERROR_INVALID_ARGUMENT ||
        kb ||
        strcmp(fajit_last_error(),
               "background: flags 0x8 name kernels that do not compile in the background (only "
               "FAJIT_WARM_BACKWARD does)") != 0) {
      fprintf(stderr, "expected the background-flags error, got: %s\n", fajit_last_error());
      return 1;
    }
    fajit_program_destroy(p);
    printf("compiled with the backward in the background\n");
  }

  /* fajit_kernel_forward_ex: ragged / paged tables and the options struct are checked before
   * anything runs (fake, aligned device addresses: nothing is launched, no GPU needed). */
  {
    fajit_block_mask* m = NULL;
    if (fajit_block_mask_all_full(1, 1, 128, 256, 128, 128, &m) != FAJIT_OK) {
      fprintf(stderr, "all_full mask: %s\n", fajit_last_error());
      return 1;
    }
    fajit_tensor q = {(void*)0x100000, FAJIT_BF16, 3, {300, 2, 128, 0}, {256, 128, 1, 0}};
    fajit_tensor pool = {(void*)0x200000, FAJIT_BF16, 4, {8, 64, 2, 128}, {16384, 256, 128, 1}};
    fajit_tensor cu_q = {(void*)0x300000, FAJIT_I32, 1, {3, 0, 0, 0}, {1, 0, 0, 0}};
    fajit_tensor table = {(void*)0x400000, FAJIT_I32, 2, {2, 4, 0, 0}, {4, 1, 0, 0}};
    fajit_forward_options fo;
    fajit_forward_options_init(&fo);
    fo.cu_seqlens_q = &cu_q;
    fo.max_seqlen_q = 128;
    fo.page_table = &table;
    fo.max_seqlen_k = 256;
    if (fajit_kernel_forward_ex(k, &q, &pool, &pool, &q, NULL, &fo, m, NULL, NULL) !=
            FAJIT_ERROR_INVALID_ARGUMENT ||
        strcmp(fajit_last_error(), "page_table needs seqlens_k (each sequence's key count)") != 0) {
      fprintf(stderr, "expected the seqlens_k error from fajit_kernel_forward_ex, got: %s\n",
              fajit_last_error());
      return 1;
    }
    /* A binary built against the header before max_scores was appended holds only the bytes
     * before it and calls the exported fajit_forward_options_init (parenthesized here: not this
     * header's macro): the library must write none past them, and take that size. */
    {
      union {
        fajit_forward_options o;
        unsigned char bytes[sizeof(fajit_forward_options)];
      } old;
      const size_t v1 = offsetof(fajit_forward_options, max_scores);
      memset(&old, 0xAB, sizeof old);
      (fajit_forward_options_init)(&old.o);
      for (size_t i = v1; i < sizeof old; ++i)
        if (old.bytes[i] != 0xAB) {
          fprintf(stderr, "fajit_forward_options_init wrote byte %zu past the old layout's %zu\n", i, v1);
          return 1;
        }
      if (old.o.struct_size != v1 || old.o.path != FAJIT_PATH_AUTO || old.o.cu_seqlens_k != NULL) {
        fprintf(stderr, "fajit_forward_options_init: struct_size %zu (want %zu) or defaults wrong\n",
                old.o.struct_size, v1);
        return 1;
      }
      old.o.cu_seqlens_q = &cu_q;
      old.o.max_seqlen_q = 128;
      old.o.page_table = &table;
      old.o.max_seqlen_k = 256;
      if (fajit_kernel_forward_ex(k, &q, &pool, &pool, &q, NULL, &old.o, m, NULL, NULL) !=
              FAJIT_ERROR_INVALID_ARGUMENT ||
          strcmp(fajit_last_error(), "page_table needs seqlens_k (each sequence's key count)") != 0) {
        fprintf(stderr, "expected the older struct_size to be taken, got: %s\n", fajit_last_error());
        return 1;
      }
    }
    if (fo.struct_size != sizeof fo) {
      fprintf(stderr, "fajit_forward_options_init (the header's) set struct_size %zu, not %zu\n",
              fo.struct_size, sizeof fo);
      return 1;
    }
    fo.struct_size = 8;
    if (fajit_kernel_forward_ex(k, &q, &pool, &pool, &q, NULL, &fo, m, NULL, NULL) !=
            FAJIT_ERROR_INVALID_ARGUMENT ||
        strstr(fajit_last_error(), "options: struct_size 8 is not a fajit_forward_options size") == NULL) {
      fprintf(stderr, "expected the struct_size error, got: %s\n", fajit_last_error());
      return 1;
    }
    printf("forward_ex errors: %s\n", fajit_last_error());
    fajit_block_mask_destroy(m);
  }
  fajit_kernel_destroy(k);

  /* Errors come back as codes plus a message naming the problem. */
  if (fajit_compile_preset("casual", NULL, &o, &k) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strstr(fajit_last_error(), "unknown mask preset 'casual'") == NULL) {
    fprintf(stderr, "expected an unknown-preset error, got: %s\n", fajit_last_error());
    return 1;
  }
  if (fajit_compile_mlir("fa.mask_mod @m(", NULL, &k) != FAJIT_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "expected a parse error\n");
    return 1;
  }
  printf("errors: %s\n", fajit_last_error());
  /* The backward is in the C API too; its arguments are checked before anything runs. */
  if (fajit_kernel_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0.0f, NULL,
                            NULL, NULL, 0, NULL) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "kernel is NULL") != 0) {
    fprintf(stderr, "expected 'kernel is NULL' from fajit_kernel_backward, got: %s\n", fajit_last_error());
    return 1;
  }
  /* Programs and block masks without a kernel: a causal mask over 300 x 300 in 128-blocks is
   * decided by the symbolic analysis (no GPU), and its tables round-trip through from_kv_blocks. */
  fajit_program* p = NULL;
  if (fajit_program_parse("fa.mask_mod @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                          "  %0 = arith.cmpi sge, %q, %kv : i32\n  fa.yield %0 : i1\n}\n",
                          &p) != FAJIT_OK) {
    fprintf(stderr, "parse failed: %s\n", fajit_last_error());
    return 1;
  }
  if (!strstr(fajit_program_mlir(p), "fa.score_mod @identity") || fajit_program_num_captures(p) != 0) {
    fprintf(stderr, "unexpected program:\n%s\n", fajit_program_mlir(p));
    return 1;
  }
  fajit_block_mask* m = NULL;
  if (fajit_program_block_mask(p, 2, 4, 300, 300, 0, 0, NULL, &o, NULL, &m) != FAJIT_OK) {
    fprintf(stderr, "block mask failed: %s\n", fajit_last_error());
    return 1;
  }
  fajit_block_mask_info info;
  int32_t num[3], idx[9], fnum[3], fidx[9];
  size = 0;
  if (fajit_block_mask_get_info(m, &info) != FAJIT_OK || info.batch != 1 || info.heads != 1 ||
      info.num_q_blocks != 3 || info.num_kv_blocks != 3 ||
      fajit_block_mask_table(m, FAJIT_KV_INDICES, NULL, 0, &size) != FAJIT_OK || size != 9 ||
      fajit_block_mask_table(m, FAJIT_KV_NUM_BLOCKS, num, 3, NULL) != FAJIT_OK ||
      fajit_block_mask_table(m, FAJIT_KV_INDICES, idx, 9, NULL) != FAJIT_OK ||
      fajit_block_mask_table(m, FAJIT_FULL_KV_NUM_BLOCKS, fnum, 3, NULL) != FAJIT_OK ||
      fajit_block_mask_table(m, FAJIT_FULL_KV_INDICES, fidx, 9, NULL) != FAJIT_OK) {
    fprintf(stderr, "block mask tables: %s\n", fajit_last_error());
    return 1;
  }
  /* Causal: the diagonal blocks are partial, the ones below full. */
  if (num[0] != 1 || num[1] != 1 || num[2] != 1 || idx[3] != 1 || idx[6] != 2 || fnum[0] != 0 ||
      fnum[1] != 1 || fnum[2] != 2 || fidx[6] != 0 || fidx[7] != 1) {
    fprintf(stderr, "unexpected causal tables:\n%s\n", fajit_block_mask_to_string(m, 0, 0));
    return 1;
  }
  if (fajit_block_mask_table(m, FAJIT_KV_INDICES, idx, 8, NULL) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "count: the table holds 9 entries, got 8") != 0) {
    fprintf(stderr, "expected a count error, got: %s\n", fajit_last_error());
    return 1;
  }
  /* Decided on the host (causal): not built on the device; the eight tables hold 3+9+3+9 entries
   * each way, and a copy of another count is refused before anything is copied. */
  int on_device = -1;
  if (fajit_block_mask_built_on_device(m, &on_device) != FAJIT_OK || on_device != 0 ||
      fajit_block_mask_table(m, FAJIT_FULL_Q_INDICES, NULL, 0, &size) != FAJIT_OK || size != 9 ||
      fajit_block_mask_copy_tables(m, idx, 47, NULL) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "count: the eight tables hold 48 entries, got 47") != 0 ||
      fajit_block_mask_copy_tables(m, NULL, 48, NULL) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "out is NULL") != 0) {
    fprintf(stderr, "built_on_device / copy_tables: %d, %s\n", on_device, fajit_last_error());
    return 1;
  }
  fajit_block_mask* m2 = NULL;
  if (fajit_block_mask_from_kv_blocks(1, 1, 300, 300, 128, 128, num, idx, fnum, fidx, &m2) != FAJIT_OK ||
      strcmp(fajit_block_mask_to_string(m2, 0, 0), fajit_block_mask_to_string(m, 0, 0)) != 0) {
    fprintf(stderr, "from_kv_blocks differs: %s\n", fajit_last_error());
    return 1;
  }
  /* tables kept on the device: their pointers are required (entries are checked where the host
   * needs them, on a GPU) */
  fajit_block_mask* m3 = NULL;
  if (fajit_block_mask_from_device_kv_blocks(1, 1, 300, 300, 128, 128, NULL, NULL, NULL, NULL, &m3) !=
          FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "kv_num_blocks is NULL") != 0 || m3 != NULL) {
    fprintf(stderr, "expected a NULL-table error, got: %s\n", fajit_last_error());
    return 1;
  }
  printf("causal block mask:\n%s\n", fajit_block_mask_to_string(m2, 0, 0));
  fajit_block_mask_destroy(m2);
  fajit_block_mask_destroy(m);
  fajit_program_destroy(p);

  /* A program's masks, call after call (its builder is made once per options): each call takes
   * its own captures and sizes, another dtype gets its own builder, bad options still fail. */
  if (fajit_program_parse("fa.mask_mod @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {\n"
                          "  %w = fa.scalar \"window\" : i32\n  %c = arith.cmpi sge, %q, %kv : i32\n"
                          "  %d = arith.subi %q, %kv : i32\n  %in = arith.cmpi sle, %d, %w : i32\n"
                          "  %r = arith.andi %c, %in : i1\n  fa.yield %r : i1\n}\n",
                          &p) != FAJIT_OK) {
    fprintf(stderr, "parse failed: %s\n", fajit_last_error());
    return 1;
  }
  const int windows[] = {100, 1000, 100, 300};
  const int32_t want_row3[] = {2, 1, 2, 3}; /* row 3 (rows 384..511): partial blocks */
  const int32_t want_full3[] = {0, 3, 0, 1};
  for (int call = 0; call < 4; ++call) {
    fajit_scalar_capture window = {"window", 0, 0.0f, windows[call]};
    fajit_captures caps = {NULL, 0, &window, 1};
    fajit_options oc = fajit_default_options();
    oc.dtype = call == 3 ? FAJIT_F16 : FAJIT_BF16;
    int32_t n[8], fn[8];
    if (fajit_program_block_mask(p, 1, 1, 1000, 1000, 0, 0, &caps, &oc, NULL, &m) != FAJIT_OK ||
        fajit_block_mask_table(m, FAJIT_KV_NUM_BLOCKS, n, 8, NULL) != FAJIT_OK ||
        fajit_block_mask_table(m, FAJIT_FULL_KV_NUM_BLOCKS, fn, 8, NULL) != FAJIT_OK) {
      fprintf(stderr, "sliding mask, call %d: %s\n", call, fajit_last_error());
      return 1;
    }
    if (n[3] != want_row3[call] || fn[3] != want_full3[call]) {
      fprintf(stderr, "sliding mask, window %d: row 3 has %d partial, %d full blocks:\n%s\n", windows[call],
              n[3], fn[3], fajit_block_mask_to_string(m, 0, 0));
      return 1;
    }
    fajit_block_mask_destroy(m);
  }
  /* a capture count without its array is refused, not read */
  fajit_captures no_array = {NULL, 3, NULL, 0};
  if (fajit_program_block_mask(p, 1, 1, 300, 300, 0, 0, &no_array, NULL, NULL, &m) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strcmp(fajit_last_error(), "captures: buffers is NULL with num_buffers = 3") != 0) {
    fprintf(stderr, "expected a NULL-array error, got: %s\n", fajit_last_error());
    return 1;
  }
  fajit_options bad = fajit_default_options();
  bad.head_dim_qk = 100;
  if (fajit_program_block_mask(p, 1, 1, 1000, 1000, 0, 0, NULL, &bad, NULL, &m) != FAJIT_ERROR_INVALID_ARGUMENT ||
      strstr(fajit_last_error(), "head_dim_qk must be a multiple of 8") == NULL) {
    fprintf(stderr, "expected a head-dim error, got: %s\n", fajit_last_error());
    return 1;
  }
  fajit_program_destroy(p);
  return 0;
}
