#!/usr/bin/env bash
# Installs what building fajit needs (Debian 12 + the CUDA 13 toolkit at /usr/local/cuda),
# then configures and builds into ${FAJIT_BUILD_DIR:-build}. Safe to run repeatedly: it
# installs only missing packages and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ python3
          libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools
          libfmt-dev libxxhash-dev libcli11-dev libgtest-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ! -e /usr/local/cuda/include/nvrtc.h ] && [ -z "${CUDAToolkit_ROOT:-}" ]; then
  echo "setup: the CUDA toolkit (12 or 13) is needed at /usr/local/cuda or \$CUDAToolkit_ROOT" >&2
  exit 1
fi

BUILD="${FAJIT_BUILD_DIR:-build}"
# CI (CI=true, as .ci/run sets) builds with warnings as errors, in a fresh or existing build.
WERROR=OFF
if [ "${CI:-}" = true ]; then WERROR=ON; fi
if [ ! -f "$BUILD/build.ninja" ]; then
  # FAJIT_CMAKE_ARGS: more cache settings for a new build tree (scripts/sanitize.sh uses it)
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCUDAToolkit_ROOT="${CUDAToolkit_ROOT:-/usr/local/cuda}" -DFAJIT_WERROR="$WERROR" \
        ${FAJIT_CMAKE_ARGS:-} >/dev/null
elif [ "$WERROR" = ON ]; then
  cmake -S . -B "$BUILD" -DFAJIT_WERROR=ON >/dev/null
fi
cmake --build "$BUILD" -j "${FAJIT_JOBS:-$(nproc)}"
