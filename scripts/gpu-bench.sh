#!/usr/bin/env bash
# Builds libfajit.so for the forward benchmark (bench/flex_compare.py) into the git-ignored
# .device-build/ (build tree in .device-build/build, shared with scripts/gpu-test.sh; the
# library alone in .device-build/lib, ~5 MiB stripped), then prints the `run` call that
# benchmarks it on the GPU machine. Only .device-build/lib needs to travel: carry
# ".device-build/lib" (carrying all of ".device-build" also works while it stays < 64 MiB).
#
# libfajit.so links MLIR/LLVM statically and dlopens libcuda and NVRTC (it also looks in
# /usr/local/cuda/lib64, where libnvrtc.so.13 lives on the GPU machine), so it needs no
# other files there; templates are embedded.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=.device-build/build
LIB=.device-build/lib
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$BUILD" fajit
rm -rf "$LIB"
mkdir -p "$LIB"
cp -a "$BUILD"/libfajit.so* "$LIB"/
strip --strip-unneeded "$LIB"/libfajit.so.*.*.* 2>/dev/null || true
du -sh "$LIB"
ldd "$LIB"/libfajit.so | sed 's/^/  ldd: /'
cat <<'MSG'

Run on the GPU machine (tool `run`, kind nvidia-h200, carry [".device-build/lib"]):
  set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/flex_compare.py --lib .device-build/lib/libfajit.so 2>&1 | tee $OUT/bench.log
Options: --quick (two cases), --cases full,causal,... --dims 64,128 --no-long --warmup MS --rep MS
MSG
