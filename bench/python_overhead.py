#!/usr/bin/env python3
"""fajit through Python (fajit.torch) vs torch's compiled flex_attention and vs fajit's C++ API.

    FAJIT_LIBRARY=build/libfajit.so PYTHONPATH=python python3 bench/python_overhead.py \\
        [--fajit-cli build/tools/fajit/fajit] [--out bench-python.md]

1. Per-call host overhead (us) on small shapes: the time the host spends per call, measured as
   the wall time of N back-to-back calls divided by N, with the GPU work tiny; fajit.torch vs
   torch.compile(flex_attention), forward and forward+backward.
2. Forward and forward+backward TFLOP/s (causal, bf16) through fajit.torch and through the C++
   API (`fajit run`, the CLI over fa::Kernel), on the same shapes (target: within 3%). Python is
   timed two ways: synchronous calls, wall time (`fajit run`'s method, so the host overhead of
   each call counts in full), and back-to-back calls between two CUDA events (a training loop).
3. First-call latency of a new mod (a score_mod never seen before: trace + compile + run) with
   an empty fajit disk cache vs torch's first call of torch.compile(flex_attention) with a new
   score_mod.
Needs torch with CUDA; the C++ column needs the fajit CLI.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask as torch_cbm
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import fajit.torch as ft


class Rows(list):
    """The table's rows, each also printed as it comes (a run cut short keeps what it measured)."""

    def append(self, row):
        print(" | ".join(row), flush=True)
        super().append(row)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def wall_ms(fn, iters=20):
    """Median wall time of one call, synchronizing around each: `fajit run`'s method (C++)."""
    fn()
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def stream_ms(fn, iters=20, repeats=5):
    """GPU time per call of `iters` back-to-back calls (as a training loop issues them: the host
    runs ahead, its overhead hidden while it is shorter than the kernels), median of repeats."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / iters)
    return statistics.median(times)


def inputs(B, H, L, D, grad=False):
    return [torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]


def overhead(rows, iters):
    B, H, L, D = 1, 1, 128, 64
    q, k, v = inputs(B, H, L, D, grad=True)
    fm = ft.create_block_mask(causal, None, None, L, L)
    tm = torch_cbm(causal, None, None, L, L)
    tflex = torch.compile(torch_flex)
    fwd = {"fajit.torch": lambda: ft.flex_attention(q, k, v, block_mask=fm),
           "torch.compile(flex)": lambda: tflex(q, k, v, block_mask=tm)}
    for name, f in fwd.items():
        with torch.no_grad():
            us = timed(f, iters) * 1e6
        rows.append(("host overhead, forward (B=1 H=1 L=128 D=64)", name, f"{us:.1f} us/call"))
    for name, f in fwd.items():
        us = timed(lambda: f().sum().backward(), iters // 2) * 1e6
        rows.append(("host overhead, forward+backward", name, f"{us:.1f} us/call"))


def cli_tflops(cli, B, H, L, D):
    out = subprocess.run([cli, "run", "--mask", "causal", "--batch", str(B), "--heads", str(H), "--len", str(L),
                          "--head-dim", str(D), "--backward", "--iters", "20", "--no-check"], capture_output=True, text=True)
    if out.returncode != 0:
        return None, None
    f = re.search(r"forward: [\d.]+ ms .*?, ([\d.]+) TFLOP/s", out.stdout)
    b = re.search(r"backward: ([\d.]+) ms", out.stdout)
    fms = re.search(r"forward: ([\d.]+) ms", out.stdout)
    return (float(f.group(1)) if f else None,
            (float(fms.group(1)), float(b.group(1))) if fms and b else None)


def throughput(rows, cli):
    for B, H, L, D in ((4, 16, 4096, 128), (8, 16, 2048, 64)):
        q, k, v = inputs(B, H, L, D, grad=True)
        m = ft.create_block_mask(causal, None, None, L, L)
        kept = L * (L + 1) / 2  # causal pairs
        flops = 4 * B * H * kept * D
        fwd = lambda: ft.flex_attention(q, k, v, block_mask=m)
        out = fwd()
        dout = torch.randn_like(out)
        fwd_bwd = lambda: torch.autograd.backward(ft.flex_attention(q, k, v, block_mask=m), dout)
        shape = f"B={B} H={H} L={L} D={D} causal"
        with torch.no_grad():
            ms, ms_b2b = wall_ms(fwd), stream_ms(fwd)
        ms_fb, ms_fb_b2b = wall_ms(fwd_bwd), stream_ms(fwd_bwd)
        rows.append((f"forward TFLOP/s, {shape}", "fajit.torch, synchronous calls (as fajit run)",
                     f"{flops / ms / 1e9:.1f}"))
        rows.append((f"forward TFLOP/s, {shape}", "fajit.torch, back-to-back calls", f"{flops / ms_b2b / 1e9:.1f}"))
        rows.append((f"forward+backward TFLOP/s, {shape}", "fajit.torch, synchronous calls (as fajit run)",
                     f"{3.5 * flops / ms_fb / 1e9:.1f}"))
        rows.append((f"forward+backward TFLOP/s, {shape}", "fajit.torch, back-to-back calls",
                     f"{3.5 * flops / ms_fb_b2b / 1e9:.1f}"))
        if cli:
            f_tf, fb = cli_tflops(cli, B, H, L, D)
            if f_tf is not None:
                rows.append((f"forward TFLOP/s, {shape}", "C++ API (fajit run)", f"{f_tf:.1f}"))
            if fb is not None:
                rows.append((f"forward+backward TFLOP/s, {shape}", "C++ API (fajit run)",
                             f"{3.5 * flops / (fb[0] + fb[1]) / 1e9:.1f}"))


def first_call(rows):
    B, H, L, D = 2, 8, 1024, 128
    q, k, v = inputs(B, H, L, D)
    n = time.time_ns()  # a constant no cache has seen

    def new_mod(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * (1e-9 * (n % 1000 + 1))

    m = ft.create_block_mask(causal, None, None, L, L)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ft.flex_attention(q, k, v, score_mod=new_mod, block_mask=m)
    torch.cuda.synchronize()
    rows.append(("first call of a new score_mod (trace+compile+run, empty disk cache)", "fajit.torch",
                 f"{(time.perf_counter() - t0) * 1e3:.0f} ms"))
    tm = torch_cbm(causal, None, None, L, L)

    def new_mod2(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * (1e-9 * (n % 997 + 2))

    torch._dynamo.reset()
    tflex = torch.compile(torch_flex)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tflex(q, k, v, score_mod=new_mod2, block_mask=tm)
    torch.cuda.synchronize()
    rows.append(("first call of a new score_mod (trace+compile+run, empty disk cache)", "torch.compile(flex)",
                 f"{(time.perf_counter() - t0) * 1e3:.0f} ms"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fajit-cli", default=os.path.join(os.path.dirname(__file__), "..", "build", "tools", "fajit",
                                                         "fajit"))
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("python_overhead.py needs a CUDA GPU")
    os.environ["FAJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fajit-bench-cache-")  # cold first calls
    cli = a.fajit_cli if os.path.exists(a.fajit_cli) else None
    rows = Rows()
    first_call(rows)
    overhead(rows, a.iters)
    throughput(rows, cli)
    lines = [f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| measure | path | value |", "|---|---|---|"] + [f"| {m} | {p} | {v} |" for m, p, v in rows]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
