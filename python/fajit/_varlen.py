"""fajit.torch.flex_attention_varlen: flex_attention over ragged ("varlen": packed sequences of
different lengths) batches and paged KV caches, through the C API's fajit_kernel_forward_ex (the
library's fa::Sequences; runtime/include/fajit/sequences.h), with autograd for the packed layouts
(and dense ones beside them) through fajit_kernel_backward_ex: the custom ops
fajit::flex_varlen_fwd / fajit::flex_varlen_bwd, and eagerly _VarlenFunction, as fajit.torch's
flex_attention does for dense tensors. Paged and padded caches are inference layouts: the library
has no backward for them.

Imported by fajit.torch (its public home), whose variant, kernel, block-mask and C-struct
helpers it shares (imported at the end: fajit.torch imports this module at its own end, and
either may be imported first).
"""
from __future__ import annotations

import ctypes as C
import math
import operator
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _capi

__all__ = ["flex_attention_varlen"]

_TABLES = ("cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "page_table")
_TABLE_SHAPES = {"cu_seqlens_q": "[B+1]", "cu_seqlens_k": "[B+1]", "seqlens_k": "[B]",
                 "page_table": "[B, max_pages]"}
# (rank, shape) of key and value ({E}: E or Ev) per key layout
_KV_LAYOUTS = {"packed": (3, "[total_k, Hkv, {E}] (cu_seqlens_k given: packed keys)"),
               "paged": (4, "[num_pages, page_size, Hkv, {E}] (page_table given: a page pool)"),
               "dense": (4, "[B, Hkv, S, {E}] (neither cu_seqlens_k nor page_table given)")}
_NOTES = {"lens": "the call has max_seqlen_q={L} and max_seqlen_k={S}",
          "sizes": "the call has B={B} sequences and H={H} query heads", "len_q": "max_seqlen_q={L}"}


def _out_shapes(q, v, packed_q):
    """out and lse shapes: packed [total_q, Hq, Dv] and [Hq, total_q], else [B, Hq, L, Dv] and [B, Hq, L]."""
    if packed_q:
        total, Hq = q.shape[0], q.shape[1]
        return (total, Hq, v.shape[-1]), (Hq, total)
    B, Hq, L = q.shape[0], q.shape[1], q.shape[2]
    return (B, Hq, L, v.shape[-1]), (B, Hq, L)


def _set_tensors(opts, named, keep):
    """Point the options' tensor fields (tables, dlse) at the (name, tensor) pairs given (None:
    not given)."""
    for name, t in named:
        if t is not None:
            ct = _ctensor(t)
            keep.append(ct)
            setattr(opts, name, C.pointer(ct))


def _varlen_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                     seqlens_k: Optional[Tensor], page_table: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                     variant: str, scale: float, tables: List[Tensor], mask_info: List[int], buffers: List[Tensor],
                     scalars: List[Tensor], path: int, decode_splits: int, check_tables: bool,
                     want_max: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """out, the LSE, and with want_max each row's largest score laid out as the LSE (else an
    empty tensor)."""
    oshape, lshape = _out_shapes(q, v, cu_seqlens_q is not None)
    out = torch.empty(oshape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lshape, dtype=torch.float32, device=q.device)
    mx = torch.empty(lshape if want_max else (0,), dtype=torch.float32, device=q.device)
    # What the library takes no tensors for (it wants data): no query at all, or no key at all
    # (every row then attends to nothing: 0 and -inf, as the kernels write for an empty sequence).
    if max_seqlen_q == 0 or q.numel() == 0:
        return out, lse, mx
    if max_seqlen_k == 0 or k.numel() == 0 or v.numel() == 0:
        return out.zero_(), lse.fill_(-math.inf), mx.fill_(-math.inf)
    var = _VARIANTS[variant]
    keep = []
    with _on_device(q.device):
        kern = _kernel(var, q.dtype, q.shape[-1], v.shape[-1], q.device)
        mask = _mask_for(tables, mask_info, 0, 0, q.device)
        caps = _ccaptures(var, buffers, scalars, keep)
        ts = [_ctensor(t) for t in (q, k, v, out, lse)]
        opts = _capi.forward_options()
        opts.scale, opts.path, opts.decode_splits, opts.check_tables = scale, path, decode_splits, int(check_tables)
        _set_tensors(opts, zip(_TABLES, (cu_seqlens_q, cu_seqlens_k, seqlens_k, page_table)), keep)
        _set_tensors(opts, (("max_scores", mx if want_max else None),), keep)
        # the library takes max_seqlen_* only with the tables they bound (dense: the tensor's length)
        opts.max_seqlen_q = max_seqlen_q if cu_seqlens_q is not None else 0
        opts.max_seqlen_k = max_seqlen_k if cu_seqlens_k is not None or page_table is not None else 0
        _capi.check(_capi.lib().fajit_kernel_forward_ex(
            kern.handle, *[C.byref(t) for t in ts], C.byref(opts), mask.h, C.byref(caps), _stream(q.device)),
            "flex_attention_varlen")
    return out, lse, mx


# The op for torch.compile; eager calls run _varlen_fwd_impl directly, or through _VarlenFunction
# when autograd records them (the custom op's dispatch costs more host time than a short decode).
_varlen_fwd = torch.library.custom_op("fajit::flex_varlen_fwd", mutates_args=())(_varlen_fwd_impl)


@_varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqlens_k, page_table, max_seqlen_q, max_seqlen_k, variant, scale, tables,
      mask_info, buffers, scalars, path, decode_splits, check_tables, want_max):
    oshape, lshape = _out_shapes(q, v, cu_seqlens_q is not None)
    return (q.new_empty(oshape), q.new_empty(lshape, dtype=torch.float32),
            q.new_empty(lshape if want_max else (0,), dtype=torch.float32))


def _grads_like(q, k, v, zero_q, zero_kv):
    """dq, dk, dv laid out as q, k, v: zeros where asked (a packed tensor, whose rows outside every
    sequence the library leaves unwritten; or a call that never reaches it), else for the kernels."""
    def like(t, zero):
        return torch.zeros_like(t) if zero else torch.empty_like(t)
    return like(q, zero_q), like(k, zero_kv), like(v, zero_kv)


def _varlen_bwd_impl(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: int, variant: str, scale: float, tables: List[Tensor], mask_info: List[int],
                     buffers: List[Tensor], scalars: List[Tensor], buffer_grads: List[bool],
                     check_tables: bool) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    # The forward's short cuts (no query, or no key at all) reached no kernel: no gradient flows.
    empty = (max_seqlen_q == 0 or q.numel() == 0 or max_seqlen_k == 0 or k.numel() == 0 or v.numel() == 0)
    dq, dk, dv = _grads_like(q, k, v, empty or cu_seqlens_q is not None, empty or cu_seqlens_k is not None)
    dbufs = _grad_buffers(buffers, buffer_grads)
    if empty:
        return dq, dk, dv, dbufs
    var = _VARIANTS[variant]
    keep = []
    dout = _rows(dout)  # autograd's, in whatever layout the loss made
    dlse = dlse.contiguous() if dlse is not None else None  # [Hq, total_q] rows contiguous along total_q
    with _on_device(q.device):
        kern = _kernel(var, q.dtype, q.shape[-1], v.shape[-1], q.device)
        mask = _mask_for(tables, mask_info, 0, 0, q.device)
        caps = _ccaptures(var, buffers, scalars, keep)
        grads = _cbuffer_grads(var, dbufs, buffer_grads, keep)
        ts = [_ctensor(t) for t in (q, k, v, out, lse, dout, dq, dk, dv)]
        opts = _capi.backward_options()
        opts.scale, opts.check_tables = scale, int(check_tables)
        opts.deterministic = _deterministic(buffer_grads)
        _set_tensors(opts, (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("dlse", dlse)), keep)
        opts.max_seqlen_q = max_seqlen_q if cu_seqlens_q is not None else 0
        opts.max_seqlen_k = max_seqlen_k if cu_seqlens_k is not None else 0
        _capi.check(_capi.lib().fajit_kernel_backward_ex(
            kern.handle, *[C.byref(t) for t in ts], C.byref(opts), mask.h, C.byref(caps),
            C.byref(grads) if grads is not None else None, _stream(q.device)), "flex_attention_varlen backward")
    return dq, dk, dv, dbufs


_varlen_bwd = torch.library.custom_op("fajit::flex_varlen_bwd", mutates_args=())(_varlen_bwd_impl)


@_varlen_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, variant, scale, tables,
      mask_info, buffers, scalars, buffer_grads, check_tables):
    return (*_grads_like(q, k, v, False, False), _grad_buffers(buffers, buffer_grads))


def _varlen_setup_context(ctx, inputs, output):
    """fajit::flex_varlen_fwd's autograd context (its packed or dense layouts only: the call
    refuses grad for paged and padded keys before the op)."""
    (q, k, v, cu_q, cu_k, _, _, max_q, max_k, variant, scale, tables, mask_info, buffers, scalars, _, _,
     check_tables, _) = inputs
    out, lse, mx = output
    ctx.mark_non_differentiable(mx)  # the row maxima carry no gradient (as flex_attention's)
    ctx.lens, ctx.variant, ctx.scale, ctx.mask_info = (max_q, max_k), variant, scale, mask_info
    ctx.check_tables, ctx.n_tables, ctx.n_buffers = check_tables, len(tables), len(buffers)
    ctx.buffer_grads = _wanted_grads(variant, buffers)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, *tables, *buffers, *scalars)


def _varlen_backward(ctx, dout, dlse, dmax=None, bwd=None):
    """The custom op's autograd (bwd: the fajit::flex_varlen_bwd op, which torch.compile traces
    with fake tensors) and _VarlenFunction's (bwd=_varlen_bwd_impl)."""
    q, k, v, out, lse, cu_q, cu_k, *rest = ctx.saved_tensors
    n, m = ctx.n_tables, ctx.n_tables + ctx.n_buffers
    tables, buffers, scalars = list(rest[:n]), list(rest[n:m]), list(rest[m:])
    if dout is None:  # only the LSE is used
        dout = torch.zeros_like(out)
    # (_VarlenFunction's inputs: 16 before the tables; the custom op's: buffers are its 14th argument)
    wanted = _buffer_grads_asked(ctx, flat_first=16 + n) if bwd is not None else \
        _buffer_grads_asked(ctx, list_index=13)
    dq, dk, dv, dbufs = (bwd or _varlen_bwd)(dout, dlse, q, k, v, out, lse, cu_q, cu_k, *ctx.lens, ctx.variant,
                                             ctx.scale, tables, ctx.mask_info, buffers, scalars, wanted,
                                             ctx.check_tables)
    gb = [g if want else None for g, want in zip(dbufs, wanted)]
    # one entry per input of the op, tensor lists as long as the input lists (torch checks the structure)
    return (dq, dk, dv) + (None,) * 8 + ([None] * n, None, gb, [None] * len(scalars), None, None, None, None)


_varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


class _VarlenFunction(torch.autograd.Function):
    """Eager autograd of flex_attention_varlen (packed or dense layouts), as fajit.torch's
    _FlexFunction: the custom ops' own forward, context and backward without their dispatch.
    Tensor lists are flattened so autograd sees the captured buffers as inputs."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, variant, scale, info, path, splits, check, want_max, n_tables,
                n_buffers, *rest):
        n, m = n_tables, n_tables + n_buffers
        inputs = (q, k, v, cu_q, cu_k, None, None, max_q, max_k, variant, scale, list(rest[:n]), info,
                  list(rest[n:m]), list(rest[m:]), path, splits, check, want_max)
        ctx.set_materialize_grads(False)  # an unused out or LSE gets no zero gradient
        out, lse, mx = _varlen_fwd_impl(*inputs)
        _varlen_setup_context(ctx, inputs, (out, lse, mx))
        return out, lse, mx

    @staticmethod
    def backward(ctx, dout, dlse, dmax):
        g = _varlen_backward(ctx, dout, dlse, dmax, _varlen_bwd_impl)
        # forward's inputs: q, k, v, 13 non-tensors (and tables), then tables, buffers, scalars
        return (*g[:3], *[None] * 13, *g[11], *g[13], *g[14])


def _length(name, value):
    """A non-negative Python int (or another integer type that is not a tensor, e.g. numpy's)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, (bool, Tensor)) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = operator.index(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _max_length(name, value, table, dense_len):
    """max_seqlen_q / _k: required with its table (`table` names it), else the dense length (or None)."""
    if table is not None:
        if value is None:
            raise ValueError(f"{name} is required with {table}: the most {'queries' if name.endswith('q') else 'keys'}"
                             f" of any sequence, a Python int (fajit does not read the table back: that would "
                             f"synchronize with the GPU)")
        # int(): under torch.compile, dynamo makes an int argument symbolic once a second value
        # recompiles the caller, and inductor then fails to bind a symbol that only reaches the
        # op (NameError in its generated code); int() specializes it to the value instead, one
        # graph per value, as the kernels take it (a constant of the call).
        return int(_length(name, value))
    if value is not None and _length(name, value) != dense_len:
        raise ValueError(f"{name}: dense {'queries' if name.endswith('q') else 'keys'} hold {dense_len} per sequence "
                         f"(dimension 2), got {name}={value}; leave it None")
    return dense_len


def flex_attention_varlen(query, key, value, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                          max_seqlen_k=None, *, seqlens_k=None, page_table=None, score_mod=None, block_mask=None,
                          scale=None, enable_gqa=False, return_lse=False, path="auto", decode_splits=0,
                          check_tables=False, return_aux=None):
    """flex_attention over ragged (packed, variable-length) batches and paged KV caches, with
    autograd for packed (and dense) layouts. Positional arguments follow flash-attn's
    flash_attn_varlen_func.

    Queries (fp16/bf16; E and Ev multiples of 8 from 32 to 256):
      packed, cu_seqlens_q given: query [total_q, Hq, E], sequence b's queries are rows
          cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1; returns out [total_q, Hq, Ev] and (return_lse)
          lse [Hq, total_q] (flash-attn's varlen LSE layout). Rows no sequence covers are left unwritten.
      dense, no cu_seqlens_q: query [B, Hq, L, E] (flex_attention's; flash-attn's [B, L, Hq, E] is
          query.transpose(1, 2)); returns out [B, Hq, L, Ev] and lse [B, Hq, L].
    Keys and values (Hq a multiple of Hkv; enable_gqa=True when they differ):
      packed, cu_seqlens_k given: key [total_k, Hkv, E], value [total_k, Hkv, Ev].
      paged, page_table and seqlens_k given: key [num_pages, page_size, Hkv, E] and value
          [num_pages, page_size, Hkv, Ev] pools; key j of sequence b is row j % page_size of page
          page_table[b, j // page_size], and it has seqlens_k[b] keys (vLLM's block tables: entries
          past a sequence's pages are never read); the pools' page and row strides must each be
          under 2^31 bytes.
      dense, neither: key [B, Hkv, S, E], value [B, Hkv, S, Ev]; with seqlens_k, a padded cache
          (flash_attn_with_kvcache's cache_seqlens): keys at or past seqlens_k[b] are never read.
    Tables are int32 CUDA tensors on query's device: cu_seqlens_q / cu_seqlens_k [B+1] (non-
    decreasing offsets), seqlens_k [B], page_table [B, max_pages]. max_seqlen_q / max_seqlen_k are
    Python ints, the most queries / keys of any sequence: required with cu_seqlens_q / with
    cu_seqlens_k or page_table (dense tensors have theirs in dimension 2: leave them None). The
    tables can change from call to call without compiling anything.

    score_mod and block_mask work as in flex_attention; the mods see each sequence's own
    positions (q_idx and kv_idx from 0 at its first query and key) and its index b. The block
    mask is for [B or 1, H or 1, max_seqlen_q, max_seqlen_k]:
    create_block_mask(mask_mod, None, None, max_seqlen_q, max_seqlen_k). q_idx >= kv_idx is
    causal from each sequence's start (top-left); with more keys than queries (decoding, chunked
    prefill), shift it with a captured tensor: q_idx + (seqlens_k[b] - seqlens_q[b]) >= kv_idx.
    A query row left without any key (none, or all masked) gives 0 and an LSE of -inf.

    return_aux=AuxRequest(lse=..., max_scores=...) (flex_attention's) returns (out, AuxOutput):
    the LSE and each row's largest score after score_mod and the mask, both laid out as the LSE
    above (max_scores: -inf for a row without any key; no gradient); not with return_lse.

    scale: as flex_attention's (None: 1/sqrt(E)). path: "auto" (the split-KV decoding kernel for
    short queries: max_seqlen_q <= 64, else the prefill kernel), "prefill", or "decode"
    (max_seqlen_q <= 64); decode_splits: the decoding kernel's KV splits (0: enough to fill the
    GPU). check_tables=True copies the tables to the host and checks them before the launch
    (synchronizing the stream; a debugging aid): otherwise tables that break the rules above are
    undefined behaviour.

    Training: with packed keys or dense ones (no page_table, no seqlens_k), autograd gives the
    gradients of query, key and value (packed like them: rows in no sequence get 0; GQA sums a
    KV head's query heads), of the float tensors the score_mod reads that require grad (fp32,
    accumulated into .grad as flex_attention's), and lets the LSE of return_lse=True take part
    in the loss. The backward kernels are compiled on its first call. Paged (page_table) and
    padded (seqlens_k) caches are inference layouts without a backward: with grad mode on, a
    query, key or value (or a float tensor the score_mod reads) that requires grad raises
    NotImplementedError naming the table; run them under torch.no_grad() or
    torch.inference_mode(), or pass detached tensors.

    Runs as the custom ops fajit::flex_varlen_fwd / fajit::flex_varlen_bwd on the current CUDA
    stream (torch.compile keeps them in its graph; max_seqlen_* are constants there)."""
    # 1. What every argument is, without touching a device (these run without a GPU).
    _check_aux(return_lse, return_aux)
    _check_types((("query", query), ("key", key), ("value", value)))
    given = {n: t for n, t in zip(_TABLES, (cu_seqlens_q, cu_seqlens_k, seqlens_k, page_table)) if t is not None}
    _check_types(given.items())
    if not given:
        raise ValueError("flex_attention_varlen: give cu_seqlens_q, cu_seqlens_k, page_table (with seqlens_k) or "
                         "seqlens_k; without any, use flex_attention")
    for name, t in given.items():
        rank = 2 if name == "page_table" else 1
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimension{'s' if rank > 1 else ''} {_TABLE_SHAPES[name]}, got "
                             f"shape {list(t.shape)}")
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    if cu_seqlens_k is not None and page_table is not None:
        raise ValueError("cu_seqlens_k and page_table: keys are either packed or paged, give one")
    if cu_seqlens_k is not None and seqlens_k is not None:
        raise ValueError("cu_seqlens_k and seqlens_k: packed keys take their counts from cu_seqlens_k, give one")
    if page_table is not None and seqlens_k is None:
        raise ValueError("page_table needs seqlens_k (each sequence's key count)")
    packed_q = cu_seqlens_q is not None
    kv = "packed" if cu_seqlens_k is not None else "paged" if page_table is not None else "dense"
    q_layout = ((3, "[total_q, Hq, E] (cu_seqlens_q given: packed queries)") if packed_q
                else (4, "[B, Hq, L, E] (no cu_seqlens_q: dense queries)"))
    for name, t, (rank, layout) in (("query", query, q_layout), ("key", key, _KV_LAYOUTS[kv]),
                                    ("value", value, _KV_LAYOUTS[kv])):
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dimensions {layout.format(E='Ev' if name == 'value' else 'E')}"
                             f", got shape {list(t.shape)}")
        _check_dtype(name, t)
    _check_one_dtype(query, key, value)
    _check_heads(query.shape[1], key.shape[2] if kv == "paged" else key.shape[1], enable_gqa)
    _check_head_dims(query, key, value)
    L = _max_length("max_seqlen_q", max_seqlen_q, "cu_seqlens_q" if packed_q else None,
                    None if packed_q else query.shape[2])
    S = _max_length("max_seqlen_k", max_seqlen_k, {"packed": "cu_seqlens_k", "paged": "page_table"}.get(kv),
                    key.shape[2] if kv == "dense" else None)
    scale = _check_scale(scale)
    if not isinstance(path, str) or path not in _capi.PATHS:
        raise ValueError(f"path must be 'auto', 'prefill' or 'decode', got {path!r}")
    decode_splits = _length("decode_splits", decode_splits)
    # the inference layouts: what the backward refuses (the table named in its errors), else None
    cache = "page_table" if page_table is not None else "seqlens_k" if seqlens_k is not None else None
    if cache is not None and torch.is_grad_enabled():
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.requires_grad:
                raise NotImplementedError(_no_backward(f"{name} requires grad", cache))

    # 2. Where they are.
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_cuda(name, t)
    _check_one_device(query, key, value)
    for name, t in given.items():
        if t.device != query.device:
            raise ValueError(f"{name} must be on query's device ({query.device}), got {t.device}")

    # 3. The variant and the call (the library checks the tables against each other and the tensors).
    B = (cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else cu_seqlens_k.shape[0] - 1
         if cu_seqlens_k is not None else (seqlens_k if seqlens_k is not None else page_table).shape[0])
    Hq = query.shape[1]
    mask_mod, mtables, info = _block_mask_args(block_mask, B, Hq, L, S, query.device, _NOTES)
    _guard_mods(score_mod, mask_mod, query.device)
    vkey = _variant_key(score_mod, mask_mod)
    buffers, scalars = _bind(vkey, query.device, "score_mod")
    if cache is not None:  # no autograd past here: the op must not record one it cannot run
        if torch.is_grad_enabled():
            var = _VARIANTS[vkey]
            for name, b in zip(var.buffer_names, buffers):
                if b.requires_grad and var.gradient.get(name, False):
                    raise NotImplementedError(_no_backward(f"score_mod reads '{name}', which requires grad", cache))
        buffers = [b.detach() for b in buffers]
    q, k, v = _rows(query), _rows(key), _rows(value)
    tabs = [_rows(t) if t is not None else None for t in (cu_seqlens_q, cu_seqlens_k, seqlens_k, page_table)]
    want_max = bool(return_aux is not None and return_aux.max_scores)
    run = (_capi.PATHS[path], decode_splits, bool(check_tables), want_max)
    args = (q, k, v, *tabs, L, S, vkey, scale, mtables, info, buffers, scalars, *run)
    if torch.compiler.is_compiling():
        out, lse, mx = torch.ops.fajit.flex_varlen_fwd(*args)
    elif _records_grad((query, key, value), vkey, buffers):
        out, lse, mx = _VarlenFunction.apply(q, k, v, *tabs[:2], L, S, vkey, scale, info, *run, len(mtables),
                                             len(buffers), *mtables, *buffers, *scalars)
    else:
        out, lse, mx = _varlen_fwd_impl(*args)
    if return_aux is not None:
        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=mx if want_max else None)
    if return_lse:
        return out, lse
    return out


def _no_backward(what, table):
    """Why a call with `table` (page_table or seqlens_k) cannot record autograd."""
    layout = "a paged KV cache" if table == "page_table" else "a padded KV cache"
    return (f"flex_attention_varlen: {what} with grad mode on, but {table} makes the keys {layout}, an inference "
            f"layout with no backward (the backward takes packed (cu_seqlens) or dense layouts); call it under "
            f"torch.no_grad() or torch.inference_mode(), or pass detached tensors")


# fajit.torch's helpers, read when called (this module is imported at the end of fajit.torch)
from .torch import (_VARIANTS, AuxOutput, _bind, _block_mask_args, _buffer_grads_asked, _cbuffer_grads,  # noqa: E402
                    _ccaptures, _guard_mods,
                    _check_aux, _check_cuda,
                    _check_dtype, _check_head_dims, _check_heads, _check_one_device, _check_one_dtype, _check_scale,
                    _check_types, _ctensor, _deterministic, _grad_buffers, _kernel, _mask_for, _on_device,
                    _records_grad, _rows,
                    _stream, _variant_key, _wanted_grads)
