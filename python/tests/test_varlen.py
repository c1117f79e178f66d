"""fajit.torch.flex_attention_varlen: ragged (packed) batches and paged KV caches, and the backward
of packed (and dense) layouts.

GPU tests: each sequence's output and LSE against a float64 reference of that sequence alone
(plain torch: softmax(Q K^T * scale + score_mod, masked -inf) V; a row with no key left gives 0
and an LSE of -inf), on random inputs, with the outputs' memory poisoned before the call; the
same K/V scattered over shuffled pages of a pool (page sizes 1, 16, 64) gives bit-identical
results; lengths 0 and 1; GQA; causal masks and score_mods reading the sequence index b; head
dims 64, 80, 128; fp16 and bf16; the decoding path (one or a few queries per sequence, dense
queries over a paged or padded cache). Backward: gradients of q, k, v and of a captured float
tensor against float64 autograd of the same per-sequence reference (rows in no sequence must be
0, with the gradients' memory poisoned first), with a loss that reads the LSE, GQA, dense queries
over packed keys and packed queries over dense keys, the empty batches, and a training step
inside torch.compile. Argument errors are checked without a GPU where the check comes before
anything touches the device. Skips, with the reason, without torch or GPU.
"""
import itertools
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: fajit.torch tests need it")

import fajit  # noqa: E402
import fajit.torch as ft  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: fajit.torch kernels need one")

DTYPES = [torch.float16, torch.bfloat16]
TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}  # max |error| / max(max |reference|, 1), as test_torch.py


# ---- helpers ----------------------------------------------------------------------------------

def _lens(rng, n, hi, mode):
    """n sequences' (query, key) lengths, random with the edge cases, shuffled. mode "same": equal
    (self-attention; a 0 and a 1); "more_keys": at least as many keys as queries (a sequence without
    queries, one query over many keys); "any": independent (also queries without any key). One
    sequence has `hi` queries, so the longest is past the decoding kernel's 64."""
    if mode == "same":
        pairs = [(0, 0), (1, 1), (hi, hi)]
    elif mode == "more_keys":
        pairs = [(0, rng.randint(1, hi)), (1, rng.randint(1, hi)), (1, 1), (hi, hi + rng.randint(0, hi))]
    else:
        pairs = [(0, rng.randint(1, hi)), (rng.randint(1, hi), 0), (1, 1), (hi, rng.randint(1, hi))]
    while len(pairs) < n:
        x = rng.randint(2, hi)
        pairs.append((x, x) if mode == "same" else (x, x + rng.randint(0, hi)) if mode == "more_keys"
                     else (x, rng.randint(1, hi)))
    rng.shuffle(pairs)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _offsets(lens, device="cuda"):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


def _randn(shape, dtype, g):
    return torch.randn(shape, device="cuda", dtype=dtype, generator=g)


def _paged(k, v, lens_k, page_size, rng):
    """Packed keys [total_k, Hkv, E] scattered over shuffled pages of pools [num_pages, page_size,
    Hkv, E] (3 pages never used; slots no sequence owns hold 1e4, loud if ever read) and the page
    table [B, max_pages] (-1 past each sequence's pages)."""
    pages = [(n + page_size - 1) // page_size for n in lens_k]
    num_pages = sum(pages) + 3
    perm = list(range(num_pages))
    rng.shuffle(perm)
    rows = []  # each sequence's pages
    page_of, slot_of = [], []  # each key's page and slot, in packed order
    first = 0
    for b, n in enumerate(lens_k):
        rows.append(perm[first:first + pages[b]])
        first += pages[b]
        page_of += [rows[b][j // page_size] for j in range(n)]
        slot_of += [j % page_size for j in range(n)]
    max_pages = max(max(pages), 1)
    table = torch.tensor([r + [-1] * (max_pages - len(r)) for r in rows], dtype=torch.int32, device=k.device)
    page_of = torch.tensor(page_of, dtype=torch.long, device=k.device)
    slot_of = torch.tensor(slot_of, dtype=torch.long, device=k.device)
    pools = []
    for t in (k, v):
        pool = torch.full((num_pages, page_size) + tuple(t.shape[1:]), 1e4, dtype=t.dtype, device=t.device)
        pool[page_of, slot_of] = t
        pools.append(pool)
    return pools[0], pools[1], table


def _reference(q, k, v, b, scale, score_mod=None, mask_mod=None):
    """Sequence b alone in float64: q [Lq, Hq, E], k [Lk, Hkv, E], v [Lk, Hkv, Ev] -> out [Lq, Hq, Ev],
    lse [Hq, Lq]; the mods see positions from 0 and b (evaluated on broadcast index tensors)."""
    Lq, Hq = q.shape[0], q.shape[1]
    Lk, Hkv, Ev = v.shape
    if Lk == 0:
        return (torch.zeros(Lq, Hq, Ev, dtype=torch.float64, device=q.device),
                torch.full((Hq, Lq), -math.inf, dtype=torch.float64, device=q.device))
    qd = q.double().transpose(0, 1)
    kd = k.double().transpose(0, 1).repeat_interleave(Hq // Hkv, dim=0)
    vd = v.double().transpose(0, 1).repeat_interleave(Hq // Hkv, dim=0)
    s = qd @ kd.transpose(1, 2) * scale  # [Hq, Lq, Lk]
    dev = q.device
    bi = torch.tensor(b, device=dev)
    h = torch.arange(Hq, device=dev).view(-1, 1, 1)
    qi = torch.arange(Lq, device=dev).view(1, -1, 1)
    ki = torch.arange(Lk, device=dev).view(1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, h, qi, ki).double()
    if mask_mod is not None:
        s = s.masked_fill(~torch.broadcast_to(mask_mod(bi, h, qi, ki), s.shape), -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(lse).unsqueeze(-1)
    p = torch.where(seen, torch.exp(s - torch.where(seen, lse.unsqueeze(-1), 0.0)), 0.0)
    return (p @ vd).transpose(0, 1), lse


def _close(a, b, what, tol):
    a, b = a.double(), b.double()
    if a.numel() == 0:
        return
    err = (a - b).abs().max().item()
    scale = max(b.abs().max().item(), 1.0)
    assert err <= tol * scale, f"{what}: max error {err:.4g} (scale {scale:.3g}, tol {tol})"


def _check(out, lse, ref, what, dtype):
    """out [Lq, Hq, Ev] and lse [Hq, Lq] of one sequence against its reference."""
    ref_out, ref_lse = ref
    assert not torch.isnan(out).any(), f"{what}: NaN in the output (a row left unwritten?)"
    _close(out, ref_out, f"{what}: out", TOL[dtype])
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: rows without keys must have lse -inf, others finite"
    assert bool((lse[~finite] == -math.inf).all()), f"{what}: lse of a row without keys must be -inf"
    _close(lse[finite], ref_lse[finite], f"{what}: lse", 1e-3)


def _run(q, k, v, *args, **kw):
    """flex_attention_varlen(..., return_lse=True) under no_grad, its outputs' memory poisoned first:
    blocks of their sizes filled with 0xFF bytes (NaN in fp16, bf16 and fp32) and freed just before,
    which the caching allocator hands to the call's outputs, so a row the kernels leave unwritten
    shows as NaN. (Free earlier outputs of the same size before calling, or they may be reused.)"""
    rows = q.numel() // q.shape[-1]
    poison = [torch.full((rows * v.shape[-1] * q.element_size(),), 0xFF, dtype=torch.uint8, device=q.device),
              torch.full((rows * 4,), 0xFF, dtype=torch.uint8, device=q.device)]
    del poison
    with torch.no_grad():
        return ft.flex_attention_varlen(q, k, v, *args, return_lse=True, **kw)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _mods(kind, lens_q, lens_k, gen):
    """(score_mod, mask_mod) of a case; the b-dependent ones capture per-sequence tensors."""
    B = len(lens_q)
    slopes = 0.02 + 0.1 * torch.rand(B, device="cuda", generator=gen)  # per sequence: proves b
    offset = torch.tensor([lk - lq for lq, lk in zip(lens_q, lens_k)], dtype=torch.int32, device="cuda")

    def slope_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[b] * (kv_idx - q_idx)

    def bottom_right_causal(b, h, q_idx, kv_idx):  # flash-attn's causal: the last query sees every key
        return q_idx + offset[b] >= kv_idx

    return {"none": (None, None), "causal": (None, causal), "slopes": (slope_bias, None),
            "bottom_right_slopes": (slope_bias, bottom_right_causal)}[kind]


def _block_mask(mask_mod, B, max_q, max_k):
    return ft.create_block_mask(mask_mod, B, None, max_q, max_k) if mask_mod is not None else None


# ---- argument errors before the device (torch, no GPU) ----------------------------------------

def _cpu(*shape, dtype=torch.bfloat16, **kw):
    return torch.zeros(*shape, dtype=dtype, **kw)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def test_bad_arguments_name_themselves_before_touching_a_device():
    f = ft.flex_attention_varlen
    q, k = _cpu(10, 4, 64), _cpu(12, 4, 64)
    cu_q, cu_k = _i32([0, 4, 10]), _i32([0, 5, 12])
    pool = _cpu(8, 16, 4, 64)
    table, lens = _i32([[0, 1], [2, 3]]), _i32([5, 12])
    with pytest.raises(TypeError, match="cu_seqlens_q must be a torch.Tensor, got list"):
        f(q, k, k, [0, 4, 10], cu_k, 8, 8)
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got NoneType"):
        f(q, k, None, cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="give cu_seqlens_q, cu_seqlens_k, page_table .* without any, use "
                                         "flex_attention"):
        f(_cpu(2, 4, 8, 64), _cpu(2, 4, 8, 64), _cpu(2, 4, 8, 64))
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32, got torch.int64"):
        f(q, k, k, cu_q.long(), cu_k, 8, 8)
    with pytest.raises(ValueError, match="seqlens_k must be int32, got torch.float32"):
        f(q, pool, pool, cu_q, None, 8, 32, seqlens_k=lens.float(), page_table=table)
    with pytest.raises(ValueError, match=r"cu_seqlens_k must have 1 dimension \[B\+1\], got shape \[1, 3\]"):
        f(q, k, k, cu_q, cu_k.view(1, 3), 8, 8)
    with pytest.raises(ValueError, match=r"page_table must have 2 dimensions \[B, max_pages\], got shape \[4\]"):
        f(q, pool, pool, cu_q, None, 8, 32, seqlens_k=lens, page_table=table.view(4))
    with pytest.raises(ValueError, match="cu_seqlens_k and page_table: keys are either packed or paged, give one"):
        f(q, pool, pool, cu_q, cu_k, 8, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_k and seqlens_k: packed keys take their counts from "
                                         "cu_seqlens_k, give one"):
        f(q, k, k, cu_q, cu_k, 8, 8, seqlens_k=lens)
    with pytest.raises(ValueError, match=r"page_table needs seqlens_k \(each sequence's key count\)"):
        f(q, pool, pool, cu_q, None, 8, 32, page_table=table)
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \[total_q, Hq, E\] \(cu_seqlens_q given"):
        f(_cpu(2, 4, 5, 64), k, k, cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match=r"query must have 4 dimensions \[B, Hq, L, E\] \(no cu_seqlens_q"):
        f(q, pool, pool, None, None, None, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match=r"key must have 4 dimensions \[num_pages, page_size, Hkv, E\] "
                                         r"\(page_table given"):
        f(q, k, k, cu_q, None, 8, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match=r"value must have 3 dimensions \[total_k, Hkv, Ev\] \(cu_seqlens_k given"):
        f(q, k, pool, cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="query must be float16 or bfloat16, got torch.float32"):
        f(q.float(), k, k, cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="query, key and value must have one dtype"):
        f(q, k.half(), k.half(), cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="query has 4 heads and key 2: pass enable_gqa=True"):
        f(q, _cpu(12, 2, 64), _cpu(12, 2, 64), cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="query has 4 heads and key 2: pass enable_gqa=True"):
        f(q, _cpu(8, 16, 2, 64), _cpu(8, 16, 2, 64), cu_q, None, 8, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match="value: fajit takes head dims that are multiples of 8 from 32 to 256, got 84"):
        f(q, k, _cpu(12, 4, 84), cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match=r"max_seqlen_q is required with cu_seqlens_q: the most queries of any "
                                         r"sequence"):
        f(q, k, k, cu_q, cu_k, None, 8)
    with pytest.raises(ValueError, match="max_seqlen_k is required with page_table: the most keys"):
        f(q, pool, pool, cu_q, None, 8, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match="max_seqlen_k is required with cu_seqlens_k"):
        f(q, k, k, cu_q, cu_k, 8)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got float"):
        f(q, k, k, cu_q, cu_k, 8.0, 8)
    with pytest.raises(ValueError, match="max_seqlen_k must be >= 0, got -1"):
        f(q, k, k, cu_q, cu_k, 8, -1)
    with pytest.raises(ValueError, match=r"max_seqlen_q: dense queries hold 1 per sequence \(dimension 2\), got "
                                         r"max_seqlen_q=4; leave it None"):
        f(_cpu(2, 4, 1, 64), pool, pool, None, None, 4, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(ValueError, match="scale must be a positive finite number, got -1.0"):
        f(q, k, k, cu_q, cu_k, 8, 8, scale=-1.0)
    with pytest.raises(ValueError, match="path must be 'auto', 'prefill' or 'decode', got 'fast'"):
        f(q, k, k, cu_q, cu_k, 8, 8, path="fast")
    with pytest.raises(ValueError, match="decode_splits must be >= 0, got -2"):
        f(q, k, k, cu_q, cu_k, 8, 8, decode_splits=-2)
    # valid but on the CPU: the device is checked last
    with pytest.raises(ValueError, match="query must be a CUDA tensor, got one on cpu"):
        f(q, k, k, cu_q, cu_k, 8, 8)
    with pytest.raises(ValueError, match="query must be a CUDA tensor, got one on cpu"):
        f(_cpu(2, 4, 1, 64), pool, pool, None, None, None, 32, seqlens_k=lens, page_table=table)


def test_grad_is_refused_over_paged_and_padded_caches_only():
    """Paged and padded keys are inference layouts (the library has no backward for them): with
    grad mode on, an input that requires grad is refused naming the table. Packed and dense
    layouts train: the same inputs go on to the device check."""
    f = ft.flex_attention_varlen
    q, k = _cpu(10, 4, 64, requires_grad=True), _cpu(12, 4, 64)
    cu_q, cu_k = _i32([0, 4, 10]), _i32([0, 5, 12])
    pool, table, lens = _cpu(8, 16, 4, 64), _i32([[0, 1], [2, 3]]), _i32([5, 12])
    with pytest.raises(NotImplementedError, match=r"flex_attention_varlen: query requires grad with grad mode on, "
                                                  r"but page_table makes the keys a paged KV cache, an inference "
                                                  r"layout with no backward \(the backward takes packed "
                                                  r"\(cu_seqlens\) or dense layouts\).*torch.no_grad\(\)"):
        f(q, pool, pool, cu_q, None, 8, 32, seqlens_k=lens, page_table=table)
    with pytest.raises(NotImplementedError, match="value requires grad with grad mode on, but page_table"):
        f(q.detach(), pool, pool.clone().requires_grad_(), cu_q, None, 8, 32, seqlens_k=lens, page_table=table)
    dense_q, dense_k = _cpu(2, 4, 3, 64), _cpu(2, 4, 16, 64, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"key requires grad with grad mode on, but seqlens_k makes the "
                                                  r"keys a padded KV cache.*packed \(cu_seqlens\) or dense"):
        f(dense_q, dense_k, dense_k.detach(), seqlens_k=lens)
    for layout in ((q, k, k, cu_q, cu_k, 8, 8), (q, _cpu(2, 4, 6, 64), _cpu(2, 4, 6, 64), cu_q, None, 8),
                   (_cpu(2, 4, 5, 64, requires_grad=True), k, k, None, cu_k, None, 8)):
        with pytest.raises(ValueError, match="query must be a CUDA tensor"):  # packed / dense: on to the device
            f(*layout)
    with torch.no_grad():  # past the grad check: on to the device check
        with pytest.raises(ValueError, match="query must be a CUDA tensor"):
            f(q, pool, pool, cu_q, None, 8, 32, seqlens_k=lens, page_table=table)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="query must be a CUDA tensor"):
            f(dense_q, dense_k.detach(), dense_k.detach(), seqlens_k=lens)


def test_the_reference_of_this_file():
    """_reference on the CPU: softmax attention, GQA, -inf masking, rows without keys (no GPU)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((5, 4, 8), (7, 2, 8), (7, 2, 8)))
    out, lse = _reference(q, k, v, 0, 0.5, mask_mod=causal)
    kk = k.repeat_interleave(2, dim=1)
    vv = v.repeat_interleave(2, dim=1)
    for h in range(4):
        for i in range(5):
            s = (q[i, h] @ kk[: i + 1, h].T) * 0.5
            assert torch.allclose(lse[h, i], torch.logsumexp(s, 0))
            assert torch.allclose(out[i, h], torch.softmax(s, 0) @ vv[: i + 1, h])
    out, lse = _reference(q, k, v, 0, 0.5, mask_mod=lambda b, h, q_idx, kv_idx: q_idx > kv_idx + 100)
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
    out, lse = _reference(q, k[:0], v[:0], 0, 0.5)
    assert out.shape == (5, 4, 8) and bool((out == 0).all()) and bool((lse == -math.inf).all())


def test_the_training_reference_of_this_file():
    """_train_reference on the CPU: per-sequence float64 gradients equal autograd of plain causal
    softmax attention; rows without keys (none, or all masked) and rows in no sequence get 0, not
    NaN (no GPU)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((9, 4, 8), (8, 2, 8), (8, 2, 8)))
    cu_q, cu_k = [1, 5, 5, 8], [0, 6, 6, 6]  # row 0 and 8 in no sequence; sequence 2 has no keys
    w, wl = torch.randn(9, 4, 8, generator=g, dtype=torch.float64), torch.randn(4, 9, generator=g, dtype=torch.float64)

    def loss_of(out, lse, rows):
        return (out * w[rows]).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * wl[:, rows]).sum()

    dq, dk, dv = _train_reference(q, k, v, cu_q, cu_k, 3, 0.5, None, causal, loss_of)
    qs, ks, vs = (t.clone().requires_grad_() for t in (q[1:5], k[:6], v[:6]))
    s = torch.einsum("qhe,khe->hqk", qs, ks.repeat_interleave(2, dim=1)) * 0.5
    s = s.masked_fill(torch.arange(4)[:, None] < torch.arange(6)[None, :], -math.inf)
    out = torch.einsum("hqk,khe->qhe", torch.softmax(s, -1), vs.repeat_interleave(2, dim=1))
    loss_of(out, torch.logsumexp(s, -1), slice(1, 5)).backward()
    assert torch.allclose(dq[1:5], qs.grad) and torch.allclose(dk[:6], ks.grad) and torch.allclose(dv[:6], vs.grad)
    assert not any(torch.isnan(t).any() for t in (dq, dk, dv))
    assert bool((dq[0] == 0).all() and (dq[5:] == 0).all() and (dk[6:] == 0).all())

    def never(b, h, q_idx, kv_idx):  # every row without a key
        return q_idx > kv_idx + 100

    dq, dk, dv = _train_reference(q, k, v, cu_q, cu_k, 3, 0.5, None, never, loss_of)
    assert all(bool((t == 0).all()) for t in (dq, dk, dv))


# ---- GPU: packed and paged against the reference --------------------------------------------

# (name, Hq, Hkv, E, sequences, longest, lengths mode, mods, scale)
CASES = [
    ("causal_gqa_d128", 8, 2, 128, 6, 300, "same", "causal", None),
    ("bottom_right_causal_slopes_d64", 4, 4, 64, 6, 200, "more_keys", "bottom_right_slopes", None),
    ("slopes_gqa_d80_scale", 8, 2, 80, 5, 260, "any", "slopes", 0.2),
    ("none_gqa_d64", 8, 2, 64, 7, 150, "any", "none", None),
]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_packed_and_paged_match_the_reference(case, dtype):
    name, Hq, Hkv, E, n, hi, mode, mods, scale = case
    seed = sum(map(ord, name)) + (dtype == torch.bfloat16)
    rng, g = random.Random(seed), torch.Generator(device="cuda").manual_seed(seed)
    lens_q, lens_k = _lens(rng, n, hi, mode)
    B, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    q = _randn((sum(lens_q), Hq, E), dtype, g)
    k, v = _randn((sum(lens_k), Hkv, E), dtype, g), _randn((sum(lens_k), Hkv, E), dtype, g)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    score_mod, mask_mod = _mods(mods, lens_q, lens_k, g)
    kw = dict(score_mod=score_mod, block_mask=_block_mask(mask_mod, B, max_q, max_k), scale=scale,
              enable_gqa=Hq != Hkv)
    out, lse = _run(q, k, v, cu_q, cu_k, max_q, max_k, **kw)
    assert out.shape == (sum(lens_q), Hq, E) and out.dtype == dtype
    assert lse.shape == (Hq, sum(lens_q)) and lse.dtype == torch.float32
    sm = scale if scale is not None else 1.0 / math.sqrt(E)
    oq, ok = cu_q.tolist(), cu_k.tolist()
    for b in range(B):
        rows, keys = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b + 1])
        ref = _reference(q[rows], k[keys], v[keys], b, sm, score_mod, mask_mod)
        _check(out[rows], lse[:, rows], ref, f"{name} seq {b} ({lens_q[b]}x{lens_k[b]})", dtype)
    # the same keys in shuffled pages: bit for bit
    seqlens_k = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    for page_size in (1, 16, 64):
        kp, vp, table = _paged(k, v, lens_k, page_size, rng)
        out_p, lse_p = _run(q, kp, vp, cu_q, None, max_q, max_k, seqlens_k=seqlens_k, page_table=table,
                            check_tables=True, **kw)
        assert torch.equal(out_p, out), f"page size {page_size}: paged output differs from packed"
        assert torch.equal(lse_p, lse), f"page size {page_size}: paged LSE differs from packed"
        del out_p, lse_p


def _reference_max(q, k, b, scale, score_mod=None, mask_mod=None):
    """Sequence b's rows' largest modded scores [Hq, Lq] in float64 (-inf: no key left)."""
    Lq, Hq, Lk, Hkv = q.shape[0], q.shape[1], k.shape[0], k.shape[1]
    if Lk == 0:
        return torch.full((Hq, Lq), -math.inf, dtype=torch.float64, device=q.device)
    s = q.double().transpose(0, 1) @ k.double().transpose(0, 1).repeat_interleave(Hq // Hkv, 0).transpose(1, 2)
    s = s * scale
    dev = q.device
    bi, h = torch.tensor(b, device=dev), torch.arange(Hq, device=dev).view(-1, 1, 1)
    qi, ki = torch.arange(Lq, device=dev).view(1, -1, 1), torch.arange(Lk, device=dev).view(1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, h, qi, ki).double()
    if mask_mod is not None:
        s = s.masked_fill(~torch.broadcast_to(mask_mod(bi, h, qi, ki), s.shape), -math.inf)
    return s.amax(dim=-1)


@needs_gpu
@pytest.mark.parametrize("case", ["prefill", "decode"])
def test_return_aux_max_scores_packed_and_paged(case):
    """return_aux=AuxRequest(lse=True, max_scores=True): each row's largest modded score [Hq,
    total_q] against float64 per sequence (-inf for sequences without keys), the LSE and out the
    same bits as return_lse's, paged = packed bit for bit; through autograd (no gradient for the
    maxima, out's flows)."""
    dtype, Hq, Hkv, E = torch.bfloat16, 8, 2, 64
    rng, g = random.Random(7), torch.Generator(device="cuda").manual_seed(7)
    lens_q, lens_k = ([5, 300, 0, 1, 77], [9, 300, 12, 0, 400]) if case == "prefill" else ([1, 3, 1, 2], [700, 64, 0,
                                                                                                           1500])
    B, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    q = _randn((sum(lens_q), Hq, E), dtype, g).requires_grad_()
    k, v = _randn((sum(lens_k), Hkv, E), dtype, g), _randn((sum(lens_k), Hkv, E), dtype, g)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    score_mod, mask_mod = _mods("bottom_right_slopes", lens_q, lens_k, g)
    kw = dict(score_mod=score_mod, block_mask=_block_mask(mask_mod, B, max_q, max_k), enable_gqa=True)
    out, aux = ft.flex_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                                        return_aux=ft.AuxRequest(lse=True, max_scores=True), **kw)
    mx = aux.max_scores
    assert mx.shape == (Hq, sum(lens_q)) and mx.dtype == torch.float32 and not mx.requires_grad
    with torch.no_grad():
        out_l, lse_l = ft.flex_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True, **kw)
    assert torch.equal(out, out_l) and torch.equal(aux.lse, lse_l)
    oq, ok = cu_q.tolist(), cu_k.tolist()
    sm = 1.0 / math.sqrt(E)
    for b in range(B):
        rows, keys = slice(oq[b], oq[b + 1]), slice(ok[b], ok[b + 1])
        want, got = _reference_max(q[rows].detach(), k[keys], b, sm, score_mod, mask_mod), mx[:, rows].double()
        inf = torch.isinf(want)
        assert torch.equal(torch.isinf(got), inf) and bool((got[inf] == want[inf]).all()), f"seq {b}: -inf rows"
        if (~inf).any():
            err = (got[~inf] - want[~inf]).abs().max().item()
            assert err < 2e-2, f"seq {b}: max_scores off by {err:.3g}"
    seqlens_k = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    kp, vp, table = _paged(k, v, lens_k, 16, rng)
    with torch.no_grad():
        _, aux_p = ft.flex_attention_varlen(q, kp, vp, cu_q, None, max_q, max_k, seqlens_k=seqlens_k,
                                            page_table=table, return_aux=ft.AuxRequest(max_scores=True), **kw)
    assert aux_p.lse is None and torch.equal(aux_p.max_scores, mx), "paged max_scores differ from packed"
    # inside torch.compile (the op's fake implementation gives the third output its shape)
    compiled = torch.compile(ft.flex_attention_varlen, fullgraph=True)
    with torch.no_grad():
        out_c, aux_c = compiled(q, k, v, cu_q, cu_k, max_q, max_k, return_aux=ft.AuxRequest(max_scores=True), **kw)
    assert torch.equal(out_c, out) and torch.equal(aux_c.max_scores, mx), "compiled max_scores differ from eager"
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("path,splits", [("auto", 0), ("decode", 3), ("prefill", 0)])
def test_one_packed_query_per_sequence(dtype, path, splits):
    """vLLM's decode: cu_seqlens_q = 0..B, max_seqlen_q = 1, keys in pages; a per-sequence score_mod."""
    Hq, Hkv, E, B = 8, 2, 64, 9
    rng, g = random.Random(7), torch.Generator(device="cuda").manual_seed(7)
    lens_k = [0, 1, 3000] + [rng.randint(1, 1500) for _ in range(B - 3)]
    rng.shuffle(lens_k)
    max_k = max(lens_k)
    q = _randn((B, Hq, E), dtype, g)
    k, v = _randn((sum(lens_k), Hkv, E), dtype, g), _randn((sum(lens_k), Hkv, E), dtype, g)
    score_mod, _ = _mods("slopes", [1] * B, lens_k, g)
    cu_q, cu_k = _offsets([1] * B), _offsets(lens_k)
    seqlens_k = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    kp, vp, table = _paged(k, v, lens_k, 16, rng)
    kw = dict(score_mod=score_mod, enable_gqa=True, path=path, decode_splits=splits)
    out, lse = _run(q, kp, vp, cu_q, None, 1, max_k, seqlens_k=seqlens_k, page_table=table, **kw)
    ok = cu_k.tolist()
    for b in range(B):
        ref = _reference(q[b:b + 1], k[ok[b]:ok[b + 1]], v[ok[b]:ok[b + 1]], b, 1 / math.sqrt(E), score_mod)
        _check(out[b:b + 1], lse[:, b:b + 1], ref, f"{path} seq {b} (1x{lens_k[b]})", dtype)
    out_k, lse_k = _run(q, k, v, cu_q, cu_k, 1, max_k, **kw)
    if splits:  # same kernel arithmetic and the same split of the KV walk
        assert torch.equal(out_k, out) and torch.equal(lse_k, lse), "packed keys differ from paged ones"
    else:
        _close(out_k, out, "packed keys vs paged", TOL[dtype])


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("Lq", [1, 4])
def test_dense_queries_over_a_kv_cache(dtype, Lq):
    """flash_attn_with_kvcache's layout: q [B, Hq, Lq, E] dense over a paged cache (seqlens_k), over
    packed keys (bit for bit with paged at a fixed split) and over a padded dense cache [B, Hkv,
    S, E] (seqlens_k); Lq = 4 (speculative decoding) with a causal mask shifted by each sequence's
    key count (rows that see no key: 0 and -inf). Through the decoding and the prefill kernels."""
    Hq, Hkv, E, B = 32, 4, 128, 6
    rng, g = random.Random(20 + Lq), torch.Generator(device="cuda").manual_seed(20 + Lq)
    lens_k = [0, 1, 2, 5000] + [rng.randint(1, 2000) for _ in range(B - 4)]
    rng.shuffle(lens_k)
    max_k = max(lens_k)
    q = _randn((B, Hq, Lq, E), dtype, g)
    k, v = _randn((sum(lens_k), Hkv, E), dtype, g), _randn((sum(lens_k), Hkv, E), dtype, g)
    seqlens_k = torch.tensor(lens_k, dtype=torch.int32, device="cuda")
    _, mask_mod = _mods("bottom_right_slopes", [Lq] * B, lens_k, g) if Lq > 1 else (None, None)
    kw = dict(block_mask=_block_mask(mask_mod, B, Lq, max_k), enable_gqa=True)
    ok = _offsets(lens_k).tolist()

    def check(out, lse, what):
        assert out.shape == (B, Hq, Lq, E) and lse.shape == (B, Hq, Lq)
        for b in range(B):
            keys = slice(ok[b], ok[b + 1])
            ref = _reference(q[b].transpose(0, 1), k[keys], v[keys], b, 1 / math.sqrt(E), None, mask_mod)
            _check(out[b].transpose(0, 1), lse[b], ref, f"{what} seq {b} ({Lq}x{lens_k[b]})", dtype)

    kp, vp, table = _paged(k, v, lens_k, 16, rng)
    paged = dict(seqlens_k=seqlens_k, page_table=table, **kw)
    out, lse = _run(q, kp, vp, None, None, None, max_k, decode_splits=4, **paged)
    check(out, lse, "paged")
    out_k, lse_k = _run(q, k, v, None, _offsets(lens_k), None, max_k, decode_splits=4, **kw)
    assert torch.equal(out_k, out) and torch.equal(lse_k, lse), "packed keys differ from paged ones"
    del out_k, lse_k
    for path in ("auto", "prefill"):
        out_p, lse_p = _run(q, kp, vp, None, None, None, max_k, path=path, **paged)
        check(out_p, lse_p, f"paged, path {path}")
        del out_p, lse_p
    # a padded cache: keys past seqlens_k[b] hold 1e4 and are never read
    kd = torch.full((B, Hkv, max_k, E), 1e4, dtype=dtype, device="cuda")
    vd = torch.full((B, Hkv, max_k, E), 1e4, dtype=dtype, device="cuda")
    for b in range(B):
        kd[b, :, :lens_k[b]] = k[ok[b]:ok[b + 1]].transpose(0, 1)
        vd[b, :, :lens_k[b]] = v[ok[b]:ok[b + 1]].transpose(0, 1)
    out_d, lse_d = _run(q, kd, vd, seqlens_k=seqlens_k, **kw)
    check(out_d, lse_d, "padded dense cache")


@needs_gpu
def test_torch_block_mask_return_lse_false_and_torch_compile():
    """torch's BlockMask as the block_mask; out alone without return_lse; inside torch.compile
    (fullgraph), new lengths in tables of the same size recompile nothing."""
    import torch._dynamo.testing
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    Hq, E, dtype = 4, 64, torch.bfloat16
    rng, g = random.Random(3), torch.Generator(device="cuda").manual_seed(3)
    lens, _ = _lens(rng, 5, 200, "same")
    max_len = max(lens)
    q, k, v = (_randn((sum(lens), Hq, E), dtype, g) for _ in range(3))
    cu = _offsets(lens)
    mask = ft.create_block_mask(causal, None, None, max_len, max_len)
    tmask = torch_create_block_mask(causal, None, None, max_len, max_len, device="cuda")
    score_mod, _ = _mods("slopes", lens, lens, g)
    with torch.no_grad():
        out = ft.flex_attention_varlen(q, k, v, cu, cu, max_len, max_len, score_mod=score_mod, block_mask=mask)
        assert isinstance(out, torch.Tensor) and out.shape == q.shape
        out_t = ft.flex_attention_varlen(q, k, v, cu, cu, max_len, max_len, score_mod=score_mod, block_mask=tmask)
        _close(out_t, out, "torch's BlockMask", TOL[dtype])

        def attn(q, k, v, cu):
            return ft.flex_attention_varlen(q, k, v, cu, cu, max_len, max_len, score_mod=score_mod, block_mask=mask)

        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(attn, fullgraph=True, backend=counter)
        assert torch.equal(compiled(q, k, v, cu), out)
        lens2 = lens[1:] + lens[:1]  # the same total and longest, other sequences
        cu2 = _offsets(lens2)
        assert torch.equal(compiled(q, k, v, cu2), attn(q, k, v, cu2))
        assert counter.frame_count == 1, "new lengths recompiled the graph"


@needs_gpu
def test_empty_batches_give_empty_or_zero_outputs():
    """No query at all: empty outputs; no key at all: 0 and -inf (nothing reaches the library, which
    wants data pointers)."""
    q = _randn((5, 4, 64), torch.float16, torch.Generator(device="cuda").manual_seed(0))
    k = torch.zeros(0, 4, 64, dtype=torch.float16, device="cuda")
    out, lse = _run(q, k, k, _offsets([2, 3]), _offsets([0, 0]), 3, 0)
    assert bool((out == 0).all()) and bool((lse == -math.inf).all())
    out, lse = _run(q[:0], q, q, _offsets([0, 0]), _offsets([2, 3]), 0, 3)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)


@needs_gpu
def test_bad_gpu_inputs_name_the_argument():
    f = ft.flex_attention_varlen
    dev = torch.device("cuda", torch.cuda.current_device())
    q = torch.zeros(300, 4, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(500, 4, 64, dtype=torch.bfloat16, device="cuda")
    cu_q = _offsets([100, 100, 100])
    cu_k = _offsets([100, 200, 200])
    with pytest.raises(ValueError, match=rf"cu_seqlens_q must be on query's device \({dev}\), got cpu"):
        f(q, k, k, cu_q.cpu(), cu_k, 100, 200)
    with pytest.raises(ValueError, match="key must be a CUDA tensor, got one on cpu"):
        f(q, k.cpu(), k, cu_q, cu_k, 100, 200)
    mask = ft.create_block_mask(causal, None, None, 64, 200)
    with pytest.raises(ValueError, match="block_mask was created for Q_LEN=64, KV_LEN=200; the call has "
                                         "max_seqlen_q=100 and max_seqlen_k=200"):
        f(q, k, k, cu_q, cu_k, 100, 200, block_mask=mask)
    # the library's checks, as FajitError with its message
    with pytest.raises(fajit.FajitError, match=r"cu_seqlens_k: expected 4 entries \(B\+1, B = 3 from cu_seqlens_q\), "
                                               r"got 3"):
        f(q, k, k, cu_q, _offsets([100, 400]), 100, 400)
    with pytest.raises(fajit.FajitError, match="cu_seqlens_k: offsets must not decrease, got 300 then 200 at 2"):
        f(q, k, k, cu_q, torch.tensor([0, 300, 200, 500], dtype=torch.int32, device="cuda"), 100, 300,
          check_tables=True)
    with pytest.raises(fajit.FajitError, match=r"cu_seqlens_q: sequence 0 has 100 rows, more than max_seqlen_q "
                                               r"\(64\)"):
        f(q, k, k, cu_q, cu_k, 64, 200, check_tables=True)
    with pytest.raises(fajit.FajitError, match="path kDecode: the decoding kernel takes len_q <= 64"):
        f(q, k, k, cu_q, cu_k, 100, 200, path="decode")
    pool = torch.zeros(8, 16, 4, 64, dtype=torch.bfloat16, device="cuda")
    table = torch.tensor([[0, 1], [2, 3], [9, 4]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 10, 5], dtype=torch.int32, device="cuda")
    with pytest.raises(fajit.FajitError, match=r"page_table: entry \[2\]\[0\] = 9 is outside the pool's 8 pages"):
        f(q, pool, pool, cu_q, None, 100, 20, seqlens_k=lens, page_table=table, check_tables=True)
    with pytest.raises(fajit.FajitError, match=r"max_seqlen_k \(40\) exceeds the page table's capacity "
                                               r"\(2 pages of 16 keys\)"):
        f(q, pool, pool, cu_q, None, 100, 40, seqlens_k=lens, page_table=table)
    with pytest.raises(fajit.FajitError, match=r"q: B must match the tables' 3 \(from seqlens_k\), got 2"):
        f(torch.zeros(2, 4, 1, 64, dtype=torch.bfloat16, device="cuda"), pool, pool, None, None, None, 20,
          seqlens_k=lens, page_table=table)
    bias = torch.zeros(4, device="cuda", requires_grad=True)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    with pytest.raises(NotImplementedError, match="score_mod reads 'bias', which requires grad with grad mode on, "
                                                  "but page_table makes the keys a paged KV cache"):
        f(q, pool, pool, cu_q, None, 100, 20, seqlens_k=lens, page_table=table, score_mod=biased)


# ---- GPU: the backward of packed and dense layouts against float64 autograd -------------------

def _poison(*tensors):
    """Blocks of these tensors' sizes filled with 0xFF bytes (NaN) and freed: the caching allocator
    hands them to the next allocations of those sizes (the backward's gradients), so a row left
    unwritten and not zeroed shows as NaN."""
    blocks = [torch.full((t.numel() * t.element_size(),), 0xFF, dtype=torch.uint8, device=t.device) for t in tensors]
    del blocks


def _seq(t, rows):
    """A sequence's [L, H, D] (or lse [H, L]): rows = a slice of a packed tensor, or the index b of
    a dense one (transposed from [B, H, L, D] / [B, H, L])."""
    if isinstance(rows, slice):
        return t[rows] if t.dim() == 3 else t[:, rows]
    return t[rows].transpose(0, 1) if t.dim() == 4 else t[rows]


def _seq_rows(cu, b):
    """Sequence b's rows: a slice of offsets cu (a list), or b itself for a dense tensor (cu None)."""
    return slice(cu[b], cu[b + 1]) if cu is not None else b


def _train_reference(q, k, v, cu_q, cu_k, B, scale, make_mod, mask_mod, loss_of, leaves=()):
    """Float64 autograd of each sequence alone through _reference (make_mod(*leaves) is the
    score_mod, given float64 copies of the captured tensors `leaves`), the loss summed over
    sequences. Returns the gradients of q, k, v and of the leaves (0 where nothing reads them:
    rows in no sequence)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    l64 = [t.detach().double().requires_grad_() for t in leaves]
    mod = make_mod(*l64) if make_mod is not None else None
    total = 0
    for b in range(B):
        rq, rk = _seq_rows(cu_q, b), _seq_rows(cu_k, b)
        out, lse = _reference(_seq(q64, rq), _seq(k64, rk), _seq(v64, rk), b, scale, mod, mask_mod)
        total = total + loss_of(out, lse, rq)
    inputs = [q64, k64, v64, *l64]
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    return [g if g is not None else torch.zeros_like(t) for g, t in zip(grads, inputs)]


def _loss(out_shape, lse_shape, cu_q, g, use_out=True, use_lse=True):
    """A random loss of out and lse: loss_of(out, lse, rows) = sum(out * w) + sum(lse * wl) over
    the rows (all: slice(None); one sequence: _seq_rows), finite LSEs only (a row without keys has
    -inf and no gradient). Weights are 0 on rows in no sequence (packed: before cu_q[0], from
    cu_q[B] on), which the forward leaves unwritten."""
    w = torch.randn(out_shape, device="cuda", dtype=torch.float64, generator=g)
    wl = torch.randn(lse_shape, device="cuda", dtype=torch.float64, generator=g)
    if cu_q is not None:
        for lo, hi in ((0, cu_q[0]), (cu_q[-1], out_shape[0])):
            w[lo:hi], wl[:, lo:hi] = 0, 0

    def loss_of(out, lse, rows):
        total = 0
        if use_out:
            total = total + (out.double() * _seq(w, rows)).sum()
        if use_lse:
            total = total + (torch.where(torch.isfinite(lse), lse.double(), 0.0) * _seq(wl, rows)).sum()
        return total

    return loss_of


def _check_grads(got, ref, names, dtype):
    """Gradients against the float64 reference: q, k, v at test_torch.py's 3 * TOL, captured
    tensors at its dbias tolerance (5e-2); none NaN (a row left unwritten)."""
    for i, (name, a, b) in enumerate(zip(names, got, ref)):
        assert a is not None, f"{name}: no gradient"
        assert a.shape == b.shape, f"{name}: shape {list(a.shape)}, expected {list(b.shape)}"
        assert not torch.isnan(a).any(), f"{name}: NaN (a row left unwritten?)"
        _close(a, b, name, 3 * TOL[dtype] if i < 3 else 5e-2)


def _leaf(shape, dtype, g):
    return _randn(shape, dtype, g).requires_grad_()


def _rel_bias(max_k):
    """make_mod(table): score + table[h, q_idx - kv_idx + max_k - 1] (a relative bias; a table of
    [H, max_q + max_k - 1] covers every (q_idx, kv_idx) of a sequence, masked or not)."""
    def make(table):
        def rel_bias(score, b, h, q_idx, kv_idx):
            return score + table[h, q_idx - kv_idx + max_k - 1]
        return rel_bias
    return make


def _alibi(per_sequence=False):
    """make_mod(slopes): score + slopes[h] * (kv_idx - q_idx) (ALiBi), or slopes[b]: a slope per
    sequence, which proves the backward's b."""
    def make(slopes):
        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[b if per_sequence else h] * (kv_idx - q_idx)
        return alibi
    return make


# (name, Hq, Hkv, E, captured tensor: "rel_bias" [Hq, max_q + max_k - 1] or "alibi" slopes [Hq])
GRAD_CASES = [("causal_rel_bias_d64", 4, 4, 64, "rel_bias"), ("causal_gqa_alibi_d128", 8, 2, 128, "alibi")]


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_packed_gradients_match_the_reference(case, dtype):
    """Causal over packed queries and keys, gradients of q, k, v and of a captured float tensor:
    sequences of 0 and of 1 rows, one with keys but no queries, one with queries but no keys, and
    rows in no sequence before the first and after the last (their gradients must be 0)."""
    name, Hq, Hkv, E, captured = case
    seed = sum(map(ord, name)) + (dtype == torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens_q = [130, 0, 1, 0, 7, 200, 64]
    lens_k = [130, 20, 1, 0, 0, 200, 90]
    B, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    cu_q, cu_k = _offsets(lens_q) + 2, _offsets(lens_k) + 3  # 2 and 3 rows in no sequence first
    q = _leaf((sum(lens_q) + 5, Hq, E), dtype, g)
    k, v = _leaf((sum(lens_k) + 4, Hkv, E), dtype, g), _leaf((sum(lens_k) + 4, Hkv, E), dtype, g)
    if captured == "rel_bias":
        make = _rel_bias(max_k)
        buf = 0.3 * torch.randn(Hq, max_q + max_k - 1, device="cuda", generator=g)
    else:
        make = _alibi()
        buf = 0.02 + 0.1 * torch.rand(Hq, device="cuda", generator=g)
    buf.requires_grad_()
    oq, ok = cu_q.tolist(), cu_k.tolist()
    loss_of = _loss((q.shape[0], Hq, E), (Hq, q.shape[0]), oq, g)
    mask = ft.create_block_mask(causal, None, None, max_q, max_k)
    out, lse = ft.flex_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, score_mod=make(buf), block_mask=mask,
                                        enable_gqa=Hq != Hkv, return_lse=True)
    loss = loss_of(out, lse, slice(None))
    _poison(q, k, v)
    loss.backward()
    ref = _train_reference(q, k, v, oq, ok, B, 1 / math.sqrt(E), make, causal, loss_of, (buf,))
    _check_grads([q.grad, k.grad, v.grad, buf.grad], ref, ["dq", "dk", "dv", "d" + captured], dtype)
    for what, grad, cu in (("dq", q.grad, oq), ("dk", k.grad, ok), ("dv", v.grad, ok)):
        outside = torch.cat([grad[:cu[0]], grad[cu[-1]:]])
        assert bool((outside == 0).all()), f"{what}: rows in no sequence must be 0"


@needs_gpu
@pytest.mark.parametrize("loss", ["out", "lse", "both"])
def test_lse_in_the_loss(loss):
    """return_lse=True: a loss of out alone, of the LSE alone (out unused: no dO; dLSE reaches dq
    and dk) or of both, over packed GQA sequences (one without keys: lse -inf, no gradient)."""
    Hq, Hkv, E, dtype = 8, 2, 64, torch.float16
    g = torch.Generator(device="cuda").manual_seed(11)
    lens_q, lens_k = [150, 3, 1, 90], [150, 0, 40, 300]
    B, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    cu_q, cu_k = _offsets(lens_q), _offsets(lens_k)
    q = _leaf((sum(lens_q), Hq, E), dtype, g)
    k, v = _leaf((sum(lens_k), Hkv, E), dtype, g), _leaf((sum(lens_k), Hkv, E), dtype, g)
    oq, ok = cu_q.tolist(), cu_k.tolist()
    loss_of = _loss((q.shape[0], Hq, E), (Hq, q.shape[0]), oq, g, use_out=loss != "lse", use_lse=loss != "out")
    out, lse = ft.flex_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, enable_gqa=True, return_lse=True)
    loss_of(out, lse, slice(None)).backward()
    ref = _train_reference(q, k, v, oq, ok, B, 1 / math.sqrt(E), None, None, loss_of)
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q, k, v)]  # the LSE does not read v
    _check_grads(grads, ref, [f"{loss} dq", f"{loss} dk", f"{loss} dv"], dtype)


@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["dense_q_packed_k", "packed_q_dense_k"])
def test_dense_beside_packed_gradients_match_the_reference(layout, dtype):
    """Dense queries [B, Hq, L, E] over packed keys (sequences with no key and with one), and
    packed queries over dense keys [B, Hkv, S, E] (every key of a sequence is one; sequences with
    no query and with one); GQA; a slope per sequence (slopes[b]) that requires grad; the LSE in
    the loss."""
    Hq, Hkv, E = 8, 2, 64
    seed = sum(map(ord, layout)) + (dtype == torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = [0, 1, 170, 33, 96]
    B = len(lens)
    if layout == "dense_q_packed_k":
        L, S = 40, max(lens)
        cu_q, cu_k = None, _offsets(lens)
        q = _leaf((B, Hq, L, E), dtype, g)
        k, v = _leaf((sum(lens), Hkv, E), dtype, g), _leaf((sum(lens), Hkv, E), dtype, g)
        out_shape, lse_shape = (B, Hq, L, E), (B, Hq, L)
    else:
        L, S = max(lens), 120
        cu_q, cu_k = _offsets(lens), None
        q = _leaf((sum(lens), Hq, E), dtype, g)
        k, v = _leaf((B, Hkv, S, E), dtype, g), _leaf((B, Hkv, S, E), dtype, g)
        out_shape, lse_shape = (sum(lens), Hq, E), (Hq, sum(lens))
    oq, ok = (cu.tolist() if cu is not None else None for cu in (cu_q, cu_k))
    slopes = (0.02 + 0.1 * torch.rand(B, device="cuda", generator=g)).requires_grad_()
    make = _alibi(per_sequence=True)
    loss_of = _loss(out_shape, lse_shape, oq, g)
    out, lse = ft.flex_attention_varlen(q, k, v, cu_q, cu_k, L if cu_q is not None else None,
                                        S if cu_k is not None else None, score_mod=make(slopes), enable_gqa=True,
                                        return_lse=True)
    assert out.shape == out_shape and lse.shape == lse_shape
    _poison(q, k, v)
    loss_of(out, lse, slice(None)).backward()
    ref = _train_reference(q, k, v, oq, ok, B, 1 / math.sqrt(E), make, None, loss_of, (slopes,))
    _check_grads([q.grad, k.grad, v.grad, slopes.grad], ref, ["dq", "dk", "dv", "dslopes"], dtype)


@needs_gpu
def test_empty_batches_give_zero_gradients():
    """The calls the forward answers without the library (no key at all, no query at all): zero
    gradients of q, k, v and of a captured tensor, of the tensors' shapes."""
    g = torch.Generator(device="cuda").manual_seed(5)
    slopes = torch.full((4,), 0.1, device="cuda", requires_grad=True)
    alibi = _alibi()(slopes)
    q = _leaf((5, 4, 64), torch.float16, g)
    k = torch.zeros(0, 4, 64, dtype=torch.float16, device="cuda", requires_grad=True)
    v = torch.zeros(0, 4, 64, dtype=torch.float16, device="cuda", requires_grad=True)
    out, lse = ft.flex_attention_varlen(q, k, v, _offsets([2, 3]), _offsets([0, 0]), 3, 0, score_mod=alibi,
                                        return_lse=True)
    (out.float().sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
    for name, t in (("dq", q), ("dk", k), ("dv", v), ("dslopes", slopes)):
        assert t.grad is not None and t.grad.shape == t.shape and bool((t.grad == 0).all()), name
    q0 = torch.zeros(0, 4, 64, dtype=torch.float16, device="cuda", requires_grad=True)
    k, v = _leaf((5, 4, 64), torch.float16, g), _leaf((5, 4, 64), torch.float16, g)
    out = ft.flex_attention_varlen(q0, k, v, _offsets([0, 0]), _offsets([2, 3]), 0, 3)
    out.float().sum().backward()
    for name, t in (("dq", q0), ("dk", k), ("dv", v)):
        assert t.grad is not None and t.grad.shape == t.shape and bool((t.grad == 0).all()), name


@needs_gpu
def test_training_step_inside_torch_compile():
    """A packed training step (projection to q, k, v, causal attention with a learned ALiBi slope
    per head, a loss of out and LSE) inside torch.compile(fullgraph=True): the gradients of the
    weights and slopes are eager's (aot_eager: the custom ops' fake and autograd; inductor too),
    and new lengths in tables of the same size recompile nothing."""
    import torch._dynamo.testing

    Hq, Hkv, E, dim, dtype = 4, 2, 64, 128, torch.bfloat16
    rng, g = random.Random(9), torch.Generator(device="cuda").manual_seed(9)
    lens, _ = _lens(rng, 5, 200, "same")
    max_len, total = max(lens), sum(lens)
    x = _randn((total, dim), dtype, g)
    proj = torch.nn.Linear(dim, (Hq + 2 * Hkv) * E, bias=False, device="cuda", dtype=dtype)
    slopes = torch.nn.Parameter(0.02 + 0.1 * torch.rand(Hq, device="cuda", generator=g))
    alibi = _alibi()(slopes)
    mask = ft.create_block_mask(causal, None, None, max_len, max_len)
    w = torch.randn(total, Hq, E, device="cuda", generator=g)

    def step(x, cu):
        qkv = proj(x).view(total, Hq + 2 * Hkv, E)  # q, k, v: strided views of one projection
        q, k, v = qkv[:, :Hq], qkv[:, Hq:Hq + Hkv], qkv[:, Hq + Hkv:]
        out, lse = ft.flex_attention_varlen(q, k, v, cu, cu, max_len, max_len, score_mod=alibi, block_mask=mask,
                                            enable_gqa=True, return_lse=True)
        return (out.float() * w).sum() + lse.sum() * 1e-2

    def grads_of(f, cu):
        proj.weight.grad, slopes.grad = None, None
        loss = f(x, cu)
        loss.backward()
        return loss.detach(), proj.weight.grad.clone(), slopes.grad.clone()

    cu, cu2 = _offsets(lens), _offsets(lens[1:] + lens[:1])  # cu2: the same total and longest, other sequences
    eager, eager2 = grads_of(step, cu), grads_of(step, cu2)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    for what, f, c, ref in (("aot_eager", compiled, cu, eager), ("new lengths", compiled, cu2, eager2),
                            ("inductor", torch.compile(step, fullgraph=True), cu, eager)):
        for name, a, b in zip(("loss", "dweight", "dslopes"), grads_of(f, c), ref):
            _close(a, b, f"{what} {name}", 1e-2)
        if what == "new lengths":
            assert counter.frame_count == 1, "new lengths recompiled the graph"


@needs_gpu
def test_compiled_call_with_new_max_lengths():
    """One torch.compile'd caller taking max_seqlen_q / max_seqlen_k as arguments, called with a
    second pair of values: dynamo recompiles it with those ints made symbolic, which inductor
    could not bind once they reached only the op (NameError in its generated code); they are
    specialized instead, and both calls match eager."""
    Hq, Hkv, E, dtype = 4, 2, 64, torch.float16
    g = torch.Generator(device="cuda").manual_seed(21)

    def attend(q, k, v, cu_q, cu_k, max_q, max_k):
        return ft.flex_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, enable_gqa=True)

    compiled = torch.compile(attend, fullgraph=True)
    for lens_q, lens_k in (([3, 100, 7], [50, 100, 9]), ([1, 2], [700, 30]), ([40, 5, 0, 9], [40, 6, 3, 200])):
        q = _randn((sum(lens_q), Hq, E), dtype, g)
        k, v = _randn((sum(lens_k), Hkv, E), dtype, g), _randn((sum(lens_k), Hkv, E), dtype, g)
        args = (q, k, v, _offsets(lens_q), _offsets(lens_k), max(lens_q), max(lens_k))
        with torch.no_grad():
            assert torch.equal(compiled(*args), attend(*args)), f"lengths {lens_q} x {lens_k}"
