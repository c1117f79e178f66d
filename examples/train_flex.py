#!/usr/bin/env python3
"""Train a small causal transformer a few steps twice from the same start, once with torch's
flex_attention and once with fajit's (`from fajit.torch import ...`), and print both losses.

    FAJIT_LIBRARY=build/libfajit.so PYTHONPATH=python python3 examples/train_flex.py [--steps 20]

The attention uses a causal block mask and a tanh soft-cap score_mod whose cap is a captured
0-d tensor (a runtime scalar). The two runs see the same weights and batches; their losses fall
together, equal to bf16 rounding.
"""
import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import flex_attention as torch_flex_module

import fajit.torch as fajit_flex_module

SOFTCAP = torch.tensor(30.0)


def softcap(score, b, h, q_idx, kv_idx):
    return SOFTCAP * torch.tanh(score / SOFTCAP)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


class Block(nn.Module):
    def __init__(self, d, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        B, L, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), score_mod=softcap, block_mask=mask)
        x = x + self.proj(a.float().transpose(1, 2).reshape(B, L, D))
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, vocab, d, heads, layers, attention):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, attention) for _ in range(layers))
        self.out = nn.Linear(d, vocab)

    def forward(self, tokens, mask):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, mask)
        return self.out(x)


def train(model, batches, mask, steps, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        tokens = batches[step % len(batches)]
        logits = model(tokens[:, :-1], mask)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    torch.manual_seed(0)
    vocab, d, heads, layers, B, L = 256, 256, 4, 2, 8, a.seq  # head dim 64
    # A learnable toy language: each sequence repeats a random 16-token motif.
    batches = [torch.randint(0, vocab, (B, 16), device="cuda").repeat(1, (L + 1) // 16 + 1)[:, :L + 1]
               for _ in range(4)]
    ref = Model(vocab, d, heads, layers, torch_flex_module.flex_attention).cuda()
    ours = copy.deepcopy(ref)
    for blk in ours.blocks:
        blk.attention = fajit_flex_module.flex_attention
    torch_mask = torch_flex_module.create_block_mask(causal, None, None, L, L, device="cuda")
    fajit_mask = fajit_flex_module.create_block_mask(causal, None, None, L, L, device="cuda")
    torch_losses = train(ref, batches, torch_mask, a.steps, 1e-3)
    fajit_losses = train(ours, batches, fajit_mask, a.steps, 1e-3)
    print(f"{'step':>4} {'torch flex':>12} {'fajit':>12} {'diff':>10}")
    for i, (t, f) in enumerate(zip(torch_losses, fajit_losses)):
        print(f"{i:>4} {t:>12.5f} {f:>12.5f} {f - t:>10.2e}")
    worst = max(abs(f - t) for t, f in zip(torch_losses, fajit_losses))
    print(f"max |loss difference| {worst:.3g}; loss {fajit_losses[0]:.3f} -> {fajit_losses[-1]:.3f}")
    assert fajit_losses[-1] < 0.7 * fajit_losses[0], "the loss did not fall"
    assert worst < 0.05 * fajit_losses[0], "fajit's losses drifted from torch's"


if __name__ == "__main__":
    main()
