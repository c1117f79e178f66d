"""How long a user waits for the first result of a new attention variant: fajit.torch's
create_block_mask + flex_attention in a fresh process with an empty fajit cache and no driver
compute cache (CUDA_CACHE_DISABLE=1), so every kernel compiles cold. One child process per
(library, autotune, case, round); libraries and settings alternate within each round.

    python3 bench/first_call.py [--lib NEW.so] [--baseline-lib BASE.so] [--rounds 2]
                                [--cases causal,full,alibi,sliding,softcap] [--dims 64,128]
                                [--out DIR]

Per child: mask ms (create_block_mask, its builder compiled), first ms (the first flex_attention
call: the forward's compile, with autotuning on the candidates' compile and timing too, and the
launch), total = mask + first, then a second call's ms (everything warm). Prints a table of
medians and writes it (with every child's line) to DIR/first_call.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, time
import torch
import fajit.torch as ft
case, D = sys.argv[1], int(sys.argv[2])
B, H, S = 4, 16, 4096
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(1)
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev, dtype=torch.float32) / H)
causal = lambda b, h, qi, ki: qi >= ki
mask_mod, score_mod = causal, None
if case == "full":
    mask_mod = None
elif case == "sliding":
    mask_mod = lambda b, h, qi, ki: (qi >= ki) & (qi - ki < 1024)
elif case == "alibi":
    score_mod = lambda s, b, h, qi, ki: s + slopes[h] * (ki - qi)
elif case == "softcap":
    score_mod = lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0)
torch.cuda.synchronize()
t0 = time.perf_counter()
bm = ft.create_block_mask(mask_mod, B, H, S, S, device=dev) if mask_mod else None
torch.cuda.synchronize()
t1 = time.perf_counter()
o = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
torch.cuda.synchronize()
t2 = time.perf_counter()
o = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
torch.cuda.synchronize()
t3 = time.perf_counter()
assert torch.isfinite(o).all()
print(json.dumps({"mask_ms": (t1 - t0) * 1e3, "first_ms": (t2 - t1) * 1e3, "second_ms": (t3 - t2) * 1e3}))
"""


def child(lib, autotune, case, dim):
    env = dict(os.environ)
    env.update(FAJIT_LIBRARY=lib, FAJIT_AUTOTUNE="1" if autotune else "0", CUDA_CACHE_DISABLE="1")
    with tempfile.TemporaryDirectory() as cache:
        env["FAJIT_CACHE_DIR"] = cache
        r = subprocess.run([sys.executable, "-c", CHILD, case, str(dim)], env=env, capture_output=True,
                           text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{case} d{dim} {lib}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FAJIT_LIBRARY", ""))
    ap.add_argument("--baseline-lib", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="causal,full,alibi,sliding,softcap")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    device = torch.cuda.get_device_name()
    configs = [("new", a.lib, True), ("new", a.lib, False)]
    if a.baseline_lib:
        configs.insert(1, ("base", a.baseline_lib, True))
    rows, lines = {}, []
    for rnd in range(a.rounds):
        order = configs if rnd % 2 == 0 else configs[::-1]
        for dim in (int(d) for d in a.dims.split(",")):
            for case in a.cases.split(","):
                for tag, lib, tune in order:
                    r = child(lib, tune, case, dim)
                    key = (case, dim, tag, "on" if tune else "off")
                    rows.setdefault(key, []).append(r)
                    line = f"round {rnd} {case} d{dim} {tag} autotune {key[3]}: " + \
                           ", ".join(f"{k} {v:.0f}" for k, v in r.items())
                    print(line, flush=True)
                    lines.append(line)
    med = lambda rs, k: statistics.median(x[k] for x in rs)
    out = [f"Device: {device}. bf16 B4 H16 S4096, fajit.torch create_block_mask + flex_attention, fresh "
           f"process, empty FAJIT_CACHE_DIR, CUDA_CACHE_DISABLE=1; medians of {a.rounds} rounds; "
           f"{time.strftime('%Y-%m-%d')}.", "",
           "| case | D | lib | autotune | mask ms | first call ms | total ms | second call ms |",
           "|---|---:|---|---|---:|---:|---:|---:|"]
    for (case, dim, tag, tune), rs in rows.items():
        m, f, s = med(rs, "mask_ms"), med(rs, "first_ms"), med(rs, "second_ms")
        out.append(f"| {case} | {dim} | {tag} | {tune} | {m:.0f} | {f:.0f} | {m + f:.0f} | {s:.2f} |")
    text = "\n".join(out)
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "first_call.md"), "w") as fh:
            fh.write(text + "\n\n```\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
