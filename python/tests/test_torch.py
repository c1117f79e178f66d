"""fajit.torch against torch.nn.attention.flex_attention (forward, LSE, gradients of q, k, v
and captured tensors; fp16/bf16; GQA; odd lengths; torch.compile(fullgraph=True); runtime
scalars). Skips, with the reason, without torch or without a GPU."""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: fajit.torch tests need it")

import fajit  # noqa: E402

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: fajit.torch kernels need one")

# ---- tracing torch-style mods (torch, no GPU) -------------------------------------------------


def structure(ir):
    from test_trace import structure as s
    return s(ir)


def test_torch_style_mods_trace_to_the_cpp_library_ir():
    doc_ids = torch.zeros(64, dtype=torch.int32)
    rel_bias = torch.zeros(127)
    rel_offset = torch.tensor(63)
    softcap = torch.tensor(30.0)
    num_heads = torch.tensor(16)

    def document(b, h, q_idx, kv_idx):
        return doc_ids[q_idx] == doc_ids[kv_idx]

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + rel_bias[q_idx - kv_idx + rel_offset]

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + torch.exp2(-8.0 * (h + 1) / num_heads) * (kv_idx - q_idx)

    assert structure(fajit.mlir(mask_mod=document)) == structure(fajit.preset_mlir(mask="document"))
    assert structure(fajit.mlir(relative_bias)) == structure(fajit.preset_mlir(score="relative_bias"))
    assert structure(fajit.mlir(softcap_mod)) == structure(
        fajit.preset_mlir(score="softcap:30").replace("@softcap", "@softcap_mod"))
    assert structure(fajit.mlir(alibi)) == structure(fajit.preset_mlir(score="alibi"))


def test_torch_functions_trace():
    bias = torch.zeros(4, 64)

    def mix(score, b, h, q_idx, kv_idx):
        s = torch.where(q_idx >= kv_idx, torch.sigmoid(score), torch.clamp(score, min=-1.0, max=1.0))
        s = s + torch.maximum(q_idx, kv_idx).float() + (q_idx // 3 % 2).to(torch.float32)
        return s + torch.abs(bias[h, q_idx]) + torch.log(torch.sqrt(torch.exp(score))) + torch.minimum(score, s)

    ir = fajit.mlir(mix)
    for op in ("arith.select", "arith.maximumf", "arith.maxsi", "arith.floordivsi", "math.absf", "math.log",
               "fa.load %bias[%h, %q] : !fa.buffer<f32, 2>"):
        assert op in ir, op


def test_arithmetic_on_a_captured_scalar_is_traced_not_computed():
    cap = torch.tensor(3.0)

    def doubled(score, b, h, q_idx, kv_idx):
        return score * (cap * 2)

    ir = fajit.mlir(doubled)
    assert 'fa.scalar "cap" : f32' in ir and ir.count("arith.mulf") == 2, ir


SOFTCAP = 30.0


def test_a_changed_python_constant_a_mod_reads_traces_again():
    """Python numbers the mods read (globals, closure cells, a method's self attributes, a
    config object's attributes, defaults) are baked into the trace as constants: fajit.torch
    traces again when one changes, and keeps the variant while none does."""
    import types

    import fajit.torch as ft

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    def text(score_mod, mask_mod):
        return ft._VARIANTS[ft._variant_key(score_mod, mask_mod)].text

    global SOFTCAP
    first = text(softcap, None)
    assert text(softcap, None) == first
    SOFTCAP = 50.0
    try:
        assert text(softcap, None) != first
    finally:
        SOFTCAP = 30.0
    assert text(softcap, None) == first

    class Sliding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.window = 256

        def mask(self, b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < self.window)

    m = Sliding()
    before = text(None, m.mask)
    m.window = 64
    assert text(None, m.mask) != before

    cfg = types.SimpleNamespace(window=100)

    def configured(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < cfg.window

    before = text(None, configured)
    cfg.window = 200
    assert text(None, configured) != before

    def with_default(b, h, q_idx, kv_idx, w=8):
        return q_idx - kv_idx < w

    before = text(None, with_default)
    with_default.__defaults__ = (9,)
    assert text(None, with_default) != before

    # inside torch.compile the variant is a constant of the graph: the mods' dry run on zeros
    # makes dynamo guard on what they read, so a changed value recompiles (as torch's flex does)
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def guarded(x):
        ft._guard_mods(softcap, m.mask, x.device)
        return x + 1

    x = torch.ones(3)
    guarded(x)
    guarded(x)
    assert len(compiles) == 1
    SOFTCAP = 40.0
    try:
        guarded(x)
    finally:
        SOFTCAP = 30.0
    m.window = 32
    guarded(x)
    assert len(compiles) == 3

    # the dry run indexes captured tensors as torch's flex does (no .item(), so fullgraph holds),
    # and a mod torch cannot run (fajit's own helpers) is left to fajit's tracer
    bias, doc = torch.rand(64), torch.zeros(64, dtype=torch.int32)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[kv_idx]

    def documents(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def helper(score, b, h, q_idx, kv_idx):
        return fajit.tanh(score)

    for score_mod, mask_mod in ((biased, documents), (helper, None)):
        torch._dynamo.reset()
        dry = torch.compile(lambda x: (ft._guard_mods(score_mod, mask_mod, x.device), x + 1)[1], backend="aot_eager",
                            fullgraph=True)
        assert torch.equal(dry(x), x + 1)


def test_a_captured_0d_tensor_off_the_cpu_is_a_buffer_read_at_0():
    """A 0-d tensor on a device (here torch's meta device, no GPU needed) is read there as a
    one-element buffer, never copied to the host; a CPU one stays a runtime scalar."""
    cap = torch.tensor(8.0, device="meta")
    shift = torch.tensor(3, device="meta", dtype=torch.int32)
    host = torch.tensor(2.0)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap) * host

    def shifted(b, h, q_idx, kv_idx):
        return q_idx + shift >= kv_idx

    ir = fajit.mlir(softcap, shifted)
    assert "fa.load %cap[" in ir and "!fa.buffer<f32, 1>" in ir and "fa.load %shift[" in ir, ir
    assert 'fa.scalar "host" : f32' in ir and "fa.scalar \"cap\"" not in ir, ir


def test_torchs_own_and_or_masks_trace():
    from torch.nn.attention.flex_attention import and_masks, or_masks

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def near(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < 64

    ir = fajit.mlir(mask_mod=and_masks(causal, near))
    assert "arith.andi" in ir and "arith.cmpi sge, %q, %kv" in ir
    assert "arith.ori" in fajit.mlir(mask_mod=or_masks(causal, near))


def test_torchs_noop_mask_and_tensor_attributes_trace():
    """torch's noop_mask (b.new_ones(..., device=b.device)), .dtype, masked_fill and clamp_min
    trace; an attribute fajit cannot trace is a TraceError naming it and the line."""
    from torch.nn.attention.flex_attention import and_masks, noop_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    assert "arith.constant true" in fajit.mlir(mask_mod=noop_mask)
    assert "arith.cmpi sge, %q, %kv" in fajit.mlir(mask_mod=and_masks(causal, noop_mask))

    def filled(score, b, h, q_idx, kv_idx):
        return score.masked_fill(q_idx < kv_idx, -1e9).clamp_min(-100.0).to(score.dtype)

    assert "arith.select" in fajit.mlir(filled)

    def item(score, b, h, q_idx, kv_idx):
        return score.item()

    with pytest.raises(fajit.TraceError, match=r"`\.item` of a traced value.*test_torch.py"):
        fajit.mlir(item)


def test_unsupported_torch_function_names_itself_and_the_line():
    def bad(score, b, h, q_idx, kv_idx):
        return torch.cumsum(score, 0)

    with pytest.raises(fajit.TraceError, match=r"score_mod 'bad': torch.cumsum is not supported on traced values"
                                               r".*\(at test_torch.py:\d+: return torch.cumsum\(score, 0\)\)"):
        fajit.mlir(bad)


def test_bad_inputs_name_the_argument():
    import fajit.torch as ft

    q = torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query must be a CUDA tensor, got one on cpu"):
        ft.flex_attention(q, q, q)
    with pytest.raises(TypeError, match="key must be a torch.Tensor, got list"):
        ft.flex_attention(q, [1], q)

    def f(a, b):
        return a

    with pytest.raises(TypeError, match=r"mask_mod must take 4 arguments \(b, h, q_idx, kv_idx\); f takes 2"):
        ft.create_block_mask(f, 1, 1, 128, 128)
    # create_block_mask's sizes, checked before any GPU work (torch's types: ints, integer-likes, a
    # BLOCK_SIZE int or pair as a tuple or list)
    for bad, message in (((128, 64, 32), "BLOCK_SIZE must be a positive multiple of 16 or a pair"),
                         (0, "BLOCK_SIZE"), ("128", "BLOCK_SIZE"), ([128, 100], "BLOCK_SIZE"), (128.0, "BLOCK_SIZE")):
        with pytest.raises(ValueError, match=message):
            ft.create_block_mask(causal, 1, 1, 128, 128, BLOCK_SIZE=bad)
    with pytest.raises(ValueError, match="Q_LEN must be a positive int, got 0"):
        ft.create_block_mask(causal, 1, 1, 0, 128)
    with pytest.raises(ValueError, match="H must be a positive int or None, got 2.0"):
        ft.create_block_mask(causal, 1, 2.0, 128, 128)
    assert ft._block_size([64, 128]) == (64, 128) and ft._positive_int("Q_LEN", torch.tensor(7)) == 7
    # torch's and_masks / or_masks: callables only; with none, everything / nothing
    with pytest.raises(RuntimeError, match="All inputs should be callable mask_mods"):
        ft.and_masks(causal, 2)
    assert "arith.constant true" in fajit.mlir(mask_mod=ft.and_masks())
    assert "arith.constant false" in fajit.mlir(mask_mod=ft.or_masks())

    # return_aux (torch's AuxRequest, or fajit.torch's where torch has none) is checked first
    with pytest.raises(ValueError, match="pass return_lse or return_aux, not both"):
        ft.flex_attention(q, q, q, return_lse=True, return_aux=ft.AuxRequest(lse=True))
    with pytest.raises(TypeError, match="return_aux must be an AuxRequest"):
        ft.flex_attention(q, q, q, return_aux=True)


# ---- GPU: against torch's flex_attention ------------------------------------------------------

def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    return flex_attention, create_block_mask


def _inputs(B, Hq, Hkv, L, S, D, dtype, Dv=None, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, S, Dv or D, device="cuda", dtype=dtype, generator=g)
    return [t.requires_grad_() for t in (q, k, v)]


def _reference(q, k, v, score_mod, mask_mod, enable_gqa=False, captured=()):
    """torch's flex_attention in float32 (eager) on copies; returns out, lse, grads."""
    flex, cbm = _flex()
    qf, kf, vf = [t.detach().float().requires_grad_() for t in (q, k, v)]
    L, S = q.shape[2], k.shape[2]
    mask = cbm(mask_mod, None, None, L, S, device="cuda") if mask_mod is not None else None
    out, lse = flex(qf, kf, vf, score_mod=score_mod, block_mask=mask, enable_gqa=enable_gqa, return_lse=True)
    return out, lse, (qf, kf, vf)


def _close(a, b, what, tol):
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item()
    scale = max(b.abs().max().item(), 1.0)
    assert err <= tol * scale, f"{what}: max error {err:.4g} (scale {scale:.3g}, tol {tol})"


def _kept(mask, side="kv"):
    """[Bm, Hm, nq, nkv] bool: the blocks a mask's kv tables list (partial or full); side "q":
    [Bm, Hm, nkv, nq], the blocks its q_* transposes list."""
    n, idx = getattr(mask, f"{side}_num_blocks"), getattr(mask, f"{side}_indices")
    kept = torch.zeros(idx.shape, dtype=torch.bool, device=idx.device)
    for num, ind in ((n, idx), (getattr(mask, f"full_{side}_num_blocks"), getattr(mask, f"full_{side}_indices"))):
        if num is None:
            continue
        valid = torch.arange(ind.shape[-1], device=ind.device) < num.unsqueeze(-1)
        for pos in zip(*torch.nonzero(valid, as_tuple=True)):
            kept[pos[:-1] + (ind[pos].item(),)] = True
    return kept


TOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B,Hq,Hkv,L,S,D", [(2, 4, 4, 256, 256, 64), (1, 8, 2, 200, 333, 128), (1, 2, 1, 77, 129, 64),
                                           (1, 4, 2, 300, 300, 80), (1, 2, 2, 129, 77, 40)])
def test_forward_and_gradients_match_flex(dtype, B, Hq, Hkv, L, S, D):
    import fajit.torch as ft

    q, k, v = _inputs(B, Hq, Hkv, L, S, D, dtype)
    gqa = Hq != Hkv
    mask = ft.create_block_mask(causal, None, None, L, S)
    out, lse = ft.flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa, return_lse=True)
    ref, ref_lse, (qf, kf, vf) = _reference(q, k, v, None, causal, gqa)
    _close(out, ref, "out", TOL[dtype])
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    _close(lse[finite], ref_lse[finite], "lse", 1e-3)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.float())
    for name, a, b in (("dq", q.grad, qf.grad), ("dk", k.grad, kf.grad), ("dv", v.grad, vf.grad)):
        assert a.dtype == dtype and a.shape == b.shape
        _close(a, b, name, 3 * TOL[dtype])


def _dense_causal(q, k, v):
    """Causal attention and its natural-log LSE in float64, by autograd-able dense math."""
    q, k, v = [t.detach().double().requires_grad_() for t in (q, k, v)]
    L, S = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    keep = torch.arange(L, device="cuda")[:, None] >= torch.arange(S, device="cuda")[None, :]
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1), (q, k, v)


@needs_gpu
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("loss", ["out", "lse", "both"])
def test_lse_in_the_loss_and_unused_outputs(compiled, loss):
    """Gradients when the loss reads the LSE (dLSE reaches dq and dk), only the LSE (out unused:
    no dO) or only out, eagerly (fajit.torch's autograd.Function) and inside torch.compile (the
    custom ops), against float64 autograd of dense causal attention."""
    import fajit.torch as ft

    B, H, L, D = 1, 2, 200, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.float16, seed=3)
    mask = ft.create_block_mask(causal, None, None, L, L)
    w = torch.randn(B, H, L, D, device="cuda", dtype=torch.float64)
    wl = torch.randn(B, H, L, device="cuda", dtype=torch.float64)

    def loss_of(out, lse):
        total = 0
        if loss in ("out", "both"):
            total = total + (out.double() * w).sum()
        if loss in ("lse", "both"):
            total = total + (lse.double() * wl).sum()
        return total

    def attn(q, k, v):
        return loss_of(*ft.flex_attention(q, k, v, block_mask=mask, return_lse=True))

    f = torch.compile(attn, fullgraph=True) if compiled else attn
    f(q, k, v).backward()
    out, lse, (qd, kd, vd) = _dense_causal(q, k, v)
    loss_of(out, lse).backward()
    for name, a, t in (("dq", q.grad, qd), ("dk", k.grad, kd), ("dv", v.grad, vd)):
        b = t.grad if t.grad is not None else torch.zeros_like(t)  # the LSE does not read v
        _close(a, b, f"{loss} {name}", 3 * TOL[torch.float16])


@needs_gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_return_aux_gives_the_lse_return_lse_gives(compiled):
    """return_aux=AuxRequest(lse=True): out and AuxOutput(lse, max_scores=None), the same bits as
    return_lse=True; a loss of aux.lse reaches dq and dk as return_lse's does; lse=False gives
    AuxOutput(None, None)."""
    import fajit.torch as ft

    B, H, L, D = 1, 2, 200, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=5)
    mask = ft.create_block_mask(causal, None, None, L, L)
    attn = torch.compile(ft.flex_attention, fullgraph=True) if compiled else ft.flex_attention
    out, aux = attn(q, k, v, block_mask=mask, return_aux=ft.AuxRequest(lse=True))
    assert isinstance(aux, ft.AuxOutput) and aux.max_scores is None
    out_l, lse = ft.flex_attention(q, k, v, block_mask=mask, return_lse=True)
    assert torch.equal(out, out_l) and torch.equal(aux.lse, lse)
    _, none = attn(q, k, v, block_mask=mask, return_aux=ft.AuxRequest())
    assert none.lse is None and none.max_scores is None
    aux.lse.sum().backward()
    dq, dk = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    lse.sum().backward()
    _close(dq, q.grad, "dq through aux.lse", TOL[torch.bfloat16])  # (dq by atomics: not bitwise)
    _close(dk, k.grad, "dk through aux.lse", TOL[torch.bfloat16])


@needs_gpu
def test_captured_bias_gradient_matches_flex():
    import fajit.torch as ft

    B, H, L, D = 1, 4, 256, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=1)
    bias = (0.1 * torch.randn(H, 2 * L - 1, device="cuda")).requires_grad_()

    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + L - 1]

    out = ft.flex_attention(q, k, v, score_mod=rel_bias, block_mask=ft.create_block_mask(causal, None, None, L, L))
    dout = torch.randn_like(out)
    out.backward(dout)
    got = bias.grad.clone()
    bias.grad = None
    ref, _, _ = _reference(q, k, v, rel_bias, causal)
    ref.backward(dout.float())
    _close(out, ref, "out", TOL[torch.bfloat16])
    _close(got, bias.grad, "dbias", 5e-2)


@needs_gpu
def test_deterministic_algorithms_give_bitwise_repeatable_gradients(monkeypatch):
    """Under torch.use_deterministic_algorithms(True) the backward runs in fajit's deterministic
    mode (dQ, dK, dV the same bits run to run, as flex's); a captured buffer's gradient, summed by
    atomics, is refused as torch refuses its own nondeterministic ops (a warning with warn_only),
    but only where it is asked for (autograd.grad over q, k, v alone asks for none)."""
    import fajit.torch as ft
    from fajit import _capi

    lib = _capi.lib()
    real = lib.fajit_kernel_backward
    modes = []

    def spy(*args):  # the C call's `deterministic` argument (before the stream)
        modes.append(args[-2])
        return real(*args)

    monkeypatch.setattr(lib, "fajit_kernel_backward", spy)

    B, H, L, D = 2, 4, 1000, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=3)
    dout = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    bm = ft.create_block_mask(causal, None, None, L, L)
    bias = (0.1 * torch.randn(H, 2 * L - 1, device="cuda")).requires_grad_()

    def rel_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + L - 1]

    def grads(score_mod=None):
        for t in (q, k, v, bias):
            t.grad = None
        ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm).backward(dout)
        return [t.grad.clone() for t in (q, k, v)]

    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        grads()
        assert modes == [0], "without torch's flag the backward takes the default mode"
        torch.use_deterministic_algorithms(True)
        first, second = grads(), grads()
        assert modes[1:] == [1, 1], "under torch.use_deterministic_algorithms(True): deterministic mode"
        for a, b_, name in zip(first, second, ("dq", "dk", "dv")):
            assert torch.equal(a.view(torch.int16), b_.view(torch.int16)), f"{name} differs between two runs"
        with pytest.raises(RuntimeError, match="captured buffers"):
            grads(rel_bias)
        out = ft.flex_attention(q, k, v, score_mod=rel_bias, block_mask=bm)
        torch.autograd.grad(out, (q, k, v), dout)  # the bias's gradient not asked for: nothing refused
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="captured buffers"):
            grads(rel_bias)
        assert bias.grad is not None
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


@needs_gpu
def test_a_buffer_read_only_by_the_mask_mod_gets_no_gradient():
    """A float buffer that requires grad but is read only by the mask_mod has no gradient (as in
    torch): without q, k, v needing one nothing is recorded; with them, its grad stays None."""
    import fajit.torch as ft

    B, H, L, D = 1, 2, 256, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=5)
    keep = torch.rand(L, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6))
    keep.requires_grad_()

    def kept_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((keep[kv_idx] > 0.2) | (q_idx == kv_idx))

    def kept_causal_ref(b, h, q_idx, kv_idx):  # (torch on a copy that needs no grad)
        return (q_idx >= kv_idx) & ((keep_ref[kv_idx] > 0.2) | (q_idx == kv_idx))

    keep_ref = keep.detach().clone()
    mask = ft.create_block_mask(kept_causal, None, None, L, L)
    ref, _, (qf, kf, vf) = _reference(q, k, v, None, kept_causal_ref)
    out = ft.flex_attention(q.detach(), k.detach(), v.detach(), block_mask=mask)
    assert not out.requires_grad and out.grad_fn is None
    _close(out, ref, "out without grads", TOL[torch.bfloat16])
    out = ft.flex_attention(q, k, v, block_mask=mask)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert keep.grad is None
    ref.backward(dout.float())
    for name, a, b in (("dq", q.grad, qf.grad), ("dk", k.grad, kf.grad), ("dv", v.grad, vf.grad)):
        _close(a, b, name, TOL[torch.bfloat16])


@needs_gpu
def test_document_mask_with_captured_ids_and_alibi():
    import fajit.torch as ft

    B, H, L, D = 2, 4, 300, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.float16, seed=2)
    doc_ids = torch.repeat_interleave(torch.arange(3, device="cuda"), torch.tensor([100, 120, 80], device="cuda"))
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device="cuda") / H)

    def document_causal(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    mask = ft.create_block_mask(document_causal, None, None, L, L)
    out = ft.flex_attention(q, k, v, score_mod=alibi, block_mask=mask)
    ref, _, _ = _reference(q, k, v, alibi, document_causal)
    _close(out, ref, "out", TOL[torch.float16])
    # The blocks torch's create_block_mask keeps (torch may call a tail block partial that
    # fajit, ignoring elements past the length, calls full).
    tmask = _flex()[1](document_causal, None, None, L, L, device="cuda")
    assert torch.equal(_kept(mask), _kept(tmask))
    # the q_* transposes too (views of fajit's copy, made when first read), in torch's shape where
    # the mask broadcasts over the B x H asked for
    for bh in ((None, None), (B, H)):
        ours, theirs = ft.create_block_mask(document_causal, *bh, L, L), _flex()[1](document_causal, *bh, L, L)
        assert ours.q_indices.shape == theirs.q_indices.shape, bh
        assert torch.equal(_kept(ours, "q"), _kept(theirs, "q")), bh
        assert torch.equal(_kept(ours, "q"), _kept(ours).transpose(-1, -2)), bh
    # to and from torch's BlockMask
    back = ft.BlockMask.from_torch(mask.to_torch())
    assert torch.equal(back.kv_num_blocks, mask.kv_num_blocks)
    # torch's inspection methods
    assert torch.equal(mask.to_dense().bool(), _kept(mask)) and mask.numel() == L * L
    assert len(mask.as_tuple()) == len(mask.to_torch().as_tuple())
    out2 = ft.flex_attention(q, k, v, score_mod=alibi, block_mask=tmask)
    _close(out2, out, "out with torch's BlockMask", 1e-3)


def test_block_mask_slices_trace_in_torch_compile_without_a_gpu():
    """A fajit BlockMask, its decoding-step slice and the tables fajit reads, inside
    torch.compile(fullgraph=True) (eager backend, CPU tables): the same as eager."""
    import fajit.torch as ft
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    base = ft.BlockMask.from_torch(torch_create_block_mask(causal, 1, 1, 1000, 1000, device="cpu"))
    wide = ft.BlockMask(None, {n: getattr(base, n).expand(2, 4, *getattr(base, n).shape[2:]) for n in ft._capi.TABLES},
                        (1000, 1000), (128, 128), causal)

    def tables_at(m, pos):
        return [t.clone() for t in ft._kv_tables(m[:, :, pos // 128])]

    compiled = torch.compile(tables_at, backend="eager", fullgraph=True)
    for p in (0, 300, 999):
        pos = torch.tensor(p)
        want = tables_at(wide, pos)  # eager first: the mask's kept views exist when dynamo traces
        for got, w in zip(compiled(wide, pos), want):
            assert torch.equal(got, w), p


def test_the_compiled_call_traces_without_a_gpu(monkeypatch):
    """torch.compile(fullgraph) through fajit.torch.flex_attention on CPU tensors, the kernels
    stubbed out: the input checks, BlockMask slicing, the mods' dry run and the custom op trace
    into one graph; a runtime scalar's new value does not recompile, a changed Python constant
    does; the decoding recipe's step is one graph."""
    import torch._dynamo.testing

    import fajit.torch as ft
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    def fake_forward(q, k, v, variant, scale, tables, info, buffers, scalars, want_max, want_lse):
        B, H, L, _ = q.shape
        return (torch.zeros(B, H, L, v.shape[3], dtype=q.dtype), torch.zeros(B, H, L),
                torch.zeros(B, H, L) if want_max else None)

    monkeypatch.setattr(ft, "_check_cuda", lambda name, t: None)
    monkeypatch.setattr(ft, "_forward", fake_forward)
    B, H, L, D = 1, 4, 256, 64
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.bfloat16) for _ in range(3))
    cap, bias = torch.tensor(10.0), torch.rand(L)
    consts = {"soft": 20.0}

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def biased(score, b, h, q_idx, kv_idx):
        return consts["soft"] * torch.tanh(score / consts["soft"]) + bias[kv_idx]

    mask = ft.BlockMask.from_torch(torch_create_block_mask(causal, None, None, L, L, device="cpu"))
    wide = ft.BlockMask(None, {n: getattr(mask, n).expand(B, H, *getattr(mask, n).shape[2:]) for n in ft._capi.TABLES},
                        (L, L), (128, 128), causal)
    for score_mod, m in ((softcap, mask), (biased, mask), (softcap, wide)):
        torch._dynamo.reset()
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        f = torch.compile(lambda q, k, v: ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=m).sum(),
                          fullgraph=True, backend=counter)
        f(q, k, v)
        cap.fill_(3.0)
        f(q, k, v)
        assert counter.frame_count == 1, "a new runtime scalar value recompiled"
        consts["soft"] = 30.0
        try:
            f(q, k, v)
        finally:
            consts["soft"] = 20.0
        # a changed constant recompiles (dynamo may compile twice for a float: it first tries it dynamic)
        assert (counter.frame_count >= 2) if score_mod is biased else (counter.frame_count == 1)

    pos = torch.tensor(200, dtype=torch.int32)

    def at_pos(b, h, q_idx, kv_idx):
        return q_idx + pos >= kv_idx

    def step(q1):
        s = wide[:, :, pos // 128]
        s.mask_mod, s.seq_lengths = at_pos, (1, L)
        return ft.flex_attention(q1, k, v, block_mask=s)

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    g = torch.compile(step, fullgraph=True, backend=counter)
    g(q[:, :, :1])
    pos.fill_(100)
    g(q[:, :, :1])
    assert counter.frame_count == 1


def test_block_mask_q_tables_made_when_read_without_a_gpu():
    """A mask's q_* transposes are views made when first read: pickled, deep-copied and read
    inside torch.compile(fullgraph=True) as tables set at creation were; one the caller set stays."""
    import copy
    import io
    import pickle

    import fajit.torch as ft
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    theirs = torch_create_block_mask(causal, 2, 1, 512, 512, device="cpu")

    def q_kept(m):
        live = torch.arange(m.q_indices.shape[-1]) < m.q_num_blocks[..., None]
        return m.q_indices[live]

    want = q_kept(theirs)

    def saved(m):
        buf = io.BytesIO()
        torch.save(m, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    for how in (lambda m: pickle.loads(pickle.dumps(m)), saved, copy.deepcopy):
        mine = ft.BlockMask.from_torch(theirs)
        mine.mask_mod = ft.noop_mask  # (a local function does not pickle)
        other = how(mine)
        assert torch.equal(q_kept(other), want)
        # the copy's q_* views are of its own memory
        assert other.q_indices.untyped_storage().data_ptr() != mine.kv_indices.untyped_storage().data_ptr()
    mine = ft.BlockMask.from_torch(theirs)

    @torch.compile(backend="eager", fullgraph=True)
    def read(x, m):
        return x + (m.q_num_blocks * 1000).sum() + m.to("cpu").q_num_blocks.sum()

    assert read(torch.zeros(()), mine).item() == 1001 * theirs.q_num_blocks.sum().item()
    mine = ft.BlockMask.from_torch(theirs)
    mine.q_indices = set_by_caller = torch.zeros_like(theirs.q_indices)
    assert torch.equal(mine.q_num_blocks, theirs.q_num_blocks) and mine.q_indices is set_by_caller


def test_block_mask_tables_without_a_gpu():
    """BlockMask indexing, handles and checks on CPU tables (torch's create_block_mask on CPU):
    what the GPU test's flex_attention calls rest on, runnable wherever torch is."""
    import ctypes as C

    import fajit.torch as ft
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    B, H, S = 2, 4, 1000

    def handle_shape(bm):
        info = ft._capi.BlockMaskInfo()
        ft._capi.check(ft._capi.lib().fajit_block_mask_get_info(bm._handle.h, C.byref(info)))
        return info.batch, info.heads

    def by_head(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (h == 1) | (b == 1)

    hm = ft.BlockMask.from_torch(torch_create_block_mask(by_head, B, H, S, S, device="cpu"))
    assert handle_shape(hm) == (2, 4)
    # all eight tables as torch's, the q_* transposes (viewed when first read) too; broadcast ones
    # (a mask of q and kv alone for B x H) in torch's shape
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    for mod, bh in ((by_head, (B, H)), (causal, (B, H)), (causal, (1, 1))):
        theirs = torch_create_block_mask(mod, *bh, S, S, device="cpu")
        ours = ft.BlockMask.from_torch(theirs)
        for name in ft._capi.TABLES:
            got, want = getattr(ours, name), getattr(theirs, name)
            assert got.shape == want.shape, (mod.__name__, bh, name)
            if name.endswith("num_blocks"):
                assert torch.equal(got, want), (mod.__name__, bh, name)
            else:  # torch leaves the entries past a row's count unspecified
                count = getattr(ours, name.replace("indices", "num_blocks"))
                live = torch.arange(got.shape[-1]) < count[..., None]
                assert torch.equal(got[live], want[live]), (mod.__name__, bh, name)
    # slices starting where their parent does get handles of their own
    assert handle_shape(hm[0:1, 0:2]) == (1, 2) and handle_shape(hm[0:1, 0:1]) == (1, 1)
    assert torch.equal(hm[0:1, 0:1].kv_indices[0, 0], hm.kv_indices[0, 0])
    with pytest.raises(RuntimeError, match=r"this BlockMask was indexed"):
        hm[0:1].mask_mod(0, 0, 0, 0)
    # a list picks as torch's advanced indexing does
    theirs_list = torch_create_block_mask(by_head, B, H, S, S, device="cpu")
    for index in ([1, 0], (slice(None), [0, 3]), (0, slice(None), [2, -1])):
        got, want = hm[index], theirs_list[index]
        assert torch.equal(got.kv_num_blocks, want.kv_num_blocks), index
        assert torch.equal(got.to_dense().bool(), want.to_dense().bool()), index
    # picked query blocks carry their query length (torch's rule): a slice's blocks, the last one
    # clipped; a tensor's count times the block; so a decoding step's mask prints as it is
    assert hm[:, :, 2:4].shape == (B, H, 256, S) and hm[:, :, 7].shape == (B, H, S - 7 * 128, S)
    assert hm[:, :, torch.tensor([1, 7])].shape == (B, H, 256, S) and hm[0:1, 1:2].shape == (1, 1, S, S)
    picks = [True, False, True, False, False, False, False, True]
    assert hm[:, :, picks].shape == (B, H, 384, S) and hm[:, :, torch.tensor(picks)].kv_num_blocks.shape[2] == 3
    assert hm[:, :, -1:].shape == (B, H, S - 7 * 128, S) and hm[:, :, ::3].shape == (B, H, 3 * 128, S)
    assert "Lq=128" in repr(hm[:, :, 1]) and hm[:, :, 1].sparsity() >= 0
    # torch's to_string(grid_size, limit): the first pairs' grids, shrunk; a cell of mixed kinds is +
    text = hm.to_string(grid_size=(4, 4), limit=2).splitlines()
    assert text[0] == repr(hm) and text[1] == "(0, 0)" and text[6] == "(0, 1)" and len(text[2]) == 4
    assert text[2] == "+..." and "6 more (batch, head) pairs" in text[-1], text
    assert ft._shrink_grid(["#+..", "##+.", "###+", "####"], 2, 2) == ["++", "#+"]
    # a mask's handle is found again while its tables stay as they were, and made again when they
    # change in place or move (`.data =` moves a tensor without a new version)
    first = hm._handle
    assert hm._handle is first
    hm.kv_num_blocks[0, 0, 0] = hm.kv_num_blocks[0, 0, 0].clone()
    second = hm._handle
    assert second is not first and hm._handle is second
    hm.kv_indices.data = hm.kv_indices.clone()
    assert hm._handle is not second
    # fajit's own broadcast masks come expanded to torch's shape and stay broadcast in fajit
    base = ft.BlockMask.from_torch(torch_create_block_mask(causal, 1, 1, S, S, device="cpu"))
    tables = {n: getattr(base, n).expand(B, H, *getattr(base, n).shape[2:]) for n in ft._capi.TABLES}
    wide = ft.BlockMask(base._handle, tables, (S, S), (128, 128), causal)
    assert wide.shape == (B, H, S, S) and handle_shape(wide) == (1, 1)
    step = wide[:, :, 1]
    step.seq_lengths = (1, S)
    assert tuple(step.kv_indices.shape) == (B, H, 1, 8) and handle_shape(step) == (1, 1)
    # a query block picked by a position tensor keeps the broadcast too (a decoding step's GQA
    # group then shares one K/V read), and so do slices of the batch and heads
    for sub in (wide[:, :, torch.tensor(1)], wide[0, 1:, 4], wide[1:, 0:3, torch.tensor([-1])]):
        sub.seq_lengths = (1, S)
        assert handle_shape(sub) == (1, 1), [t.stride() for t in (sub.kv_num_blocks, sub.kv_indices)]
    two = wide[1:, 0:3, torch.tensor([2, -1])]
    assert tuple(two.kv_indices.shape) == (1, 3, 2, 8) and two.kv_indices.stride(1) == 0
    assert torch.equal(two.kv_indices, base.kv_indices.expand(B, H, -1, -1)[1:, 0:3][:, :, [2, -1]])
    # one query block of a mask of one (batch, head) row, picked by a one-element tensor (the
    # decoding step's form): torch's indexing, negatives from the end, out of range refused, tables
    # changed in place or moved (`.data =`) seen, an empty slice's tables empty
    counts = base.kv_num_blocks.clone()
    live = ft.BlockMask(None, dict(tables, kv_num_blocks=counts.expand(B, H, -1)), (S, S), (128, 128), causal)
    for i in (torch.tensor(0), torch.tensor([-1]), torch.tensor(5, dtype=torch.int32), torch.tensor(-8)):
        got = live[:, :, i]
        assert tuple(got.kv_indices.shape) == (B, H, 1, 8)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            assert torch.equal(getattr(got, name), getattr(live, name)[:, :, i.reshape(-1)]), (name, i)
        assert all(t.is_contiguous() for t in ft._kv_tables(got))  # read in place by a decoding kernel
    counts[0, 0, 5] = 3
    assert live[:, :, torch.tensor(5)].kv_num_blocks[1, 2, 0] == 3
    for bad in (torch.tensor(8), torch.tensor([-9])):
        with pytest.raises(IndexError):
            live[:, :, bad]
    counts.copy_(base.kv_num_blocks)
    before = live._handle
    moved = counts.clone()
    moved[0, 0, 5] = 0  # row 5 without its partial (diagonal) block
    live.kv_num_blocks.data = moved.expand(B, H, -1)
    assert live[:, :, torch.tensor(5)].kv_num_blocks[0, 0, 0] == 0 and live._handle is not before
    empty = live[2:2]
    assert tuple(ft._kv_tables(empty)[0].shape) == (0, 1, 8)  # heads still broadcast, no batch
    assert tuple(empty[:, :, torch.tensor(0)].kv_num_blocks.shape) == (0, H, 1)
    # under torch.inference_mode (tensors without a version counter) masks are made, used and sliced
    with torch.inference_mode():
        made = ft.BlockMask.from_torch(torch_create_block_mask(causal, 1, 1, S, S, device="cpu"))
        assert handle_shape(made) == (1, 1) and made._handle is made._handle
        assert torch.equal(made[:, :, torch.tensor(1)].kv_indices, made.kv_indices[:, :, 1:2])
        assert not made.kv_num_blocks.is_inference()  # fajit's own tables keep a version counter
        first = made._handle
        made.kv_num_blocks[0, 0, 3] = 0
        assert made._handle is not first  # an in-place edit there is seen
    again = wide[:, :, 1]
    again.seq_lengths = (1, S)
    assert again._handle is step._handle  # the view made again finds its handle
    step.seq_lengths = (1, S // 2)
    with pytest.raises(ValueError, match=r"kv_indices has shape \(\.\.\., 1, 8\); Q_LEN=1, KV_LEN=500 in "
                                         r"blocks of 128x128 need \[\.\.\., 1, 4\]"):
        step._handle
    # _adjust crops (keeping the broadcast) to what a mask for the smaller lengths holds, never grows
    assert handle_shape(wide._adjust(500, 700)) == (1, 1)
    small = hm._adjust(500, 700)
    fresh = ft.BlockMask.from_torch(torch_create_block_mask(by_head, B, H, 500, 700, device="cpu"))
    assert small.seq_lengths == (500, 700) and torch.equal(small.to_dense(), fresh.to_dense())
    with pytest.raises(ValueError, match="cannot grow Q_LEN=1000, KV_LEN=1000 to 2000, 1000"):
        hm._adjust(2000, 1000)
    # one index tensor among slices (index_select, negatives wrapped) picks what torch's indexing
    # picks, and the slice's q tables, computed when first read, are torch's
    theirs = hm.to_torch()
    for i in (torch.tensor([1]), torch.tensor([-1, 2]), torch.tensor(3), torch.tensor([0, 7], dtype=torch.int32)):
        for heads in (slice(None), slice(1, 3)):
            got, want = hm[:, heads, i], theirs[:, heads, i.reshape(-1)]
            for name in ft._capi.TABLES:
                assert torch.equal(getattr(got, name), getattr(want, name)), (name, i, heads)


@needs_gpu
def test_block_mask_indexing_and_the_decoding_recipe():
    import fajit.torch as ft

    B, H, S, D = 2, 4, 1000, 64
    q, k, v = [t.detach() for t in _inputs(B, H, H, S, S, D, torch.bfloat16, seed=11)]
    mask = ft.create_block_mask(causal, B, H, S, S)
    nq = mask.kv_num_blocks.shape[2]
    # torch's indexing, an int keeping its dimension; seq_lengths kept, no mask_mod
    assert mask[1].kv_num_blocks.shape == (1, H, nq)
    assert mask[0, -1].kv_num_blocks.shape == (1, 1, nq)
    sub = mask[1:2, 1:3]
    assert torch.equal(sub.kv_num_blocks, mask.kv_num_blocks[1:2, 1:3])
    assert torch.equal(sub.full_kv_indices, mask.full_kv_indices[1:2, 1:3])
    assert sub.seq_lengths == (S, S) and mask.shape == (B, H, S, S)
    theirs = mask.to_torch()[1:2, 1:3]
    assert torch.equal(sub.q_num_blocks, theirs.q_num_blocks) and torch.equal(sub.q_indices, theirs.q_indices)
    with pytest.raises(IndexError, match="block_mask index 4 is out of range for the heads of size 4"):
        mask[0, 4]
    # a slice of the batch and heads: its mask_mod must be set again (torch's rule)
    with pytest.raises(RuntimeError, match=r"this BlockMask was indexed \(block_mask\[...\]\)"):
        ft.flex_attention(q[1:2, 1:3], k[1:2, 1:3], v[1:2, 1:3], block_mask=sub)
    sub.mask_mod = causal
    out = ft.flex_attention(q[1:2, 1:3], k[1:2, 1:3], v[1:2, 1:3], block_mask=sub)
    whole = ft.flex_attention(q, k, v, block_mask=mask)
    _close(out, whole[1:2, 1:3], "out of a sliced mask", 1e-3)
    # torch's decoding recipe (gpt-fast): the query block of the position, a mask_mod offset by
    # a captured position, seq_lengths set to (1, KV_LEN)
    ref, _, _ = _reference(q, k, v, None, causal)
    offset = torch.tensor([0], device="cuda", dtype=torch.int32)

    def causal_at_offset(b, h, q_idx, kv_idx):
        return causal(b, h, q_idx + offset[0], kv_idx)

    for pos in (0, 130, 999):
        offset.fill_(pos)
        step = mask[:, :, pos // mask.BLOCK_SIZE[0]]
        step.mask_mod = causal_at_offset
        step.seq_lengths = (1, S)
        out = ft.flex_attention(q[:, :, pos:pos + 1], k, v, block_mask=step)
        _close(out, ref[:, :, pos:pos + 1], f"decoding at {pos}", TOL[torch.bfloat16])
    # seq_lengths changed on a mask already used: its tables are taken at the new lengths
    with pytest.raises(ValueError, match="block_mask was created for Q_LEN=1, KV_LEN=1000"):
        ft.flex_attention(q, k, v, block_mask=step)
    step.seq_lengths = (1, S // 2)  # tables for 1000 keys are not tables for 500
    with pytest.raises(ValueError, match=r"kv_indices has shape \(\.\.\., 1, 8\); Q_LEN=1, KV_LEN=500 in "
                                         r"blocks of 128x128 need \[\.\.\., 1, 4\]"):
        ft.flex_attention(q[:, :, :1], k[:, :, :S // 2], v[:, :, :S // 2], block_mask=step)
    # a mask that ignores b and h stays broadcast in fajit's handle of its slices
    sliced = mask[:, :, 1]
    sliced.seq_lengths = (1, S)
    info = ft._capi.BlockMaskInfo()
    ft._capi.check(ft._capi.lib().fajit_block_mask_get_info(sliced._handle.h, ft.C.byref(info)))
    assert (info.batch, info.heads) == (1, 1)
    # slices start where their parent does: each gets its own handle (b- and h-dependent masks)
    def by_head(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (h == 1) | (b == 1)

    hm = ft.create_block_mask(by_head, B, H, S, S)
    first = hm[0:1, 0:2]
    first.mask_mod = by_head
    out = ft.flex_attention(q[:1, :2], k[:1, :2], v[:1, :2], block_mask=first)
    ref2, _, _ = _reference(q[:1, :2], k[:1, :2], v[:1, :2], None, by_head)
    _close(out, ref2, "b- and h-dependent mask sliced", TOL[torch.bfloat16])
    head0 = hm[0:1, 0:1]  # head 0's (causal) tables for every head
    head0.mask_mod = by_head
    out = ft.flex_attention(q[:1, :2], k[:1, :2], v[:1, :2], block_mask=head0)
    _close(out[:, 0], ref2[:, 0], "head 0 with its own tables", TOL[torch.bfloat16])
    assert torch.equal(head0.kv_num_blocks[0, 0], hm.kv_num_blocks[0, 0])
    # cropped to the upper left (torch's _adjust), and moved
    small = mask._adjust(500, 700)
    assert small.seq_lengths == (500, 700) and small.kv_num_blocks.shape == (B, H, 4)
    with pytest.raises(ValueError, match="cannot grow Q_LEN=1000, KV_LEN=1000 to 2000, 1000"):
        mask._adjust(2000, 1000)
    out = ft.flex_attention(q[:, :, :500], k[:, :, :700], v[:, :, :700], block_mask=small)
    # (given tables may run another tile than a mask of fajit's own: rounding differs)
    ref, _, _ = _reference(q[:, :, :500], k[:, :, :700], v[:, :, :700], None, causal)
    _close(out, ref, "out of an adjusted mask", TOL[torch.bfloat16])
    assert torch.equal(mask.to("cpu").kv_indices, mask.kv_indices.cpu())
    assert torch.equal(ft.create_mask(causal, 1, 1, 4, 4, device="cuda")[0, 0],
                       torch.ones(4, 4, dtype=torch.bool, device="cuda").tril())
    # flex_attention needs [B, H, num_q_blocks] tables (torch's older indexing dropped dimensions)
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    flat = TorchBlockMask.from_kv_blocks(mask.kv_num_blocks[0], mask.kv_indices[0], seq_lengths=(S, S))
    with pytest.raises(ValueError, match=r"kv_num_blocks must be \[B, H, num_q_blocks\], got shape \(4, 8\)"):
        ft.flex_attention(q, k, v, block_mask=flat)


@needs_gpu
def test_runtime_scalar_changes_without_recompiling():
    import fajit.torch as ft

    B, H, L, D = 1, 2, 128, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=3)
    cap = torch.tensor(20.0)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    out1 = ft.flex_attention(q, k, v, score_mod=softcap)
    n = len(ft._KERNELS)
    cap.fill_(0.5)
    out2 = ft.flex_attention(q, k, v, score_mod=softcap)
    assert len(ft._KERNELS) == n, "a new scalar value compiled a new kernel"
    ref, _, _ = _reference(q, k, v, softcap, None)
    _close(out2, ref, "out after the scalar changed", TOL[torch.bfloat16])
    assert (out1 - out2).abs().max().item() > 1e-2


def _dense_softcap_reference(q, k, v, cap, keep):
    """float64 attention of cap * tanh(s / cap) over the kept entries [L, S]; differentiable in cap."""
    D = q.shape[-1]
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D)
    c = cap.double()
    s = (c * torch.tanh(s / c)).masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


@needs_gpu
def test_a_captured_gpu_scalar_is_read_on_the_device_and_gets_its_gradient():
    """A captured 0-d GPU tensor is a one-element buffer read by the kernels (no .item(), so no
    sync per call); a float one that requires grad gets its gradient; a new value never
    recompiles. A CPU one stays a runtime scalar (by value), and asking it for a gradient is an
    error rather than a gradient silently left out."""
    import fajit.torch as ft

    B, H, L, D = 1, 4, 200, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=9)
    cap = torch.tensor(8.0, device="cuda", requires_grad=True)
    shift = torch.tensor(3, device="cuda", dtype=torch.int32)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    def shifted_causal(b, h, q_idx, kv_idx):
        return q_idx + shift >= kv_idx

    ir = fajit.mlir(softcap, shifted_causal, canonicalize=False)
    assert "fa.scalar" not in ir, ir
    assert "fa.load %cap[" in ir and "!fa.buffer<f32, 1>" in ir and "fa.load %shift[" in ir, ir
    mask = ft.create_block_mask(shifted_causal, None, None, L, L)
    out = ft.flex_attention(q, k, v, score_mod=softcap, block_mask=mask)
    dout = torch.randn_like(out)
    out.backward(dout)
    i = torch.arange(L, device="cuda")
    keep = i[:, None] + 3 >= i[None, :]
    qr, kr, vr = [t.detach().double().requires_grad_() for t in (q, k, v)]
    capr = cap.detach().double().requires_grad_()
    ref = _dense_softcap_reference(qr, kr, vr, capr, keep)
    ref.backward(dout.double())
    _close(out, ref, "out", TOL[torch.bfloat16])
    _close(q.grad, qr.grad, "dq", 5e-2)
    _close(cap.grad, capr.grad, "dcap", 5e-2)
    assert cap.grad.shape == cap.shape and cap.grad.dtype == torch.float32

    n = len(ft._KERNELS)
    with torch.no_grad():
        cap.fill_(2.0)
        shift.fill_(0)
        mask0 = ft.create_block_mask(shifted_causal, None, None, L, L)
        out2 = ft.flex_attention(q, k, v, score_mod=softcap, block_mask=mask0)
    assert len(ft._KERNELS) == n, "a new value of a captured GPU scalar compiled a new kernel"
    _close(out2, _dense_softcap_reference(q, k, v, cap, i[:, None] >= i[None, :]), "out after the values changed",
           TOL[torch.bfloat16])

    cpu_cap = torch.tensor(8.0, requires_grad=True)

    def cpu_softcap(score, b, h, q_idx, kv_idx):
        return cpu_cap * torch.tanh(score / cpu_cap)

    with pytest.raises(ValueError, match="score_mod captures the 0-d tensor 'cpu_cap' on the CPU and it requires "
                                         "grad: a CPU scalar is passed by value and gets no gradient; put it on cuda"):
        ft.flex_attention(q, k, v, score_mod=cpu_softcap)
    with torch.no_grad():  # no gradient asked: a runtime scalar as before
        _close(ft.flex_attention(q, k, v, score_mod=cpu_softcap),
               _dense_softcap_reference(q, k, v, cpu_cap.cuda(), torch.ones_like(keep)), "out, CPU scalar",
               TOL[torch.bfloat16])


@needs_gpu
def test_decoding_steps_need_no_sync_and_replay_from_a_cuda_graph():
    """gpt-fast's decoding step: the mask's query-block row picked by the position on the GPU
    (block_mask[:, :, pos // 128]) and a mask_mod offset by that position. fajit reads the
    sliced tables and the position on the device: no step synchronizes (torch's sync debug mode
    raises on any), and the step captured once in a CUDA graph replays right at every position."""
    import fajit.torch as ft

    B, Hq, Hkv, S, D = 2, 8, 2, 1000, 64
    q_all, k, v = [t.detach() for t in _inputs(B, Hq, Hkv, S, S, D, torch.bfloat16, seed=21)]
    ref, _, _ = _reference(q_all, k, v, None, causal, enable_gqa=True)
    mask = ft.create_block_mask(causal, None, None, S, S)
    pos = torch.zeros((), dtype=torch.int32, device="cuda")
    q_in = torch.empty_like(q_all[:, :, :1])

    def at_pos(b, h, q_idx, kv_idx):
        return q_idx + pos >= kv_idx

    def step():
        m = mask[:, :, pos // mask.BLOCK_SIZE[0]]
        m.mask_mod = at_pos
        m.seq_lengths = (1, S)
        return ft.flex_attention(q_in, k, v, block_mask=m, enable_gqa=True)

    def at(p):
        pos.fill_(p)
        q_in.copy_(q_all[:, :, p:p + 1])

    at(0)
    step()  # compiles the kernel (host work only) before the checks
    torch.cuda.synchronize()
    outs = {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        for p in (0, 130, 999):
            at(p)
            outs[p] = step().clone()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for p, out in outs.items():
        _close(out, ref[:, :, p:p + 1], f"eager step at {p}", TOL[torch.bfloat16])

    at(0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_g = step()
    for p in (0, 1, 127, 128, 500, 999):
        at(p)
        g.replay()
        _close(out_g, ref[:, :, p:p + 1], f"graph replay at {p}", TOL[torch.bfloat16])

    # the slice by a position tensor (index_select) picks torch's rows; its q tables when read
    at(300)
    step_mask = mask[:, :, pos // 128]
    want = mask.to_torch()[:, :, 2:3]
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices"):
        assert torch.equal(getattr(step_mask, name), getattr(want, name)), name
    # negative, CPU and multi-row index tensors pick what torch's indexing picks
    for i in (torch.tensor([-1], device="cuda"), torch.tensor(2), torch.tensor([1, -3], device="cuda"),
              torch.tensor([0, 5], device="cuda", dtype=torch.int64)):
        got = mask[:, :, i]
        want_idx = i.reshape(-1)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_indices"):
            assert torch.equal(getattr(got, name), getattr(mask, name)[:, :, want_idx]), (name, i)
    # the same step inside torch.compile(fullgraph=True)
    compiled = torch.compile(step, fullgraph=True)
    for p in (3, 700):
        at(p)
        _close(compiled(), ref[:, :, p:p + 1], f"compiled step at {p}", TOL[torch.bfloat16])


@needs_gpu
def test_autotuned_forward_matches_and_reports_its_choice(monkeypatch):
    import random

    import fajit.torch as ft

    B, H, L, D = 2, 4, 1000, 128
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=5)
    shift = 0.25 + random.random()  # a variant no earlier run tuned (its choice would be stored)

    def shifted(score, b, h, q_idx, kv_idx):
        return score + shift

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    monkeypatch.setenv("FAJIT_AUTOTUNE", "1")  # read when the kernel is compiled
    block_mask = ft.create_block_mask(causal, 1, 1, L, L)
    out = ft.flex_attention(q, k, v, score_mod=shifted, block_mask=block_mask)
    # A constant shift leaves softmax unchanged (and a float closure trips torch.compile's
    # reference with dynamic shapes), so the reference is causal alone.
    ref, _, _ = _reference(q, k, v, None, causal)
    _close(out, ref, "autotuned out", TOL[torch.bfloat16])
    reports = [kern.autotune_report() for kern in ft._KERNELS.values()]
    assert any("bh8 q1024 kv1024 blk128x128: tuned" in r for r in reports), reports


@needs_gpu
def test_inside_torch_compile_fullgraph():
    import torch._dynamo.testing

    import fajit.torch as ft

    B, H, L, D = 1, 4, 256, 64
    q, k, v = _inputs(B, H, H, L, L, D, torch.bfloat16, seed=4)
    cap = torch.tensor(10.0, device="cuda")

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    mask = ft.create_block_mask(causal, None, None, L, L)

    def attn(q, k, v):
        return ft.flex_attention(q, k, v, score_mod=softcap, block_mask=mask).sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attn, fullgraph=True, backend=counter)
    loss = compiled(q, k, v)
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    eager = attn(q, k, v)
    eager.backward()
    _close(loss, eager, "compiled loss", 1e-3)
    for a, b in zip(grads, (q.grad, k.grad, v.grad)):
        _close(a, b, "compiled grad", 1e-3)
    cap.fill_(3.0)
    compiled(q, k, v)
    assert counter.frame_count == 1, "a new scalar value recompiled the graph"
    # inductor keeps the custom op too
    out = torch.compile(lambda q, k, v: ft.flex_attention(q, k, v, block_mask=mask), fullgraph=True)(q, k, v)
    _close(out, ft.flex_attention(q, k, v, block_mask=mask), "inductor", 1e-3)


@needs_gpu
def test_bad_gpu_inputs_name_the_argument():
    import fajit.torch as ft

    q = torch.zeros(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
    k2 = torch.zeros(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query has 4 heads and key 2: pass enable_gqa=True"):
        ft.flex_attention(q, k2, k2)
    with pytest.raises(ValueError, match="query, key and value must have one dtype"):
        ft.flex_attention(q, q.half(), q)
    with pytest.raises(ValueError, match="query must be float16 or bfloat16, got torch.float32"):
        ft.flex_attention(q.float(), q, q)
    with pytest.raises(ValueError, match="query: fajit takes head dims that are multiples of 8 from 32 to 256, got 100"):
        z = torch.zeros(1, 4, 128, 100, device="cuda", dtype=torch.bfloat16)
        ft.flex_attention(z, z, z)
    with pytest.raises(ValueError, match="value: fajit takes head dims that are multiples of 8 from 32 to 256, got 264"):
        ft.flex_attention(q, q, torch.zeros(1, 4, 128, 264, device="cuda", dtype=torch.bfloat16))
    mask = ft.create_block_mask(causal, None, None, 256, 256)
    with pytest.raises(ValueError, match="block_mask was created for Q_LEN=256, KV_LEN=256; query has L=128 and key S=128"):
        ft.flex_attention(q, q, q, block_mask=mask)
    with pytest.raises(TypeError, match="score_mod must take 5 arguments"):
        ft.flex_attention(q, q, q, score_mod=causal)


def test_a_module_method_as_score_mod_names_its_parameters():
    class RelBias(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.zeros(4, 255))

        def score_mod(self, score, b, h, q_idx, kv_idx):
            return score + self.table[h, q_idx - kv_idx + 127]

    ir = fajit.mlir(RelBias().score_mod)
    assert "captures(%table: !fa.buffer<f32, 2>)" in ir, ir


@needs_gpu
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("L", [300, 1])  # the prefill kernel, and the decoder with its combine
def test_return_aux_max_scores_are_the_rows_largest_modded_scores(compiled, L):
    """AuxRequest(max_scores=True): each row's largest score after score_mod and the mask, in
    natural units, against float64 dense math (-inf for fully masked rows); out and the LSE the
    same bits as without it; no gradient (as torch's), while out's still flows."""
    import fajit.torch as ft

    B, Hq, Hkv, S, D = 2, 8, 2, 517, 64
    q, k, v = _inputs(B, Hq, Hkv, L, S, D, torch.float16, seed=11)
    cap = torch.tensor(20.0, device="cuda")
    bias = torch.randn(S, device="cuda")

    def soft_bias(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap) + bias[kv_idx]

    def mask_mod(b, h, q_idx, kv_idx):  # rows q_idx % 7 == 0 of batch 1 see nothing
        return ((kv_idx <= q_idx + S - L) | (kv_idx % 5 == 0)) & ~((b == 1) & (q_idx % 7 == 0))

    mask = ft.create_block_mask(mask_mod, B, None, L, S)
    attn = torch.compile(ft.flex_attention, fullgraph=True) if compiled else ft.flex_attention
    out, aux = attn(q, k, v, score_mod=soft_bias, block_mask=mask, enable_gqa=True,
                    return_aux=ft.AuxRequest(lse=True, max_scores=True))
    assert aux.max_scores.shape == (B, Hq, L) and aux.max_scores.dtype == torch.float32
    assert not aux.max_scores.requires_grad
    out_p, lse_p = ft.flex_attention(q, k, v, score_mod=soft_bias, block_mask=mask, enable_gqa=True,
                                     return_lse=True)
    assert torch.equal(out, out_p) and torch.equal(aux.lse, lse_p)

    qd, kd = q.detach().double(), k.detach().double().repeat_interleave(Hq // Hkv, dim=1)
    sc = (qd @ kd.transpose(-1, -2)) / math.sqrt(D)
    sc = 20.0 * torch.tanh(sc / 20.0) + bias.double()
    bi, qi, ki = (torch.arange(n, device="cuda") for n in (B, L, S))
    keep = mask_mod(bi[:, None, None, None], None, qi[None, None, :, None], ki[None, None, None, :])
    want = sc.masked_fill(~keep, float("-inf")).amax(dim=-1)
    got = aux.max_scores.double()
    masked = torch.isinf(want)
    assert masked.any() and torch.equal(torch.isinf(got), masked) and (got[masked] < 0).all()
    err = (got[~masked] - want[~masked]).abs().max().item()
    assert err < 2e-2, f"max_scores off by {err:.3g}"
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_an_int_scalar_beyond_int32_is_refused_without_a_gpu():
    """A captured 0-d integer tensor is passed as an int32 (fajit's kernels compute integers in
    32 bits): a value beyond it is an error naming the capture, not a silently wrapped one."""
    import fajit.torch as ft

    offset = torch.tensor(2**40)

    def shifted(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    key = ft._variant_key(None, shifted)
    bufs, scalars = ft._bind(key, torch.device("cpu"), "mask_mod")
    with pytest.raises(ValueError, match=r"captured scalar 'offset' = 1099511627776 is outside int32"):
        ft._ccaptures(ft._VARIANTS[key], bufs, scalars, [])
    offset.fill_(-(2**31))  # the ends of int32 pass
    ft._ccaptures(ft._VARIANTS[key], *ft._bind(key, torch.device("cpu"), "mask_mod"), [])


class _Batch:
    def __init__(self, doc_ids):
        self.doc_ids = doc_ids


class _Window:
    def __init__(self, lo):
        self.lo = lo

    def __call__(self, b, h, q_idx, kv_idx):
        return kv_idx >= self.lo[q_idx]


_STATE = {"ids": torch.zeros(8, dtype=torch.int32)}
_BATCH = _Batch(torch.zeros(8, dtype=torch.int32))


def test_a_captured_tensor_replaced_anywhere_the_mods_read_it_is_bound_anew():
    """Captured tensors are bound per call: one the mods reach through an object's attribute, a
    dict, a module attribute, a callable object or nested and_masks, replaced by another between
    calls, is the one the next call binds (the cached trace was kept before: silently stale)."""
    import sys
    import types

    import fajit.torch as ft

    def bound(score_mod, mask_mod):
        key = ft._variant_key(score_mod, mask_mod)
        return ft._CAPTURES[key][0]

    def by_attribute(b, h, q_idx, kv_idx):
        return _BATCH.doc_ids[q_idx] == _BATCH.doc_ids[kv_idx]

    def by_dict(b, h, q_idx, kv_idx):
        return _STATE["ids"][q_idx] == _STATE["ids"][kv_idx]

    mod = types.ModuleType("fajit_test_state")
    mod.IDS = torch.zeros(8, dtype=torch.int32)
    sys.modules[mod.__name__] = mod
    by_module = eval("lambda b, h, q_idx, kv_idx: state.IDS[q_idx] == state.IDS[kv_idx]", {"state": mod})

    def bias_by_dict(score, b, h, q_idx, kv_idx):
        return score + _STATE["bias"][h]

    global _BATCH
    try:
        _STATE["bias"] = torch.zeros(4)
        window = _Window(torch.zeros(8, dtype=torch.int32))
        nested = window
        for _ in range(6):
            nested = ft.and_masks(nested, ft.noop_mask)
        for step in range(2):
            new = torch.full((8,), step, dtype=torch.int32)
            _BATCH = _Batch(new.clone())
            _STATE["ids"] = new.clone()
            mod.IDS = new.clone()
            window.lo = new.clone()
            _STATE["bias"] = torch.full((4,), float(step))
            assert bound(None, by_attribute)[0] is _BATCH.doc_ids
            assert bound(None, by_dict)[0] is _STATE["ids"]
            assert bound(None, by_module)[0] is mod.IDS
            assert bound(None, window)[0] is window.lo
            assert bound(None, nested)[0] is window.lo
            assert bound(bias_by_dict, None)[0] is _STATE["bias"]
    finally:
        sys.modules.pop(mod.__name__, None)
        _STATE.pop("bias", None)


class _Table:
    table = torch.zeros(8)  # a class attribute


class _Slotted:
    __slots__ = ("ids",)

    def __init__(self, ids):
        self.ids = ids


class _Rel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Linear(1, 1)  # a submodule whose tensors the mod reads
        self.steps = 0

    def forward(self, x):
        self.steps += 1  # (a counter the mod never reads: no new trace per call)
        return x


def test_captures_found_where_the_mods_read_them_and_nowhere_else():
    """The trace cache sees a replaced tensor through a class attribute, a slot, an nn.Module's
    submodule, a partial's argument and a callable object the mod calls; a value a dict key the
    mod names changes is a new trace; what the mod does not read (another key of that dict, a
    counter a module's forward bumps) is not, and a long numeric list is not walked."""
    import functools

    import fajit.torch as ft

    calls = []
    real = ft._trace_variant

    def counting(*a):
        calls.append(1)
        return real(*a)

    slot = _Slotted(torch.zeros(8, dtype=torch.int32))
    rel = _Rel()

    class Lookup:
        def __init__(self, t):
            self.t = t

        def __call__(self, i):
            return self.t[i]

    look = Lookup(torch.zeros(8))
    cfg = {"window": 3, "history": [0.5] * 50, "cache": torch.zeros(2)}

    def by_class(score, b, h, q_idx, kv_idx):
        return score + _Table.table[q_idx]

    def by_slot(b, h, q_idx, kv_idx):
        return slot.ids[q_idx] == slot.ids[kv_idx]

    def by_submodule(score, b, h, q_idx, kv_idx):
        return score + rel.bias.weight[b, 0]

    def by_partial(obj, b, h, q_idx, kv_idx):
        return obj.ids[q_idx] >= kv_idx

    partial = functools.partial(by_partial, slot)

    def by_call(score, b, h, q_idx, kv_idx):
        return score + look(q_idx)

    def by_dict(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= cfg["window"]

    def bound(score_mod, mask_mod):
        key = ft._variant_key(score_mod, mask_mod)
        return ft._CAPTURES[key][0][0] if ft._CAPTURES[key][0] else None

    old = _Table.table
    ft._trace_variant = counting
    try:
        for step in range(2):
            _Table.table = torch.full((8,), float(step))
            slot.ids = torch.full((8,), step, dtype=torch.int32)
            rel.bias = torch.nn.Linear(1, 1)
            look.t = torch.full((8,), float(step))
            assert bound(by_class, None) is _Table.table
            assert bound(None, by_slot) is slot.ids
            assert bound(by_submodule, None) is rel.bias.weight
            assert bound(None, partial) is slot.ids
            assert bound(by_call, None) is look.t
        ft._variant_key(None, by_dict)
        rel(0)
        calls.clear()
        for _ in range(3):
            cfg["history"].append(1.0)  # not read by the mod
            cfg["cache"] = torch.zeros(2)
            rel(0)  # its forward counts its steps
            ft._variant_key(None, by_dict)
            ft._variant_key(by_submodule, None)
        assert not calls  # nothing the mods read changed: no new trace
        cfg["window"] = 5
        ft._variant_key(None, by_dict)
        assert len(calls) == 1  # the named key's value changed: traced again
    finally:
        ft._trace_variant = real
        _Table.table = old


def test_block_mask_api_edges_as_torchs_without_a_gpu():
    """torch's BlockMask API at its edges (found in review): from_kv_blocks; to_string with
    grid_size -1 (the whole grid) and limit 0; str() with the grids; index lists in two
    dimensions, an index past a dimension (CPU index) and an empty slice answer with errors that
    name the problem."""
    import dataclasses

    import fajit.torch as ft
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
    from torch.nn.attention.flex_attention import create_block_mask as torch_create_block_mask

    num = torch.tensor([[[2, 1, 1]]], dtype=torch.int32)
    idx = torch.tensor([[[[0, 2, 1], [1, 0, 2], [2, 0, 1]]]], dtype=torch.int32)
    fnum = torch.tensor([[[0, 1, 0]]], dtype=torch.int32)
    fidx = torch.tensor([[[[0, 1, 2], [0, 1, 2], [0, 1, 2]]]], dtype=torch.int32)
    for args in ((num, idx), (num, idx, fnum, fidx)):
        mine, theirs = ft.BlockMask.from_kv_blocks(*args), TorchBlockMask.from_kv_blocks(*args)
        assert mine.shape == theirs.shape == (1, 1, 384, 384)
        assert torch.equal(mine.to_dense(), theirs.to_dense())
    mine = ft.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(64, 128), seq_lengths=(150, 300))
    assert mine.shape == (1, 1, 150, 300) and mine.BLOCK_SIZE == (64, 128)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = ft.BlockMask.from_torch(torch_create_block_mask(causal, 2, 4, 1000, 1000, device="cpu"))
    whole = mask.to_string(grid_size=-1, limit=1).splitlines()
    assert whole[1] == "(0, 0)" and whole[2] == "+......." and len(whole) == 2 + 8 + 1
    assert whole[-1].startswith("... 7 more (batch, head) pairs")
    assert mask.to_string(limit=0).splitlines()[1].startswith("... 8 more (batch, head) pairs")
    assert len(mask.to_string(limit=-1).splitlines()) == 1 + 8 * 9
    assert str(mask).startswith(repr(mask)) and "(0, 0)" in str(mask)
    with pytest.raises(ValueError, match="grid_size is an int or a"):
        mask.to_string(grid_size="big")

    with pytest.raises(IndexError, match="more than one of .batch, head, query block"):
        mask[[0, 1], [1, 2]]
    with pytest.raises(IndexError, match="block_mask index 9 is out of range for the query blocks of size 8"):
        mask[:, :, torch.tensor([9])]
    empty = mask[:, :, 8:]
    assert repr(empty).endswith("empty)") and empty.to_string() == repr(empty) + "\n"
    with pytest.raises(ValueError, match="sparsity of an empty mask"):
        empty.sparsity()

    @dataclasses.dataclass
    class Window:  # __eq__ without __hash__: unhashable, as torch allows a mask_mod to be
        window: int

        def __call__(self, b, h, q_idx, kv_idx):
            return (q_idx - kv_idx).abs() <= self.window

    w = Window(64)
    first = ft._VARIANTS[ft._variant_key(None, w)].text
    w.window = 32
    assert ft._VARIANTS[ft._variant_key(None, w)].text != first  # a changed attribute traces again


@needs_gpu
def test_create_block_mask_without_a_device_takes_the_current_accelerator():
    """device=None (torch 2.11's default): the current accelerator, as torch's create_block_mask."""
    import fajit.torch as ft

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    a = ft.create_block_mask(causal, 1, 2, 300, 300)
    b = ft.create_block_mask(causal, 1, 2, 300, 300, device="cuda")
    assert a.kv_num_blocks.device.type == "cuda"
    assert torch.equal(a.to_dense(), b.to_dense())
