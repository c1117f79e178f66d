#!/usr/bin/env bash
# Host-side sanitizers (issue "fuzzer and fault tests"): builds fajit and its host tests with
# AddressSanitizer + UndefinedBehaviorSanitizer in build-sanitize/ (FAJIT_SANITIZE, fajit's own
# code instrumented, MLIR/LLVM prebuilt) and runs every host test there: unit, JIT/cache fault,
# runtime, fuzz CPU mode and lit (GPU tests skip without a device; the Python suite is left to
# scripts/test.sh, its ctypes library would need the ASan runtime preloaded; lib.self_contained
# checks the release library's exports and links, which an instrumented one cannot pass).
#   scripts/sanitize.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${FAJIT_SANITIZE_BUILD_DIR:-build-sanitize}"
# setup.sh installs what is missing, configures a new tree with these settings, builds
FAJIT_BUILD_DIR="$BUILD" FAJIT_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFAJIT_SANITIZE=address,undefined" \
  scripts/setup.sh
# leak checking stays on; LLVM's and NVRTC's process-lifetime singletons are not fajit's leaks.
# allow_user_poisoning=0: LLVM's header-inline allocators poison memory in our instrumented code
# that the prebuilt (uninstrumented) MLIR libraries then use: manual poisoning is ignored, ASan's
# own (heap, stack, globals of fajit's code) stays.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allow_user_poisoning=0}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/scripts/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$BUILD" --output-on-failure -j "${FAJIT_JOBS:-$(nproc)}" -E "python|install|lib.self_contained" "$@"
