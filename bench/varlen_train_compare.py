#!/usr/bin/env python3
"""Packed ("varlen") training step: fajit.torch.flex_attention_varlen on packed [total, H, D]
tensors with cu_seqlens, against torch flex_attention (torch.compile'd) the way flex users train
on packed batches (a document-causal block mask over a dense [1, H, total, D] batch), and against
fajit's own flex_attention on that same dense document-causal batch. Same tensors, bf16, one
process.

    PYTHONUNBUFFERED=1 FAJIT_LIBRARY=.device-build/lib/libfajit.so PYTHONPATH=python \
        python3 bench/varlen_train_compare.py [--out $OUT]

For each case: random sequence lengths (fixed seed) summing to `total` tokens, causal within a
sequence. Every library's output and dQ/dK/dV are checked against flex's before timing
(relative Frobenius error < 3e-2). Timed with triton.testing.do_bench (median): forward alone
(inference mode) and forward+backward (autograd.grad of the output against a fixed dO).
TFLOP/s: forward 4 * Hq * kept_pairs * D, backward 2.5x that (FlashAttention's convention),
kept_pairs = sum over sequences of L(L+1)/2.

Writes a markdown table to stdout and to --out/varlen_train.md.
"""
import argparse
import datetime
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flex_compare as fc  # noqa: E402  (rel_err, as backward_compare.py)


def lens_of(total, lo, hi, seed):
    """Random sequence lengths in [lo, hi] summing to total (the last one takes the rest)."""
    rng = random.Random(seed)
    lens = []
    while total - sum(lens) > hi:
        lens.append(rng.randint(lo, hi))
    lens.append(total - sum(lens))
    return lens


def kernel_table(fn, label, steps=5):
    """torch.profiler's CUDA time per kernel over `steps` calls of fn, per call (us), and the
    host-side wall time per call: where a library's training step goes."""
    import time
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e6
    per = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t and e.device_type.name == "CUDA":
            per[e.key] = (t / steps, e.count // steps)
    lines = [f"  {label}: wall {wall:.0f} us per step; CUDA time per step by kernel:"]
    for k, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:12]:
        lines.append(f"    {t:9.1f} us  x{n:<3} {k[:110]}")
    lines.append(f"    {sum(t for t, _ in per.values()):9.1f} us  in all")
    return lines


def run_case(name, Hq, Hkv, D, total, lo, hi, warmup, rep, profile=False):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from triton.testing import do_bench
    import fajit.torch as ft

    lens = lens_of(total, lo, hi, seed=Hq + D + lo)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
    g = torch.Generator(device="cuda").manual_seed(3 + D)
    mk = lambda h: torch.randn(total, h, D, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v, do = mk(Hq), mk(Hkv), mk(Hkv), mk(Hq)

    def doc_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    dense = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731  [total, H, D] -> [1, H, total, D] view
    flex_mask = create_block_mask(doc_causal, 1, 1, total, total, device="cuda")
    fajit_doc_mask = ft.create_block_mask(doc_causal, 1, 1, total, total, device="cuda")
    packed_mask = ft.create_block_mask(causal, None, None, max(lens), max(lens))
    flex_c = torch.compile(flex_attention, dynamic=False)

    def flex_fn(q, k, v):
        return flex_c(dense(q), dense(k), dense(v), block_mask=flex_mask, enable_gqa=Hq != Hkv)[0].transpose(0, 1)

    def fajit_doc_fn(q, k, v):
        return ft.flex_attention(dense(q), dense(k), dense(v), block_mask=fajit_doc_mask,
                                 enable_gqa=Hq != Hkv)[0].transpose(0, 1)

    def fajit_packed_fn(q, k, v):
        return ft.flex_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), block_mask=packed_mask,
                                        enable_gqa=Hq != Hkv)

    fns = [("flex (document mask)", flex_fn), ("fajit (document mask)", fajit_doc_fn),
           ("fajit packed (cu_seqlens)", fajit_packed_fn)]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def grads(fn):
        out = fn(*leaves)
        return (out.detach(), *torch.autograd.grad(out, leaves, do))

    ref = grads(flex_fn)
    pairs = sum(L * (L + 1) // 2 for L in lens)
    fwd_flop = 4.0 * Hq * pairs * D
    rows = []
    for label, fn in fns:
        got = grads(fn)
        errs = [fc.rel_err(a, b) for a, b in zip(got, ref)]
        ok = all(e < 3e-2 for e in errs)
        with torch.inference_mode():
            t_fwd = do_bench(lambda: fn(q, k, v), warmup=warmup, rep=rep)

        def step():
            out = fn(*leaves)
            torch.autograd.grad(out, leaves, do)

        t_fb = do_bench(step, warmup=warmup, rep=rep)
        if profile:
            print("\n".join(kernel_table(step, f"{name} {label} fwd+bwd")), flush=True)
        t_bwd = max(t_fb - t_fwd, 1e-9)
        rows.append(dict(label=label, fwd=t_fwd, fb=t_fb, bwd=t_bwd, ok=ok, err=max(errs),
                         fwd_tf=fwd_flop / t_fwd * 1e-9, bwd_tf=2.5 * fwd_flop / t_bwd * 1e-9))
    return dict(name=name, Hq=Hq, Hkv=Hkv, D=D, total=total, n=len(lens), longest=max(lens), rows=rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--total", type=int, default=16384)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--cases", default="", help="comma-separated case names to run (default: all)")
    ap.add_argument("--profile", action="store_true", help="also print each step's CUDA time by kernel")
    args = ap.parse_args()
    import torch

    cases = [("d64 H16", 16, 16, 64, 128, 4096), ("d128 H16", 16, 16, 128, 128, 4096),
             ("d128 GQA 32/8", 32, 8, 128, 128, 4096), ("d128 H16 short", 16, 16, 128, 32, 512)]
    lines = [f"# Packed training step, {torch.cuda.get_device_name()}, {datetime.date.today()}",
             "", f"torch {torch.__version__}; bf16; total {args.total} tokens; causal within each sequence; "
             "forward = inference mode, backward = (fwd+bwd) - fwd; do_bench medians (ms)", "",
             "| case | sequences (longest) | library | fwd ms | fwd TFLOP/s | fwd+bwd ms | bwd ms | bwd TFLOP/s "
             "| vs flex fwd+bwd | check (max rel err) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    only = [c for c in args.cases.split(",") if c]
    for name, Hq, Hkv, D, lo, hi in cases:
        if only and name not in only:
            continue
        try:
            c = run_case(name, Hq, Hkv, D, args.total, lo, hi, args.warmup, args.rep, args.profile)
        except Exception as e:  # report and go on
            lines.append(f"| {name} | | error: {type(e).__name__}: {str(e)[:200]} | | | | | | | |")
            print(lines[-1], flush=True)
            continue
        flex_fb = c["rows"][0]["fb"]
        for r in c["rows"]:
            lines.append(f"| {name} Hq{c['Hq']} Hkv{c['Hkv']} | {c['n']} ({c['longest']}) | {r['label']} | "
                         f"{r['fwd']:.3f} | {r['fwd_tf']:.0f} | {r['fb']:.3f} | {r['bwd']:.3f} | {r['bwd_tf']:.0f} | "
                         f"{flex_fb / r['fb']:.2f}x | {'ok' if r['ok'] else 'MISMATCH'} ({r['err']:.1e}) |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "varlen_train.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
