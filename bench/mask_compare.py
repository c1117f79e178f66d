#!/usr/bin/env python3
"""torch create_block_mask build time (eager and _compile=True, steady state) for the masks
fajit's symbolic analysis decides: causal, sliding window 1024, prefix LM 2048, and a document
mask (doc ids on the GPU), at Lq = Lkv = 8k, 32k, 128k, block 128, B = H = 1.

   PYTHONUNBUFFERED=1 python3 bench/mask_compare.py [--budget-s 150] [--fajit-bench PATH]

Prints one line per (mask, length, mode): median ms over the repetitions after a warm-up
(one repetition when a call takes over a second), or the error (OOM) when it fails. With
--fajit-bench it first runs fajit's CPU benchmark (bench/mask_bench.cpp) on the same machine.
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask


def causal(b, h, q, kv):
    return q >= kv


def sliding(b, h, q, kv):
    return (q >= kv) & (q - kv <= 1024)


def prefix_lm(b, h, q, kv):
    return (kv < 2048) | (q >= kv)


def document_for(length):
    g = torch.Generator().manual_seed(0)
    sizes, total = [], 0
    while total < length:
        s = int(torch.randint(256, 4096, (1,), generator=g))
        sizes.append(s)
        total += s
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[:length]
    doc = ids.to(device="cuda", dtype=torch.int32)

    def document(b, h, q, kv):
        return doc[q] == doc[kv]

    return document


def timed(fn, deadline):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0  # warm-up (compiles on the first call of a compiled mode)
    reps = 1 if first > 1.0 else 5
    times = []
    for _ in range(reps):
        if time.perf_counter() > deadline:
            break
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if not times:
        return None, first
    return statistics.median(times) * 1e3, first * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--fajit-bench", default="")
    args = ap.parse_args()
    start = time.perf_counter()
    deadline = start + args.budget_s
    if args.fajit_bench:
        print("== fajit (CPU, symbolic analysis + tables) ==")
        print(subprocess.run([args.fajit_bench], capture_output=True, text=True, timeout=60).stdout)
    print(f"== torch {torch.__version__} on {torch.cuda.get_device_name()} ==")
    print(f"{'mask':<12} {'L':>7} {'mode':<9} {'median_ms':>10} {'first_ms':>10}")
    for length in (8192, 32768, 131072):
        masks = [("causal", causal), ("sliding", sliding), ("prefix_lm", prefix_lm),
                 ("document", document_for(length))]
        for name, mod in masks:
            for mode in ("compiled", "eager"):
                if time.perf_counter() > deadline:
                    print(f"{name:<12} {length:>7} {mode:<9} skipped (time budget)")
                    continue
                fn = lambda: create_block_mask(mod, 1, 1, length, length, device="cuda",
                                               BLOCK_SIZE=128, _compile=(mode == "compiled"))
                try:
                    med, first = timed(fn, deadline)
                    med_s = f"{med:10.3f}" if med is not None else "   (budget)"
                    print(f"{name:<12} {length:>7} {mode:<9} {med_s} {first:10.1f}")
                except torch.OutOfMemoryError:
                    print(f"{name:<12} {length:>7} {mode:<9} OOM")
                    torch.cuda.empty_cache()
                except Exception as e:  # noqa: BLE001 -- report and go on
                    print(f"{name:<12} {length:>7} {mode:<9} error: {type(e).__name__}: {str(e)[:120]}")
                    torch.cuda.empty_cache()
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
