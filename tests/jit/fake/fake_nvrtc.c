/* A stand-in libnvrtc for the loader's fault tests (tests/jit/nvrtc_test.cpp): it reports the
 * version FAKE_MAJOR.FAKE_MINOR and, unless FAKE_PARTIAL is defined, exports every entry point
 * fajit resolves (each fails: nothing is ever compiled with it). With FAKE_PARTIAL only
 * nvrtcVersion and nvrtcGetErrorString exist. */
#include <stddef.h>

int nvrtcVersion(int* major, int* minor) {
  *major = FAKE_MAJOR;
  *minor = FAKE_MINOR;
  return 0;
}
const char* nvrtcGetErrorString(int r) {
  (void)r;
  return "fake";
}
#ifndef FAKE_PARTIAL
int nvrtcCreateProgram(void** p, const char* s, const char* n, int k, const char* const* h,
                       const char* const* i) {
  (void)p, (void)s, (void)n, (void)k, (void)h, (void)i;
  return 1;
}
int nvrtcDestroyProgram(void** p) {
  (void)p;
  return 0;
}
int nvrtcCompileProgram(void* p, int n, const char* const* o) {
  (void)p, (void)n, (void)o;
  return 1;
}
/* nvrtcGet<What>Size and nvrtcGet<What>, both failing. */
#define FAKE_GETTERS(What)                       \
  int nvrtcGet##What##Size(void* p, size_t* n) { \
    (void)p, *n = 0;                             \
    return 1;                                    \
  }                                              \
  int nvrtcGet##What(void* p, char* s) {         \
    (void)p, (void)s;                            \
    return 1;                                    \
  }
FAKE_GETTERS(PTX)
FAKE_GETTERS(CUBIN)
FAKE_GETTERS(ProgramLog)
#endif
