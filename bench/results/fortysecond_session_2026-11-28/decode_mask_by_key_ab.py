# Session 42 scratch: decode with a column-only mask (keep[kv]) and a per-key bias, timed with do_bench,
# checked against fp32 math. One process per library (FAJIT_LIBRARY), run from the repository root.
import os, sys, torch, triton
sys.path.insert(0, "python")
from fajit.torch import flex_attention, create_block_mask
g = torch.Generator(device="cuda").manual_seed(0)
B, Hq, Hkv, Lkv = 4, 32, 8, 32768
keep = (torch.rand(Lkv, device="cuda", generator=g) < 0.67).to(torch.int32)
bias = torch.randn(Lkv, device="cuda", generator=g) * 0.5
def mask(b, h, q, kv): return keep[kv] != 0
def sm(score, b, h, q, kv): return score + bias[kv]
lib = os.path.basename(os.environ["FAJIT_LIBRARY"]).split("_")[0]
# DIMS / LQS (comma-separated) narrow the cases: call 5 ran DIMS=64 LQS=1.
for D in [int(x) for x in os.environ.get("DIMS", "64,128").split(",")]:
    for lq in [int(x) for x in os.environ.get("LQS", "1,16").split(",")]:
        q = torch.randn(B, Hq, lq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, Lkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        bm = create_block_mask(mask, B, Hq, lq, Lkv)
        for name, smod in (("mask", None), ("mask+bias", sm)):
            f = lambda: flex_attention(q, k, v, score_mod=smod, block_mask=bm, enable_gqa=True)
            out = f().float()
            ke, ve = k.float().repeat_interleave(Hq // Hkv, 1), v.float().repeat_interleave(Hq // Hkv, 1)
            s = q.float() @ ke.transpose(-1, -2) / D ** 0.5
            if smod: s = s + bias
            s = s.masked_fill(keep == 0, float("-inf"))
            ref = torch.softmax(s, -1) @ ve
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            ms = triton.testing.do_bench(f, warmup=25, rep=100)
            print(f"D{D}_lq{lq}_{name} {lib} {ms:.4f} err={err:.1e}", flush=True)
