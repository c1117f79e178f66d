#!/usr/bin/env python3
"""A training step whose document mask changes every step (new packing per batch): the block
mask built from the step's document ids on the GPU, then forward + backward, fajit.torch against
torch flex_attention (compiled), same tensors, bf16.

For each library: the mask build alone (ms, host wall time to a synchronized result and CUDA
time), the step with a mask built once (the kernels alone), and the step with the mask built
inside it, back to back with no synchronization (what a training loop does). The difference
between the last two is what the per-step mask costs.

    FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python \\
        python3 bench/train_mask_probe.py [--shapes 4x16x4096x128,1x16x16384x128] [--steps 20] [--backends fajit]
Writes the table to stdout and as markdown to $OUT/train_mask.md (or --out).
"""
import argparse
import datetime
import os
import statistics
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4x16x4096x128,1x16x16384x128", help="BxHxSxD, comma-separated")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backends", default="fajit,flex", help="comma-separated: fajit, flex")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import fajit.torch as ft

    if set(args.backends.split(",")) - {"fajit", "flex"}:
        ap.error(f"--backends: fajit and/or flex, got {args.backends}")
    dev = torch.cuda.get_device_name()
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for shape in args.shapes.split(","):
        B, H, S, D = (int(x) for x in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(S)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        doc = torch.zeros(B, S, dtype=torch.int32, device="cuda")

        def repack(step):
            # 4-12 documents a row, boundaries random (the same for the same step): ids = number of
            # boundaries at or before each token
            cuts = torch.randint(1, S, (B, 4 + step % 9), generator=torch.Generator(device="cuda").manual_seed(step),
                                 device="cuda")
            pos = torch.arange(S, device="cuda")
            doc.copy_((pos[None, :, None] >= cuts[:, None, :]).sum(-1).to(torch.int32))

        def document(b, h, q_idx, kv_idx):
            return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)

        build = {"fajit": lambda: ft.create_block_mask(document, B, None, S, S),
                 "flex": lambda: create_block_mask(document, B, None, S, S, device="cuda", _compile=True)}
        attn = {"fajit": ft.flex_attention, "flex": flex}

        def step(name, mask):
            out = attn[name](q, k, v, block_mask=mask)
            torch.autograd.grad(out, (q, k, v), do)

        want = None
        for name in args.backends.split(","):
            row = {"shape": shape, "lib": name}
            try:
                repack(0)  # the documents the first library's output was computed with
                m = build[name]()
                out = attn[name](q, k, v, block_mask=m)
                if want is None:
                    want = out.float()
                else:
                    err = ((out.float() - want).norm() / want.norm()).item()
                    assert err < 2e-2, f"rel. error {err:.3g} against fajit"
                for _ in range(3):
                    step(name, build[name]())
                torch.cuda.synchronize()
                # mask build alone: host wall time to a synchronized mask, and its CUDA time
                walls, cudas = [], []
                for i in range(args.steps):
                    repack(i)
                    torch.cuda.synchronize()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    s.record()
                    build[name]()
                    e.record()
                    torch.cuda.synchronize()
                    walls.append((time.perf_counter() - t0) * 1e3)
                    cudas.append(s.elapsed_time(e))
                row["build wall ms"] = statistics.median(walls)
                row["build cuda ms"] = statistics.median(cudas)

                def loop(rebuild):
                    fixed = build[name]()
                    torch.cuda.synchronize()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for i in range(args.steps):
                        repack(i)
                        step(name, build[name]() if rebuild else fixed)
                    e.record()
                    torch.cuda.synchronize()
                    return s.elapsed_time(e) / args.steps

                row["step, mask once ms"] = statistics.median(loop(False) for _ in range(3))
                row["step, mask each step ms"] = statistics.median(loop(True) for _ in range(3))
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)

    cols = ["shape", "lib", "build wall ms", "build cuda ms", "step, mask once ms", "step, mask each step ms", "error"]
    md = [f"# Training step with a new document mask each step, {dev}, {datetime.date.today()}",
          "bf16, causal within documents (4-12 a row, random boundaries), forward + backward; flex = "
          "torch.compile(flex_attention) with create_block_mask(_compile=True); medians", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, ""))
                                    for c in cols) + " |")
    text = "\n".join(md) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train_mask.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
