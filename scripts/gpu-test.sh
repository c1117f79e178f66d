#!/usr/bin/env bash
# Builds fajit_gpu_tests (and fajit_cli) for the GPU machine into the git-ignored .device-build/,
# then prints the `run` command that executes them there. Only the two targets are built.
#   scripts/gpu-test.sh            configure + build + copy to .device-build/bin/
# On the GPU machine (repository root, `carry: [".device-build/bin"]`):
#   .device-build/bin/fajit_gpu_tests                        the whole suite (< 2 min on an H100)
#   .device-build/bin/fajit_gpu_tests --gtest_filter=...      a subset (e.g. under compute-sanitizer)
# The binaries link MLIR/LLVM statically; libcuda is dlopen()ed and libnvrtc.so.13 is found
# through the RPATH /usr/local/cuda/lib64.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${FAJIT_DEVICE_BUILD_DIR:-.device-build/build}"   # an existing build dir may be reused
JOBS="${FAJIT_JOBS:-$(nproc)}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD" -j "$JOBS" fajit_gpu_tests fajit_cli
mkdir -p .device-build/bin
cp -f "$BUILD/tests/gpu/fajit_gpu_tests" .device-build/bin/
# fajit_cli's output name is `fajit`.
cp -f "$BUILD/tools/fajit/$(cd "$BUILD/tools/fajit" && ls fajit fajit_cli 2>/dev/null | head -1)" .device-build/bin/fajit
# Only bin/ needs to travel: keep the carried tree small (the 64 MiB limit counts it).
du -sh .device-build/bin
SMALL='Cases/ForwardTest.MatchesReference/*_17x*:Cases/ForwardTest.MatchesReference/relative_bias_f16_d64x64_b2h4g1_1000x1000:Cases/BlockMaskTest.MatchesBruteForce/document2d_causal_b4h1_17x1000_p5:ForwardValidation.*'
RACE='Cases/ForwardTest.MatchesReference/sliding_bf16_d64x128_b1h4g1_17x17:Cases/ForwardTest.MatchesReference/none_f16_d64x64_b1h8g8_17x17'
cat <<MSG
built .device-build/bin/fajit_gpu_tests and .device-build/bin/fajit (fajit_cli)
run on the GPU machine with the run tool (default kind), carry [".device-build/bin"] (bin/ is all
it needs; the build tree would overflow the 64 MiB limit):
  set -o pipefail; B=.device-build/bin/fajit_gpu_tests; nvidia-smi -L;
  \$B 2>&1 | tee \$OUT/gpu.log;
  compute-sanitizer --tool memcheck --error-exitcode 9 \$B --gtest_filter='$SMALL' 2>&1 | tee \$OUT/memcheck.log;
  compute-sanitizer --tool racecheck --error-exitcode 9 \$B --gtest_filter='$RACE' 2>&1 | tee \$OUT/racecheck.log
MSG
