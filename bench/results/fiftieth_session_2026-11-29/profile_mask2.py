# Where fajit.torch.create_block_mask's host time goes (B4 S4096 document & causal): each piece
# timed by wrappers (perf_counter), 300 builds; then torch.inference_mode(False) alone.
import time, collections, torch
import fajit.torch as ft
B, S = 4, 4096
doc = torch.zeros(B, S, dtype=torch.int32, device="cuda")
def document(b, h, q_idx, kv_idx):
    return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)
acc = collections.Counter()
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t
    return w
for name in ("check_mod", "_variant_key", "_bind", "_ccaptures", "_mask_tables", "_expand_bh", "_stream",
             "_register_mask"):
    setattr(ft, name, timed(name, getattr(ft, name)))
ft.BlockMask.__init__ = timed("BlockMask.__init__", ft.BlockMask.__init__)
lib = ft._capi.lib()
for name in ("fajit_program_block_mask", "fajit_block_mask_copy_tables", "fajit_block_mask_get_info"):
    setattr(lib, name, timed(name, getattr(lib, name)))
for _ in range(10):
    ft.create_block_mask(document, B, None, S, S)
torch.cuda.synchronize()
acc.clear()
n = 300
t0 = time.perf_counter()
for _ in range(n):
    ft.create_block_mask(document, B, None, S, S)
total = time.perf_counter() - t0
torch.cuda.synchronize()
print(f"create_block_mask: {1e6 * total / n:.1f} us a call (host)")
for k, v in acc.most_common():
    print(f"  {k:32s} {1e6 * v / n:8.1f} us")
t0 = time.perf_counter()
for _ in range(1000):
    with torch.inference_mode(False):
        pass
print(f"inference_mode(False) enter+exit: {1e3 * (time.perf_counter() - t0):.1f} us")
t0 = time.perf_counter()
for _ in range(1000):
    torch.empty(100000, dtype=torch.int32, device="cuda")
print(f"torch.empty cuda: {1e3 * (time.perf_counter() - t0):.1f} us")
