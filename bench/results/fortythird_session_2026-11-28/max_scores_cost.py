"""What AuxRequest(max_scores=True) costs: fajit.torch.flex_attention with and without it, and
torch's flex_attention (compiled) with and without it, on the same tensors (bf16, do_bench)."""
import sys

import torch
from torch.nn.attention import flex_attention as tfa
from triton.testing import do_bench

import fajit.torch as ft

B, H, S = 4, 16, 4096
print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
print("| case | D | fajit ms | fajit+max ms | ratio | flex ms | flex+max ms | ratio | speed-up vs flex+max |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
torch._dynamo.config.recompile_limit = 64  # six cases x with/without: past the default 8, eager flex
tflex = torch.compile(tfa.flex_attention, dynamic=False)


def causal(b, h, q, kv):
    return q >= kv


def softcap(score, b, h, q, kv):
    return 30.0 * torch.tanh(score / 30.0)


for D in (64, 128):
    for name, mask_mod, score_mod in (("causal", causal, None), ("softcap causal", causal, softcap),
                                      ("full", None, None)):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fm = ft.create_block_mask(mask_mod, None, None, S, S) if mask_mod else None
        tm = tfa.create_block_mask(mask_mod, None, None, S, S) if mask_mod else None
        with torch.no_grad():
            plain = lambda: ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=fm)  # noqa: E731
            withm = lambda: ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=fm,  # noqa: E731
                                              return_aux=ft.AuxRequest(max_scores=True))
            tplain = lambda: tflex(q, k, v, score_mod=score_mod, block_mask=tm)  # noqa: E731
            twith = lambda: tflex(q, k, v, score_mod=score_mod, block_mask=tm,  # noqa: E731
                                  return_aux=tfa.AuxRequest(max_scores=True))
            _, a = withm()
            _, ta = twith()
            err = (a.max_scores - ta.max_scores).abs().nan_to_num(0).max().item()
            t = [do_bench(f, warmup=50, rep=300) for f in (plain, withm, tplain, twith)]
        print(f"| {name} | {D} | {t[0]:.3f} | {t[1]:.3f} | {t[1] / t[0]:.3f} | {t[2]:.3f} | {t[3]:.3f} | "
              f"{t[3] / t[2]:.3f} | {t[3] / t[1]:.2f}x (max |diff| {err:.2e}) |")
        sys.stdout.flush()
