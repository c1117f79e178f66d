#!/usr/bin/env python3
"""gpt-fast's decoding step, timed per step: the causal mask's query-block row picked by the
position held on the GPU (block_mask[:, :, pos // 128]), a mask_mod offset by that position, one
query over an Lkv-key cache, B=4 Hq=32 Hkv=8 D=128 bf16.

Columns: fajit eager (the Python call per step: the slice, fajit's mask over the sliced tables,
the launch), fajit replayed from one CUDA graph of the step, and torch flex_attention compiled
(torch.compile(flex_attention), the same slice and mask_mod per step; its graph replay where
capture works). Times are the mean of back-to-back steps between two events (host cost shows
when it exceeds the GPU's). Every backend's output at the last position is checked against
SDPA math in fp32 first.

    FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python \\
        python3 bench/decode_step_probe.py [--lkv 8192,32768] [--steps 200]
Writes the table to stdout and as markdown to $OUT/decode_step.md (or --out).
"""
import argparse
import datetime
import os


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lkv", default="8192,32768")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--layers", type=int, default=1,
                    help="attention calls a step with the step's one mask (a model's layers share it)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of --steps steps; the median is reported")
    ap.add_argument("--backends", default="fajit,flex", help="which of fajit,flex to run")
    ap.add_argument("--explicit-bh", action="store_true",
                    help="create the causal mask with B and Hq given (per-head tables) instead of None, None")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the fajit eager step's host time (cProfile, top functions to "
                         "$OUT/decode_step_profile.txt)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import fajit.torch as ft

    B, Hq, Hkv, D = 4, 32, 8, 128
    dev = torch.cuda.get_device_name()
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for S in [int(x) for x in args.lkv.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(S)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
        pos = torch.zeros((), dtype=torch.int32, device="cuda")
        pos64 = torch.zeros((), dtype=torch.int64, device="cuda")  # flex's (its Inductor kernel wants int64)
        where = {"fajit": pos, "flex": pos64}

        def at_pos(b, h, q_idx, kv_idx):
            return q_idx + pos >= kv_idx

        def at_pos64(b, h, q_idx, kv_idx):
            return q_idx + pos64 >= kv_idx

        mods = {"fajit": at_pos, "flex": at_pos64}

        def place(p):
            pos.fill_(p)
            pos64.fill_(p)

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        mb, mh = (B, Hq) if args.explicit_bh else (None, None)
        masks = {"fajit": ft.create_block_mask(causal, mb, mh, S, S)}
        try:
            if "flex" not in args.backends.split(","):
                raise RuntimeError("not asked for")  # torch's eager builder materialises [B, H, S, S] (1 TiB at 32k with B, H given): compiled then
            masks["flex"] = create_block_mask(causal, mb, mh, S, S, device="cuda", _compile=args.explicit_bh)
        except Exception as e:  # noqa: BLE001 - reported in the flex column
            masks["flex"] = e
        attn = {"fajit": lambda q, m: ft.flex_attention(q, k, v, block_mask=m, enable_gqa=True),
                "flex": lambda q, m: flex(q, k, v, block_mask=m, enable_gqa=True)}

        def step(name):
            if isinstance(masks[name], Exception):
                raise masks[name]
            m = masks[name][:, :, where[name] // 128]
            m.mask_mod = mods[name]
            m.seq_lengths = (1, S)
            for _ in range(args.layers - 1):
                attn[name](q, m)
            return attn[name](q, m)

        last = S - 1
        place(last)
        kk, vv = (t.float().repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))
        want = F.scaled_dot_product_attention(q.float(), kk, vv)
        row = {"Lkv": S}
        for name in [b for b in ("fajit", "flex") if b in args.backends.split(",")]:
            try:
                out = step(name)
                err = ((out.float() - want).norm() / want.norm()).item()
                assert err < 2e-2, f"rel. error {err:.3g}"
            except Exception as e:  # noqa: BLE001 - a backend that cannot run is reported, not fatal
                row[name] = row[name + " graph"] = f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
                continue

            def timed(fn):
                for _ in range(10):
                    fn()
                runs = []
                for _ in range(args.repeats):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    s.record()
                    for i in range(args.steps):
                        place(last - (i % 64))
                        fn()
                    e.record()
                    torch.cuda.synchronize()
                    runs.append(s.elapsed_time(e) / args.steps * 1e3)  # us
                return sorted(runs)[len(runs) // 2]

            row[name] = f"{timed(lambda: step(name)):.1f}"
            try:
                cg = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cg):
                    step(name)
                row[name + " graph"] = f"{timed(cg.replay):.1f}"
            except Exception as e:  # noqa: BLE001
                row[name + " graph"] = f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
        rows.append(row)
        print(row, flush=True)
        if args.profile and not str(row.get("fajit", "n/a")).startswith("n/a"):
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for i in range(args.steps):
                place(last - (i % 64))
                step("fajit")
            torch.cuda.synchronize()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(35)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "decode_step_profile.txt"), "a") as f:
                f.write(f"# Lkv {S}, {args.steps} eager fajit steps\n{text.getvalue()}\n")

    cols = ["Lkv", "fajit", "fajit graph", "flex", "flex graph"]
    md = [f"# gpt-fast decoding step, {dev}, {datetime.date.today()}",
          f"B={B} Hq={Hq} Hkv={Hkv} D={D} bf16, one query, causal at the position "
          f"(mask made with B, H = {'B, Hq' if args.explicit_bh else 'None, None'}); {args.layers} attention "
          f"call(s) a step with the step's mask; us per step (median of {args.repeats} runs of the mean of "
          f"{args.steps} back-to-back steps; the position's fill_ between steps included)", "",
          "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    text = "\n".join(md) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_step.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
