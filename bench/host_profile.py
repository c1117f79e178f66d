#!/usr/bin/env python3
"""Where fajit.torch's host time goes: forward+backward on a tiny causal problem, back to back.

    FAJIT_LIBRARY=build/libfajit.so PYTHONPATH=python python3 bench/host_profile.py [--iters 300]

Prints (1) the per-call wall time of fajit.torch and of torch.compile(flex_attention), as
bench/python_overhead.py measures it (GPU work tiny, no synchronization inside the loop);
(2) the time spent inside each C API function fajit.torch calls (the library's own host time:
validation, kernel lookup, launches), per call; (3) a cProfile of the Python side sorted by own
time, so the custom-op dispatch, autograd and fajit.torch's own code can be told apart.
Needs torch with CUDA.
"""
import argparse
import cProfile
import pstats
import time
from collections import defaultdict

import torch
from torch.nn.attention.flex_attention import create_block_mask as torch_cbm
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import fajit._capi as capi
import fajit.torch as ft
from python_overhead import causal, timed  # bench/: the same mask and timing loop


def per_call_us(fn, iters):
    return timed(fn, iters) * 1e6


def time_c_api(names):
    """Wraps the C API functions `names` on the loaded library with timers; returns the totals."""
    lib = capi.lib()
    totals = defaultdict(lambda: [0, 0.0])
    for name in names:
        fn = getattr(lib, name)

        def wrapped(*args, _fn=fn, _name=name):
            t0 = time.perf_counter()
            try:
                return _fn(*args)
            finally:
                e = totals[_name]
                e[0] += 1
                e[1] += time.perf_counter() - t0

        setattr(lib, name, wrapped)
    return totals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_profile.py needs a CUDA GPU")
    B, H, L, D = 1, 1, 128, 64
    q, k, v = [torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    fm = ft.create_block_mask(causal, None, None, L, L)
    tm = torch_cbm(causal, None, None, L, L)
    tflex = torch.compile(torch_flex)
    step = {"fajit.torch": lambda: ft.flex_attention(q, k, v, block_mask=fm).sum().backward(),
            "torch.compile(flex)": lambda: tflex(q, k, v, block_mask=tm).sum().backward()}
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; B={B} H={H} L={L} D={D} bf16 causal")
    for name, f in step.items():
        print(f"forward+backward, {name}: {per_call_us(f, a.iters):.1f} us/call")
    with torch.no_grad():
        print(f"forward only, fajit.torch: {per_call_us(lambda: ft.flex_attention(q, k, v, block_mask=fm), a.iters):.1f} us/call")

    totals = time_c_api(["fajit_kernel_forward", "fajit_kernel_backward"])
    per_call_us(step["fajit.torch"], a.iters)
    print("inside the C API, per call:")
    for name, (n, s) in sorted(totals.items()):
        print(f"  {name}: {n} calls, {s / max(n, 1) * 1e6:.1f} us each")

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.iters):
        step["fajit.torch"]()
    torch.cuda.synchronize()
    prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
