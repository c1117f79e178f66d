#!/usr/bin/env bash
# libfajit.so is self-contained: no LLVM/MLIR/fmt/CUDA shared library at load time, and
# only fajit's API (fa::, fajit_*) exported.
set -euo pipefail
lib="$1"
deps=$(ldd "$lib")
echo "$deps"
if echo "$deps" | grep -Eq 'libLLVM|libMLIR|libfmt|libcuda|libnvrtc|libxxhash'; then
  echo "FAIL: $lib links a forbidden shared library" >&2
  exit 1
fi
exports=$(nm -D --defined-only "$lib" | awk '{print $3}' | c++filt)
bad=$(echo "$exports" | grep -Ev '^(fa::|fajit_|typeinfo for fa::|typeinfo name for fa::|vtable for fa::)' || true)
if [ -n "$bad" ]; then
  echo "FAIL: symbols outside fajit's API are exported:" >&2
  echo "$bad" | head -20 >&2
  exit 1
fi
if echo "$exports" | grep -Eq 'mlir::|llvm::'; then
  echo "FAIL: an exported symbol mentions mlir:: or llvm::" >&2
  echo "$exports" | grep -E 'mlir::|llvm::' >&2
  exit 1
fi
echo "OK: $(echo "$exports" | wc -l) exported symbols, all fa:: or fajit_*"
