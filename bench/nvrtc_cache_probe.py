"""Does NVRTC's own cubin cache (the driver's compute cache, NVRTC 12.9+) tell apart two programs
whose source text is the same but whose in-memory headers differ? fajit passes its templates to
NVRTC as in-memory headers, so a cache keyed on the source and options alone would hand a new
library the cubin an older library compiled from the same generated source.

    python3 bench/nvrtc_cache_probe.py [--lib /usr/local/cuda/lib64/libnvrtc.so.13]

Each compile runs in a fresh process: the same source with a header defining VALUE 1, then 2,
then 1 again; the kernel stores VALUE, so the cubins must differ between 1 and 2. Prints, per
compile, its wall time and whether its cubin equals the first's.
"""
import argparse
import ctypes
import hashlib
import subprocess
import sys
import time

SRC = b'#include "probe.h"\nextern "C" __global__ void k(int* p) { *p = VALUE * 7919 + 13; }\n'


def compile_once(lib_path, value, arch):
    nv = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    header = f"#define VALUE {value}\n".encode()
    headers = (ctypes.c_char_p * 1)(header)
    names = (ctypes.c_char_p * 1)(b"probe.h")
    t0 = time.perf_counter()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), SRC, b"probe.cu", 1, headers, names) == 0
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    rc = nv.nvrtcCompileProgram(prog, 1, opts)
    n = ctypes.c_size_t()
    assert rc == 0 and nv.nvrtcGetCUBINSize(prog, ctypes.byref(n)) == 0
    buf = ctypes.create_string_buffer(n.value)
    assert nv.nvrtcGetCUBIN(prog, buf) == 0
    dt = time.perf_counter() - t0
    return hashlib.sha256(buf.raw).hexdigest()[:16], dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="/usr/local/cuda/lib64/libnvrtc.so.13")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--child", type=int, default=None)
    args = ap.parse_args()
    if args.child is not None:
        h, dt = compile_once(args.lib, args.child, args.arch)
        print(h, f"{dt * 1e3:.1f}")
        return
    first = None
    for value in (1, 2, 1, 2):
        out = subprocess.run([sys.executable, __file__, "--lib", args.lib, "--arch", args.arch, "--child",
                              str(value)], capture_output=True, text=True, check=True).stdout.split()
        first = first or {}
        first.setdefault(value, out[0])
        print(f"VALUE {value}: cubin {out[0]} ({out[1]} ms)")
    verdict = "DIFFER (headers are part of the key)" if first[1] != first[2] else \
        "SAME: the cache ignores header contents"
    print("cubins of VALUE 1 and VALUE 2:", verdict)


if __name__ == "__main__":
    main()
