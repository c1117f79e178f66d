#!/usr/bin/env bash
# Runs every test: builds (scripts/setup.sh), then ctest — gtest suites, the lit/FileCheck
# suite, NVRTC compiles of every kernel variant, the install/consumer check and the Python
# package's pytest suite. GPU (and torch) tests skip with a reason when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${FAJIT_BUILD_DIR:-build}"
# The Python package's tests (ctest python.pytest) need pytest in the Python CMake found.
PY=$(sed -n 's/^_Python3_EXECUTABLE:INTERNAL=//p' "$BUILD/CMakeCache.txt")
"${PY:-python3}" -m pytest --version >/dev/null 2>&1 || "${PY:-python3}" -m pip install -q pytest
ctest --test-dir "$BUILD" --output-on-failure -j "${FAJIT_JOBS:-$(nproc)}" "$@"
