/* libfajit.so from plain C, in a process that already holds another LLVM: the C header must
 * be valid C, the library must not clash with the host's LLVM, and NVRTC must be found at run
 * time (no GPU needed: compiling works without one). */
#include <dlfcn.h>
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
  return 0;
}
