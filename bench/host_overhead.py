#!/usr/bin/env python3
"""Where a short fajit call spends its time: host cost per call vs GPU time.

    FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python \\
        python3 bench/host_overhead.py [--lkv 8192,32768]

1. Host microseconds per call (perf_counter over N back-to-back calls on a tiny problem, the GPU
   idle most of the time, one synchronize at the end): fajit.torch.flex_attention, torch
   flex_attention (torch.compile'd) and SDPA; then cProfile's top entries of the fajit call.
2. The decode shape of the decoding benchmark (bf16 B=4 Hq=32 Hkv=8 D=128, Lq=1) timed three
   ways: do_bench on the eager call (what bench/decode_compare.py reports), back-to-back calls
   between two events (host overhead hidden when the GPU is the bottleneck), and a CUDA graph
   replay (GPU time only); with a K,V copy for the bandwidth ceiling.
"""
import argparse
import cProfile
import io
import pstats
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lkv", default="8192,32768")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    import torch
    import triton.testing
    from torch.nn.attention.flex_attention import flex_attention

    import fajit.torch as ft

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    flex = torch.compile(flex_attention, dynamic=False)

    def noop(b, h, q, kv):
        return q >= 0

    def host_us(fn, n):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    # ---- 1. host cost per call, tiny problem
    q = torch.randn(1, 4, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 256, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    fmask = ft.create_block_mask(noop, None, None, 1, 256)
    calls = {
        "fajit flex_attention (block mask)": lambda: ft.flex_attention(q, k, v, block_mask=fmask, enable_gqa=True),
        "fajit flex_attention (no mask)": lambda: ft.flex_attention(q, k, v, enable_gqa=True),
        "torch flex_attention (compiled)": lambda: flex(q, k, v, enable_gqa=True),
        "SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True),
    }
    print("\nhost us per call (tiny problem, back to back):")
    for name, fn in calls.items():
        print(f"  {name:40s} {host_us(fn, args.calls):8.1f}")

    prof = cProfile.Profile()
    fn = calls["fajit flex_attention (block mask)"]
    prof.enable()
    for _ in range(500):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print("\ncProfile, 500 fajit calls, by own time:")
    print("\n".join(s.getvalue().splitlines()[:40]))

    # ---- 2. the decode shape three ways
    B, Hq, Hkv, D = 4, 32, 8, 128
    print("\ndecode bf16 B=4 Hq=32 Hkv=8 D=128 Lq=1: ms (TB/s of K+V read)")
    for lkv in [int(x) for x in args.lkv.split(",")]:
        q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, lkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        nbytes = 2 * k.numel() * k.element_size()
        fmask = ft.create_block_mask(noop, None, None, 1, lkv)
        fn = lambda: ft.flex_attention(q, k, v, block_mask=fmask, enable_gqa=True)  # noqa: E731
        res = {"do_bench (eager)": triton.testing.do_bench(fn, return_mode="median")}
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 200
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        res["back to back (events)"] = start.elapsed_time(end) / n
        try:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                out = fn()
            g.replay()
            torch.cuda.synchronize()
            ref = fn()
            assert torch.equal(out, ref), "graph replay differs from the eager call"
            res["CUDA graph replay (do_bench)"] = triton.testing.do_bench(g.replay, return_mode="median")
        except Exception as e:  # report, keep going
            print(f"  graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        kc, vc = torch.empty_like(k), torch.empty_like(v)
        copy = triton.testing.do_bench(lambda: (kc.copy_(k), vc.copy_(v)), return_mode="median")
        copy_tbs = 2 * nbytes / (copy * 1e-3) / 1e12
        print(f"  Lkv={lkv}: copy K,V {copy:.3f} ms ({copy_tbs:.2f} TB/s read+write)")
        for name, ms in res.items():
            tbs = nbytes / (ms * 1e-3) / 1e12
            print(f"    {name:32s} {ms:.4f} ms  {tbs:.2f} TB/s  {tbs / copy_tbs:.2f} of copy")


if __name__ == "__main__":
    main()
