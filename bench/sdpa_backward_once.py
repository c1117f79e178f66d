#!/usr/bin/env python3
"""Three forward+backward passes of SDPA on its cuDNN backend, bf16 B=4 H=16 S=4096 (head dim from
argv, default 128; `causal` after it for a causal mask): a program for Nsight Compute to profile
cuDNN's backward kernels (bench/ncu_profile.sh backward; bench/ncu_source.sh NAME bprop --cmd
python3 bench/sdpa_backward_once.py 128)."""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
for _ in range(3):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()
torch.cuda.synchronize()
