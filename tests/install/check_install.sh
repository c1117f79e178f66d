#!/usr/bin/env bash
# Installs the build into a fresh prefix, then builds and runs two consumers out of tree: C++
# through find_package(fajit) / fajit::fajit, C through pkg-config. Checks the installed
# layout (headers, versioned libfajit.so with its SONAME, the CLI, no internal headers).
#   check_install.sh BUILD_DIR CONSUMER_SRC WORK_DIR
set -euo pipefail
build="$1"
src="$2"
work="$3"
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null

libdir=$(dirname "$(find "$prefix" -name 'libfajit.so.*.*.*' | head -1)")
for f in include/fajit/kernel.h include/fajit/mods.h include/fajit/fajit_c.h include/fajit/params.h \
         bin/fajit; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f is not installed" >&2; exit 1; }
done
if [ -e "$prefix/include/fajit/detail" ] || [ -e "$prefix/include/fajit/jit" ]; then
  echo "FAIL: internal headers are installed" >&2
  exit 1
fi
soname=$(objdump -p "$libdir"/libfajit.so.*.*.* | awk '/SONAME/ {print $2}')
[ "$soname" = libfajit.so.0 ] || { echo "FAIL: SONAME is '$soname', expected libfajit.so.0" >&2; exit 1; }
[ -L "$libdir/libfajit.so" ] && [ -L "$libdir/libfajit.so.0" ] || { echo "FAIL: no libfajit.so symlinks" >&2; exit 1; }
"$prefix/bin/fajit" dump --mlir --mask causal | grep -q "fa.mask_mod @causal"

# C++: find_package(fajit) -> fajit::fajit
cmake -S "$src" -B "$work/cxx" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cxx" >/dev/null
"$work/cxx/fajit_consumer" | tee "$work/cxx.out"
grep -q "math.exp2" "$work/cxx.out"

# C: pkg-config
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -Wall -Werror $(pkg-config --cflags fajit) "$src/consumer.c" -o "$work/c_consumer" \
   $(pkg-config --libs fajit) -Wl,-rpath,"$libdir"
"$work/c_consumer" | tee "$work/c.out"
grep -q "fa.mask_mod @causal" "$work/c.out"
echo "OK: installed to $prefix; C++ (find_package) and C (pkg-config) consumers built and ran"
