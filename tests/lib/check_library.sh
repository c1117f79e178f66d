#!/usr/bin/env bash
# libfajit.so is self-contained: no LLVM/MLIR/fmt/CUDA shared library at load time, and
# only fajit's public API exported: exactly the symbols listed in exported_symbols.txt
# (demangled, sorted), i.e. what the public headers declare FA_API plus the C API.
#   check_library.sh libfajit.so tests/lib/exported_symbols.txt
set -euo pipefail
lib="$1"
pinned="$2"
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
if ! diff -u "$pinned" <(echo "$exports" | LC_ALL=C sort) >&2; then
  echo "FAIL: the exported symbols differ from $pinned (- pinned, + exported); update it only" \
       "when the public API changes on purpose" >&2
  exit 1
fi
echo "OK: $(echo "$exports" | wc -l) exported symbols, all fa:: or fajit_*, as pinned"
