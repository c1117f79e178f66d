#!/usr/bin/env python3
"""Forward A/B of several libfajit.so builds on the same tensors, medians over alternating rounds.

    FAJIT_AUTOTUNE=0 python3 bench/ab_forward.py --libs main=base.so,new=.device-build/lib/libfajit.so \
        --cases document,full,sliding,causal --dims 128,64 --rounds 5

flex_compare.py's cases, tensors and fajit setup (bf16 B4 H16 S4096 by default). Each library
compiles every case cold (its own kernels: the cache key covers the templates), its output is
compared with the first library's (`err`, relative), and every round times each library once with
triton's do_bench (its median), the order rotated a round, so clock drift and the order effect
hit all alike (use as many rounds as a multiple of the builds for every build to go first equally).
Prints one line per case: each library's median, its speed relative to the first (>1: faster) and
every round's time. No torch flex here: a kernel A/B, not the zoo (flex_compare.py).

A timing hack that leaves O unused (an epilogue cut out to see what it costs) lets ptxas delete
the P·V wgmmas and with them the softmax: keep O alive (a store no run takes) or the time means
nothing (NOTES-sm90.md, fifty-first session).
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flex_compare as fc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--libs", required=True, help="name=path[,name=path...]; the first is the baseline")
    ap.add_argument("--cases", default="document,full")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    os.environ["FAJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fajit-ab-")
    os.environ.setdefault("CUDA_CACHE_DISABLE", "1")  # NVRTC's own cache: see flex_compare.py
    import torch
    import triton
    for case in args.cases.split(","):
        if case not in fc.CASES:
            sys.exit(f"unknown case {case}; known: {','.join(fc.CASES)}")
    pairs = [x.split("=", 1) for x in args.libs.split(",")]
    if len({n for n, _ in pairs}) != len(pairs):
        sys.exit("--libs: each build needs a name of its own")
    libs = [(n, fc.Fajit(os.path.abspath(p))) for n, p in pairs]
    print(f"device: {torch.cuda.get_device_name()}; autotune {os.environ.get('FAJIT_AUTOTUNE', 'on')}",
          flush=True)
    B, H, S = args.batch, args.heads, args.seq

    def stream():
        return torch.cuda.current_stream().cuda_stream

    for D in (int(d) for d in args.dims.split(",")):
        for case in args.cases.split(","):
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=fc.torch_dtype()) for _ in range(3))
            doc_ids = None
            if case == "document":
                lens = fc.random_doc_lens(S, seed=7)
                doc_ids = torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int32),
                                                  torch.tensor(lens)).cuda().contiguous()
            fns, outs, handles = {}, {}, []
            for name, lib in libs:
                fn, out, _, h = fc.setup_fajit(lib, case, q, k, v, B, H, S, D, doc_ids, stream)
                fns[name], outs[name] = fn, out
                handles.append((lib, h))
            ref = outs[libs[0][0]]
            errs = {n: fc.rel_err(o, ref) for n, o in outs.items()}
            times = {n: [] for n, _ in libs}
            for r in range(args.rounds):
                for i in range(len(libs)):
                    n = libs[(i + r) % len(libs)][0]
                    times[n].append(triton.testing.do_bench(fns[n], warmup=25, rep=100, return_mode="median"))
            med = {n: statistics.median(t) for n, t in times.items()}
            base = med[libs[0][0]]
            print(f"{case:10s} d{D}: " + "  ".join(
                f"{n} {med[n]:.4f} ms ({base / med[n]:.3f}x, err {errs[n]:.1e}, all "
                f"{' '.join(f'{x:.3f}' for x in times[n])})" for n, _ in libs), flush=True)
            torch.cuda.synchronize()
            for lib, (kern, bm) in handles:
                lib.lib.fajit_block_mask_destroy(bm)
                lib.lib.fajit_kernel_destroy(kern)


if __name__ == "__main__":
    main()
