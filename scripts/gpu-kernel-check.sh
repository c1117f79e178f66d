#!/usr/bin/env bash
# Builds the forward-kernel GPU check (tests/kernel/kernel_check.cpp, CMake target
# fajit_kernel_check) and the NVRTC compile test into .device-build/ for the GPU machine. The
# templates are embedded (fa::jit::Nvrtc), so the binaries read no file; libnvrtc is dlopen()ed
# from /usr/local/cuda/lib64 there, and kernel_check links the Driver API (the stub libcuda
# here, the real driver there).
#   .device-build/kernel_check              all correctness cases + benchmark
#   .device-build/kernel_check --quick      small subset (for compute-sanitizer)
#   .device-build/kernel_check --no-bench | --bench-only
#   .device-build/kernel_check --sm90-only | --sm80-only   one kernel (sm90 = forward_sm90.cuh,
#                                           compute capability 9.0 only; both by default there)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${FAJIT_DEVICE_BUILD_DIR:-.device-build/build}"   # shared with scripts/gpu-test.sh
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD" -j "${FAJIT_JOBS:-$(nproc)}" fajit_kernel_check fajit_kernel_compile_test
cp -f "$BUILD/tests/kernel/fajit_kernel_check" .device-build/kernel_check
cp -f "$BUILD/tests/kernel/fajit_kernel_compile_test" .device-build/nvrtc_compile_test
echo "built .device-build/kernel_check and .device-build/nvrtc_compile_test"
