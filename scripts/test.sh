#!/usr/bin/env bash
# Runs every test: builds (scripts/setup.sh), then ctest — gtest suites, the lit/FileCheck
# suite, NVRTC compiles of every kernel variant. GPU tests skip with a reason when no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${FAJIT_BUILD_DIR:-build}"
ctest --test-dir "$BUILD" --output-on-failure -j "${FAJIT_JOBS:-$(nproc)}" "$@"
