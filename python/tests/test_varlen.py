"""fajit.torch.flex_attention_varlen: ragged (packed) batches and paged KV caches, forward only.

GPU tests: each sequence's output and LSE against a float64 reference of that sequence alone
(plain torch: softmax(Q K^T * scale + score_mod, masked -inf) V; a row with no key left gives 0
and an LSE of -inf), on random inputs, with the outputs' memory poisoned before the call; the
same K/V scattered over shuffled pages of a pool (page sizes 1, 16, 64) gives bit-identical
results; lengths 0 and 1; GQA; causal masks and score_mods reading the sequence index b; head
dims 64, 80, 128; fp16 and bf16; the decoding path (one or a few queries per sequence, dense
queries over a paged or padded cache). Argument errors are checked without a GPU where the
check comes before anything touches the device. Skips, with the reason, without torch or GPU.
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


def test_inputs_that_require_grad_are_refused_with_grad_mode_on():
    f = ft.flex_attention_varlen
    q, k = _cpu(10, 4, 64, requires_grad=True), _cpu(12, 4, 64)
    cu_q, cu_k = _i32([0, 4, 10]), _i32([0, 5, 12])
    with pytest.raises(NotImplementedError, match=r"flex_attention_varlen: query requires grad with grad mode on, "
                                                  r"but ragged / paged layouts are forward only .*torch.no_grad\(\)"):
        f(q, k, k, cu_q, cu_k, 8, 8)
    with pytest.raises(NotImplementedError, match="value requires grad"):
        f(q.detach(), k, k.clone().requires_grad_(), cu_q, cu_k, 8, 8)
    with torch.no_grad():  # past the grad check: on to the device check
        with pytest.raises(ValueError, match="query must be a CUDA tensor"):
            f(q, k, k, cu_q, cu_k, 8, 8)
    with torch.inference_mode():
        with pytest.raises(ValueError, match="query must be a CUDA tensor"):
            f(q.detach(), k, k, cu_q, cu_k, 8, 8)


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

    with pytest.raises(NotImplementedError, match="score_mod reads 'bias', which requires grad"):
        f(q, k, k, cu_q, cu_k, 100, 200, score_mod=biased)
