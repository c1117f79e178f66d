#!/usr/bin/env bash
# Builds the forward-kernel GPU check (tests/kernel/kernel_check.cpp) into .device-build/ for
# the GPU machine: NVRTC + Driver API (stub libcuda here, the real driver there), RPATH to
# /usr/local/cuda/lib64 because libnvrtc.so.13 is not on the default loader path there.
# Run it there from the repository root (it reads templates/ at run time):
#   .device-build/kernel_check              all correctness cases + benchmark
#   .device-build/kernel_check --quick      small subset (for compute-sanitizer)
#   .device-build/kernel_check --no-bench | --bench-only
#   .device-build/kernel_check --sm90-only | --sm80-only   one kernel (sm90 = forward_sm90.cuh,
#                                           compute capability 9.0 only; both by default there)
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=${CUDA_HOME:-/usr/local/cuda}
mkdir -p .device-build
g++ -O2 -std=c++17 -Wall -Wno-unused-result -pthread \
  -I"$CUDA/include" -Itemplates -Itests/kernel -Iruntime/include -Icompiler/include \
  tests/kernel/kernel_check.cpp -o .device-build/kernel_check \
  -L"$CUDA/lib64/stubs" -lcuda -L"$CUDA/lib64" -lnvrtc -Wl,-rpath,"$CUDA/lib64"
g++ -O2 -std=c++17 -Wall -I"$CUDA/include" -Itests/kernel \
  tests/kernel/nvrtc_compile_test.cpp -o .device-build/nvrtc_compile_test \
  -L"$CUDA/lib64" -lnvrtc -Wl,-rpath,"$CUDA/lib64"
echo "built .device-build/kernel_check and .device-build/nvrtc_compile_test"
