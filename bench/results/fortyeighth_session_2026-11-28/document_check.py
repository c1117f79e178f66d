# Which of fajit / flex is right on the train probe's 2-D document mask: both against SDPA math
# with the dense mask in fp32.
import sys, torch, torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
import fajit.torch as ft
flex = torch.compile(flex_attention, dynamic=False)
for B, H, S, D, grad in [(1, 2, 2048, 64, False), (2, 2, 2048, 64, True), (4, 16, 4096, 128, True), (1, 2, 1000, 64, False)]:
    g = torch.Generator(device="cuda").manual_seed(S)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=grad) for _ in range(3))
    cuts = torch.randint(1, S, (B, 6), generator=g, device="cuda")
    pos = torch.arange(S, device="cuda")
    doc = (pos[None, :, None] >= cuts[:, None, :]).sum(-1).to(torch.int32)
    def document(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)
    dense = (doc[:, :, None] == doc[:, None, :]) & (pos[:, None] >= pos[None, :])
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense[:, None])
    def err(o): return ((o.float() - ref).norm() / ref.norm()).item()
    res = {}
    for name, fn in [("fajit", lambda: ft.flex_attention(q, k, v, block_mask=ft.create_block_mask(document, B, None, S, S))),
                     ("fajit BH", lambda: ft.flex_attention(q, k, v, block_mask=ft.create_block_mask(document, B, H, S, S))),
                     ("fajit nomask-tables", lambda: ft.flex_attention(q, k, v, block_mask=ft.BlockMask.from_torch(create_block_mask(document, B, None, S, S, device="cuda")))),
                     ("flex", lambda: flex(q, k, v, block_mask=create_block_mask(document, B, None, S, S, device="cuda", _compile=True))),
                     ("flex eager-mask", lambda: flex(q, k, v, block_mask=create_block_mask(document, B, None, S, S, device="cuda")))]:
        try:
            res[name] = round(err(fn()), 4)
        except Exception as e:
            res[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    print((B, H, S, D, grad), res, flush=True)
