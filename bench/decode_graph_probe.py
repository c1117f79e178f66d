#!/usr/bin/env python3
"""Decoding eager vs CUDA-graph replay, back to back (no L2 flush between calls), with and without
a block mask, and the kernels' durations from torch.profiler: separates the kernels' time from
bench/decode_compare.py's harness (triton do_bench flushes L2 with a 256 MB memset before each
call; its graph column read 0.56 ms at 128k against 0.49 eager).

    FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python python3 bench/decode_graph_probe.py
"""
import torch
import fajit.torch as ft
from torch.profiler import profile, ProfilerActivity
B, Hq, Hkv, D = 4, 32, 8, 128
def noop(b, h, q, kv): return q >= 0
for lkv in (32768, 131072):
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, lkv, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, lkv, D, device="cuda", dtype=torch.bfloat16)
    m = ft.create_block_mask(noop, None, None, 1, lkv)
    calls = {"mask": lambda: ft.flex_attention(q, k, v, block_mask=m, enable_gqa=True),
             "nomask": lambda: ft.flex_attention(q, k, v, enable_gqa=True)}
    for name, fn in calls.items():
        fn(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay(); torch.cuda.synchronize()
        for label, f in (("eager", fn), ("graph", g.replay)):
            for _ in range(10): f()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50): f()
            e.record(); torch.cuda.synchronize()
            t = s.elapsed_time(e) / 50
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5): f()
                torch.cuda.synchronize()
            ks = {}
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    ks.setdefault(ev.name, []).append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
            desc = "; ".join(f"{n[:40]} x{len(v)} {sum(v)/len(v):.1f}us" for n, v in ks.items())
            print(f"Lkv={lkv} {name} {label}: {t*1000:.1f} us/call back-to-back | {desc}", flush=True)
