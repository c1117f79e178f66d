"""fajit as a drop-in for torch.nn.attention.flex_attention.

    from fajit.torch import flex_attention, create_block_mask   # instead of torch's

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    mask = create_block_mask(causal, B, H, L, L)
    out = flex_attention(q, k, v, score_mod=my_score_mod, block_mask=mask)
    out.sum().backward()                                   # dq, dk, dv, captured float tensors

Same argument names, shapes, dtypes and results as torch's. The mods are traced once per
(score_mod, mask_mod) into fa IR (fajit._trace) and compiled per variant, dtype and head dims
(kept in memory here; libfajit also keeps cubins on disk). Captured tensors are bound at call
time (a captured 0-d tensor is a runtime value: a new value never recompiles; a CPU one is passed
by value, a GPU one read on the device, with no host sync, and a float one gets a gradient). The kernels run
as the custom ops fajit::flex_fwd / fajit::flex_bwd (torch.library.custom_op, with fake
implementations and autograd), on the current CUDA stream of the query's device, so
torch.compile keeps them in its graph. Eager calls skip the ops' dispatch (~120 us of host
time a forward, ~0.3 ms an op with autograd): one that needs no gradient calls the same
implementation directly, one that does goes through _FlexFunction, an autograd.Function over
the ops' own forward, context and backward.

flex_attention_varlen (fajit._varlen, on the same helpers) takes ragged (packed) batches and
paged KV caches, as the custom ops fajit::flex_varlen_fwd / fajit::flex_varlen_bwd (a backward
for packed and dense layouts; paged and padded caches are forward only).

Inside torch.compile, define mods outside the compiled function (module level or closures made
before): the trace runs once at compile time (torch._dynamo.assume_constant_result) and the
captured tensors reach the graph from a module-level registry.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes as C
import functools
import hashlib
import inspect
import math
import operator
import threading
import warnings
import weakref
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from . import Program, _capi
from ._trace import Buffer, Scalar, _name_hints, check_mod, trace

__all__ = ["flex_attention", "flex_attention_varlen", "create_block_mask", "create_mask", "BlockMask", "AuxRequest",
           "AuxOutput", "noop_mask", "and_masks", "or_masks"]

# The dense [B, H, Q_LEN, KV_LEN] mask of a mod, for inspection: torch's own (eager, vmapped),
# which fajit has no reason to redo.
from torch.nn.attention.flex_attention import create_mask  # noqa: E402

try:  # torch's own (2.9 and later), so an AuxRequest made from either module is accepted
    from torch.nn.attention.flex_attention import AuxOutput, AuxRequest
except ImportError:
    class AuxRequest(NamedTuple):
        """Which auxiliary outputs flex_attention returns (torch.nn.attention.flex_attention's)."""
        lse: bool = False
        max_scores: bool = False

    class AuxOutput(NamedTuple):
        """flex_attention's auxiliary outputs; None where not requested."""
        lse: Optional[Tensor] = None
        max_scores: Optional[Tensor] = None

_DTYPES = {torch.float16: ("f16", _capi.F16), torch.bfloat16: ("bf16", _capi.BF16)}
_lock = threading.RLock()


# ---- variants: traced mods, their captures, compiled kernels --------------------------------

class _Variant:
    def __init__(self, key, text, buffer_names, scalar_names, buffer_kinds, scalar_kinds, objects):
        self.key = key
        self.text = text
        self.text_key = hashlib.sha1(text.encode()).hexdigest()  # kernels are shared by IR
        self.buffer_names = buffer_names
        self.scalar_names = scalar_names
        self.buffer_kinds = buffer_kinds  # "f32" | "i32"
        self.scalar_kinds = scalar_kinds
        self.objects = objects  # name -> captured object (kept alive while the variant is)
        self.program = None  # parsed on first compile
        self.gradient = None  # buffer name -> has a gradient (from the library)
        self.score_scalars = frozenset()  # float runtime scalars the score_mod reads (from the library)


# A variant is the traced IR plus the objects it captures: its key hashes both, so two mods
# with one IR and different tensors are two variants sharing kernels, and a mod made afresh on
# every call (a lambda) capturing the same tensors is one variant.
_VARIANTS = collections.OrderedDict()  # key -> _Variant (least recently used first)
_CAPTURES = {}  # key -> (buffer tensors, scalar tensors): read by flex_attention (and by dynamo)
_PROGRAMS = {}  # text_key -> (fajit.Program, {buffer name: has a gradient})
# (id(score_mod), id(mask_mod)) -> (key, hints snapshot, score_mod, mask_mod): by identity, as a
# mod object need not be hashable (a dataclass with __eq__ is not); the entry keeps both alive
_BY_FUNCS = collections.OrderedDict()
_MAX_FUNCS = 1024
_MAX_VARIANTS = 4096


def _snapshot(score_mod, mask_mod):
    values, reached = [], set()
    _name_hints([score_mod, mask_mod], values, reached)
    # ids of the tensors/declarations the mods reach, and the plain values (numbers, strings) they
    # read, which the trace bakes in: another value traces again
    return tuple(sorted(reached)), tuple(values)


def _trace_variant(score_mod, mask_mod):
    t = trace(score_mod, mask_mod)
    buffers, scalars, bkinds, skinds = [], [], [], []
    for name, kind in t.kinds.items():
        obj = t.objects[name]
        if isinstance(obj, (Buffer, Scalar)):
            raise TypeError(f"the mods capture {obj!r}, a declaration without data: with fajit.torch, capture "
                            "a tensor instead (a 0-d tensor for a runtime scalar)")
        if kind[0] == "buffer":
            buffers.append(name)
            bkinds.append(kind[1])
        else:
            scalars.append(name)
            skinds.append(kind[1])
    ident = ",".join(f"{n}={id(t.objects[n])}" for n in buffers + scalars)
    key = hashlib.sha1((t.text + "\0" + ident).encode()).hexdigest()
    return _Variant(key, t.text, buffers, scalars, bkinds, skinds, t.objects)


def _guard_mods(score_mod, mask_mod, device):
    """A call's mods before _variant_key: a sliced BlockMask's mask_mod not set again raises its
    error here (not from inside a compiled dry run). Inside torch.compile the mods run once on
    zeros (every call's domain holds b = h = q = kv = 0), their result unused, so that dynamo
    guards on the Python values they read (a global softcap, self.window) as it does for torch's
    flex_attention: _variant_key is a constant to the graph, and a changed value then recompiles
    instead of running the old trace."""
    if mask_mod is _sliced_mask_mod_error:
        _sliced_mask_mod_error(0, 0, 0, 0)
    if not torch.compiler.is_compiling():
        return
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    z = torch.zeros((), dtype=torch.int32, device=device)
    # Captured tensors indexed by the zeros as torch's flex_attention indexes them (no .item()).
    # A mod torch cannot run (fajit's own helpers, an integer to a negative power) is left out:
    # fajit's tracer takes it, and the guards are then what dynamo saw before the failure.
    with TransformGetItemToIndex():
        if score_mod is not None:
            try:
                score_mod(torch.zeros((), dtype=torch.float32, device=device), z, z, z, z)
            except Exception:  # noqa: BLE001
                pass
        if mask_mod is not None:
            try:
                mask_mod(z, z, z, z)
            except Exception:  # noqa: BLE001
                pass


@torch.compiler.assume_constant_result
def _variant_key(score_mod, mask_mod):
    """The variant of (score_mod, mask_mod), traced on first use (again when what the mods
    capture changes); its captured tensors are put in _CAPTURES[key]."""
    with _lock:
        fkey = (id(score_mod), id(mask_mod))
        snap = _snapshot(score_mod, mask_mod)
        hit = _BY_FUNCS.get(fkey)
        if (hit is not None and hit[2] is score_mod and hit[3] is mask_mod and hit[1] == snap
                and hit[0] in _CAPTURES):
            _BY_FUNCS.move_to_end(fkey)
            _VARIANTS.move_to_end(hit[0])
            return hit[0]
        v = _trace_variant(score_mod, mask_mod)
        prog = _PROGRAMS.get(v.text_key)
        if prog is None:
            p = Program(v.text)  # verified now: errors surface at the call
            caps = p.captures()
            prog = _PROGRAMS[v.text_key] = (p, {c["name"]: c["has_gradient"] for c in caps},
                                            frozenset(c["name"] for c in caps if not c["is_buffer"] and c["is_float"]
                                                      and c["used_by_score"]))
        v.program, v.gradient, v.score_scalars = prog
        _VARIANTS[v.key] = v
        _VARIANTS.move_to_end(v.key)
        _CAPTURES[v.key] = (tuple(v.objects[n] for n in v.buffer_names), tuple(v.objects[n] for n in v.scalar_names))
        _BY_FUNCS[fkey] = (v.key, snap, score_mod, mask_mod)
        while len(_BY_FUNCS) > _MAX_FUNCS:
            _BY_FUNCS.popitem(last=False)
        # Keep the captured tensors of the most recent variants only (the rest is small and stays:
        # a backward may still run with an old variant's tensors, which autograd holds).
        while len(_CAPTURES) > _MAX_VARIANTS:
            old = next(k for k in _VARIANTS if k in _CAPTURES)
            _CAPTURES.pop(old)
            _VARIANTS[old].objects = None
        return v.key


_KERNELS = {}  # (text_key, dtype, dqk, dv, device index) -> fajit.Kernel


def _kernel(variant, dtype, dqk, dv, device, backward=False):
    """The variant's kernel for these types and head dims, compiled on first use; `backward`
    (a call autograd records): its backward kernels then compile in the background meanwhile,
    so the first backward does not wait for a compile of its own."""
    k = (variant.text_key, dtype, dqk, dv, device.index)
    kern = _KERNELS.get(k)
    if kern is not None:
        return kern
    with _lock:
        kern = _KERNELS.get(k)
        if kern is None:
            from . import Kernel

            kern = Kernel(variant.program, _DTYPES[dtype][0], dqk, dv, backward_in_background=backward)
            _KERNELS[k] = kern
    return kern


# ---- C API structs from torch tensors -------------------------------------------------------

def _ctensor(t, code=None):
    x = _capi.Tensor()
    x.data = t.data_ptr()
    x.dtype = code if code is not None else (_DTYPES[t.dtype][1] if t.dtype in _DTYPES else
                                             _capi.F32 if t.dtype == torch.float32 else _capi.I32)
    x.rank = n = t.dim()
    x.shape[:n] = t.shape
    x.stride[:n] = t.stride()
    return x


def _ccaptures(variant, buffers, scalars, keep):
    caps = _capi.Captures()
    if buffers:
        arr = (_capi.BufferCapture * len(buffers))()
        for i, (name, t) in enumerate(zip(variant.buffer_names, buffers)):
            arr[i].name = name.encode()
            arr[i].tensor = _ctensor(t)
        caps.buffers, caps.num_buffers = arr, len(buffers)
        keep.append(arr)
    if scalars:
        arr = (_capi.ScalarCapture * len(scalars))()
        for i, (name, kind, t) in enumerate(zip(variant.scalar_names, variant.scalar_kinds, scalars)):
            arr[i].name = name.encode()
            value = t.item()
            if kind == "f32":
                arr[i].is_float, arr[i].f = 1, float(value)
            else:
                value = int(value)
                if not -2**31 <= value < 2**31:  # (ctypes would wrap it silently)
                    raise ValueError(f"captured scalar '{name}' = {value} is outside int32, in which fajit's "
                                     "kernels compute indices and integer captures")
                arr[i].is_float, arr[i].i = 0, value
        caps.scalars, caps.num_scalars = arr, len(scalars)
        keep.append(arr)
    return caps


# The current stream of a device as a CUstream, without building a torch.cuda.Stream (a few
# microseconds a call, which a short decode's host time shows): the raw getter Inductor's own
# generated code calls, else the public API.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device):
    if _RAW_STREAM is not None and device.index is not None:
        return C.c_void_p(_RAW_STREAM(device.index))
    return C.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _on_device(device):
    """torch.cuda.device(device) for a call's C API work, from its index (no parsing)."""
    return torch.cuda.device(device.index if device.index is not None else device)


# ---- block masks ----------------------------------------------------------------------------

class _MaskHandle:
    """A fajit_block_mask, destroyed with this object."""

    def __init__(self, handle):
        self.h = handle
        self.lib = _capi.lib()

    def __del__(self):
        if self.h:
            self.lib.fajit_block_mask_destroy(self.h)
            self.h = None


# _tables_key(tables, info) -> (weakrefs to what the tables view, their _versions, _MaskHandle):
# the handle behind a set of tables at a call's lengths, found again when the tables come back
# through the custom ops. A slice or an expanded view of a mask's tables starts where they do,
# so shapes and strides are part of the key; so are the lengths (torch's decoding recipe sets
# seq_lengths = (1, KV_LEN) on a mask[:, :, i]). An entry lives as long as the tensors its tables
# view, so a view made again (every decoding step) finds it.
_DECODE_MAX_LEN_Q = 64  # the decoding kernel's query rows (fa::kDecodeMaxLenQ)
_MASKS = {}


def _tables_key(tables, info):
    return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride())) for t in tables) + (tuple(info),)


def _owner(t):
    return t._base if t._base is not None else t


def _weak_entry(registry, key, objects, *rest):
    """registry[key] = (weakrefs to objects, *rest), removed when one of the objects goes (and
    the entry is still the one made here)."""
    def forget(ref):
        entry = registry.get(key)
        if entry is not None and any(r is ref for r in entry[0]):
            del registry[key]

    registry[key] = ([weakref.ref(o, forget) for o in objects], *rest)


def _register_mask(tables, info, handle):
    _weak_entry(_MASKS, _tables_key(tables, info), [_owner(t) for t in tables],
                tuple(_version_of(t) for t in tables), handle)


def _kv_tables(mask):
    """A BlockMask's (fajit's or torch's) kv tables as fajit reads them: the counts and indices,
    then the full ones where it has them; a fajit BlockMask's without the batch / head dimensions
    they broadcast (BlockMask._unbroadcast_tables: views made once, not at every call)."""
    tables = [mask.kv_num_blocks, mask.kv_indices]
    if mask.full_kv_num_blocks is not None:
        tables += [mask.full_kv_num_blocks, mask.full_kv_indices]
    if isinstance(mask, BlockMask):
        return mask._unbroadcast_tables(tables)
    return tables


def _check_rank(num):
    if num.dim() != 3:
        raise ValueError(f"block_mask: kv_num_blocks must be [B, H, num_q_blocks], got shape {tuple(num.shape)} "
                         "(index a BlockMask with slices, e.g. block_mask[0:1], to keep its dimensions)")


def _expand_bh(t, bh):
    """Table t broadcast (stride 0) to batch and heads bh = (B, H): _unbroadcast's inverse."""
    return t if tuple(t.shape[:2]) == tuple(bh) else t.expand(*bh, *t.shape[2:])


def _check_tables(tables, info):
    """flex kv tables as fajit_block_mask_from_kv_blocks reads them: [B, H, nq] counts and
    [B, H, nq, nkv] indices for the call's lengths and block sizes."""
    len_q, len_kv, qb, kvb = info
    nq, nkv = -(-len_q // qb), -(-len_kv // kvb)
    num = tables[0]
    _check_rank(num)
    bm, hm = num.shape[:2]
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
    for name, t in zip(names, tables):
        want = (bm, hm, nq) if name.endswith("num_blocks") else (bm, hm, nq, nkv)
        if tuple(t.shape) != want:
            # The blocks a (batch, head) holds, as "(..., rows, cols)": a fajit mask's tables come here
            # without the batch / head dimensions they broadcast, which the caller sees.
            have, need = tuple(t.shape), list(want)
            if have[2:] != want[2:]:
                have = "(..., " + ", ".join(str(n) for n in have[2:]) + ")"
                need = "[..., " + ", ".join(str(n) for n in want[2:]) + "]"
            raise ValueError(f"block_mask: {name} has shape {have}; Q_LEN={len_q}, KV_LEN={len_kv} in "
                             f"blocks of {qb}x{kvb} need {need}")


def _unbroadcast(tables):
    """The tables without the batch or head dimensions they broadcast by stride 0 (fajit's own
    masks, expanded to torch's shape): one row there, so fajit's mask stays broadcast."""
    for d in (0, 1):
        if tables[0].shape[d] > 1 and all(t.stride(d) == 0 for t in tables):
            tables = [t.narrow(d, 0, 1) for t in tables]
    return list(tables)


def _mask_for(tables, info, batch, heads, device, in_place=False):
    """The fajit mask of flex kv tables [kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices] (full ones may be missing), built the first time: from a host copy (checked,
    with what fajit derives from the tiles' kinds for its kernels), or with in_place over int32
    contiguous tables on `device`, read there by the kernels (no copy, no sync; CUDA-graph capture
    works; what the backward and tiles that split the blocks need is derived from them on the
    GPU), as a short query's decoding needs: a decoding step's slice of a mask is new every step.
    In place the tables are not checked (a bad entry is the caller's), so other calls keep the
    checked copy."""
    len_q, len_kv, qb, kvb = info
    if not tables:
        key = ("full", len_q, len_kv, qb, kvb)
        hit = _MASKS.get(key)
        if hit is None:
            h = C.c_void_p()
            _capi.check(_capi.lib().fajit_block_mask_all_full(1, 1, len_q, len_kv, qb, kvb, C.byref(h)), "block_mask")
            hit = _MASKS[key] = (None, 0, _MaskHandle(h))
        return hit[2]
    # The same table tensors as a call before (a mask used by every layer of a model): found by
    # identity, without the checks and the key of views below.
    ident = (tuple(map(id, tables)), tuple(info))
    seen = _MASKS_SEEN.get(ident)
    if seen is not None and all(r() is t for r, t in zip(seen[0], tables)) and seen[1] == _table_state(tables):
        return seen[2]
    _check_tables(tables, info)
    hit = _MASKS.get(_tables_key(tables, info))
    if hit is not None:
        refs, versions, handle = hit
        if all(r() is not None for r in refs) and versions == tuple(_version_of(t) for t in tables):
            _remember_tables(ident, tables, handle)
            return handle
    src = _unbroadcast(tables)
    # In place only for tables the kernels can read as they are: a converted copy would be a
    # snapshot (a CUDA graph replaying it would not see the tables change). The handle keeps no
    # tables: the registry's entry, and with it the handle, goes when they go.
    if in_place and device.type == "cuda" and all(t.dtype == torch.int32 and t.is_contiguous() and
                                                  t.device == device for t in src):
        make = _capi.lib().fajit_block_mask_from_device_kv_blocks
    else:
        make = _capi.lib().fajit_block_mask_from_kv_blocks
        src = [t.detach().to("cpu", torch.int32).contiguous() for t in src]
    ptrs = [C.c_void_p(t.data_ptr()) for t in src] + [None] * (4 - len(src))
    h = C.c_void_p()
    with _on_device(device) if device.type == "cuda" else contextlib.nullcontext():  # the tables' context
        _capi.check(make(src[0].shape[0], src[0].shape[1], len_q, len_kv, qb, kvb, *ptrs, C.byref(h)),
                    "block_mask")
    handle = _MaskHandle(h)
    _register_mask(tables, info, handle)
    _remember_tables(ident, tables, handle)
    return handle


# (ids of a call's table tensors, mask info) -> (weakrefs to them, their _versions, _MaskHandle):
# _mask_for's first look, entries going with the tensors.
_MASKS_SEEN = {}


def _remember_tables(ident, tables, handle):
    _weak_entry(_MASKS_SEEN, ident, tables, _table_state(tables), handle)


def _layouts(tables):
    """Where the tensors' elements are: storage and layout (`t.data = ...` moves a tensor)."""
    return tuple((t.data_ptr(), t.shape, t.stride()) for t in tables)


def _table_state(tables):
    """What may change under a tensor object: its contents (_version), and where they are."""
    return tuple(_version_of(t) for t in tables), _layouts(tables)


def _version_of(t):
    """t._version; 0 for an inference tensor (made under torch.inference_mode), which has none:
    such tables changed in place are not noticed (a new mask is). fajit.torch's own tables are
    normal tensors even there."""
    return 0 if t.is_inference() else t._version


def _mask_tables(handle, device):
    lib = _capi.lib()
    info = _capi.BlockMaskInfo()
    _capi.check(lib.fajit_block_mask_get_info(handle.h, C.byref(info)))
    specs, total = _table_specs(info.batch, info.heads, info.num_q_blocks, info.num_kv_blocks)
    # Normal tensors even under torch.inference_mode: their version counter shows in-place edits.
    with torch.inference_mode(False):
        if device.type == "cuda":
            # One copy on the current stream that waits for nothing: device to device for a mask the
            # GPU built (a document mask made every training step costs no sync), through a pinned
            # buffer for one the symbolic analysis decided (causal, sliding, prefix, ...).
            moved = torch.empty(total, dtype=torch.int32, device=device)
            _capi.check(lib.fajit_block_mask_copy_tables(handle.h, C.c_void_p(moved.data_ptr()), moved.numel(),
                                                         _stream(device)), "block_mask")
        else:
            moved = torch.empty(total, dtype=torch.int32)
            for i, (shape, _, at) in enumerate(specs.values()):
                _capi.check(lib.fajit_block_mask_table(handle.h, i, C.c_void_p(moved.data_ptr() + 4 * at),
                                                       math.prod(shape), None))
    # The kv tables now (one op a table); the q_* transposes, copied with them, viewed when first
    # read (BlockMask's lazy_q: plain data, so a mask pickles and deep-copies as before).
    return info, {n: moved.as_strided(*specs[n]) for n in _KV_TABLES}, (moved, specs, None)


@functools.lru_cache(maxsize=64)
def _table_specs(batch, heads, nq, nkv):
    """({table: (shape, strides, offset)} in _capi.TABLES order, total elements): where
    fajit_block_mask_copy_tables puts a mask's eight tables, one after another."""
    specs, at = {}, 0
    for name in _capi.TABLES:
        rows, cols = (nq, nkv) if name.startswith(("kv", "full_kv")) else (nkv, nq)
        shape = (batch, heads, rows) + ((cols,) if name.endswith("indices") else ())
        specs[name] = (shape, _contiguous_strides(shape), at)
        at += math.prod(shape)
    return specs, at


def _contiguous_strides(shape):
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return tuple(reversed(strides))


def _slice_range(sl, n):
    """range(*sl.indices(n)), in plain Python (torch 2.11's dynamo cannot trace slice.indices)."""
    step = 1 if sl.step is None else operator.index(sl.step)
    if step == 0:
        raise ValueError("slice step cannot be zero")

    def clip(v, default, low, high):
        if v is None:
            return default
        v = operator.index(v)
        if v < 0:
            v += n
        return min(max(v, low), high)

    if step > 0:
        return range(clip(sl.start, 0, 0, n), clip(sl.stop, n, 0, n), step)
    return range(clip(sl.start, n - 1, -1, n - 1), clip(sl.stop, -1, -1, n - 1), step)


def _shrink_grid(grid, rows_max, cols_max):
    """A block grid (lines of #, +, .) with at most rows_max x cols_max cells: each cell covers
    whole blocks, and shows their kind, or + where they differ."""
    if not grid:
        return []
    rs = -(-len(grid) // rows_max)
    cs = -(-len(grid[0]) // cols_max)
    if rs == 1 and cs == 1:
        return list(grid)
    out = []
    for r0 in range(0, len(grid), rs):
        line = []
        for c0 in range(0, len(grid[0]), cs):
            kinds = {ch for row in grid[r0:r0 + rs] for ch in row[c0:c0 + cs]}
            line.append(kinds.pop() if len(kinds) == 1 else "+")
        out.append("".join(line))
    return out


def _sliced_mask_mod_error(b, h, q_idx, kv_idx):
    """The mask_mod of an indexed BlockMask until its caller sets one (torch's rule)."""
    raise RuntimeError("block_mask: this BlockMask was indexed (block_mask[...]), which keeps its tables but not "
                       "its mask_mod (a slice's query positions start at 0); set block_mask.mask_mod (offset by the "
                       "slice's position) before calling flex_attention with it")


def _torch_block_mask(num, idx, full_num, full_idx, block_size, mask_mod, seq_lengths):
    """torch's BlockMask.from_kv_blocks (seq_lengths where this torch takes them)."""
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

    kw = dict(full_kv_num_blocks=full_num, full_kv_indices=full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod)
    try:
        return TorchBlockMask.from_kv_blocks(num, idx, seq_lengths=tuple(seq_lengths), **kw)
    except TypeError:  # torch without seq_lengths
        return TorchBlockMask.from_kv_blocks(num, idx, **kw)


_KV_TABLES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
_Q_TABLES = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


class BlockMask:
    """flex_attention's block-sparse tables (the same int32 tables as torch's BlockMask:
    kv_num_blocks [B, H, nq], kv_indices [B, H, nq, nkv], full_kv_*, and the q_* transposes),
    the mask_mod they come from, and fajit's own handle. to_torch() / from_torch() convert."""

    def __init__(self, handle, tables, seq_lengths, block_size, mask_mod, lazy_q=False):
        """lazy_q: the q_* transposes are made when first read, as fajit's kernels transpose for
        themselves: True, from the kv tables (torch's BlockMask.from_kv_blocks, about 2 ms of host
        time a call; a decoding step's slice (__getitem__) never needs them); (copy, specs, bh),
        as views of fajit's copy of all eight tables (_mask_tables; expanded to bh unless None):
        a mask made every training step makes four views, not eight."""
        for name in _capi.TABLES:
            if not (lazy_q and name in _Q_TABLES):
                setattr(self, name, tables.get(name))
        if isinstance(lazy_q, tuple):
            self.__dict__["_q_views_of"] = lazy_q
        self.seq_lengths = tuple(int(n) for n in seq_lengths)
        self.BLOCK_SIZE = tuple(int(n) for n in block_size)
        self.mask_mod = mask_mod
        if handle is not None:
            _register_mask(_kv_tables(self), self._info(), handle)

    def __getattr__(self, name):  # only for attributes not set: the lazy q_* tables
        if name not in _Q_TABLES or "kv_num_blocks" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        # Only the tables not set yet (a q_* table the caller set stays); dynamo traces these forms.
        views = self.__dict__.get("_q_views_of")
        if views is not None:
            moved, specs, bh = views
            for n in _Q_TABLES:
                if n not in self.__dict__:
                    t = moved.as_strided(*specs[n])
                    self.__dict__[n] = t if bh is None else _expand_bh(t, bh)
            self.__dict__["_q_views_of"] = None
            return self.__dict__[name]
        theirs = _torch_block_mask(self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks,
                                   self.full_kv_indices, self.BLOCK_SIZE, _sliced_mask_mod_error, self.seq_lengths)
        for n in _Q_TABLES:
            if n not in self.__dict__:
                self.__dict__[n] = getattr(theirs, n, None)
        return self.__dict__[name]

    def _info(self):
        return (self.seq_lengths[0], self.seq_lengths[1], self.BLOCK_SIZE[0], self.BLOCK_SIZE[1])

    def _unbroadcast_tables(self, tables):
        """_unbroadcast(tables) for this mask's kv tables `tables`, kept while they are the same
        tensors over the same memory (views see in-place changes; `t.data = ...` moves a tensor)."""
        if torch.compiler.is_compiling():  # dynamo cannot compare data pointers; views are free in a graph
            return _unbroadcast(tables)
        kept = self.__dict__.get("_unbroadcast_kept")
        if kept is not None and len(kept[0]) == len(tables) and all(a is b for a, b in zip(kept[0], tables)) \
                and kept[1] == _layouts(tables):
            return kept[2]
        src = _unbroadcast(tables)
        self.__dict__["_unbroadcast_kept"] = (tables, _layouts(tables), src)
        return src

    @property
    def _handle(self):
        """fajit's mask of these tables at the current seq_lengths (built from a host copy of the
        tables the first time they meet these lengths)."""
        return _mask_for(_kv_tables(self), self._info(), 0, 0, self.kv_num_blocks.device)

    @classmethod
    def _of_torch(cls, mask, seq_lengths):
        """A BlockMask over torch BlockMask `mask`'s tables (no fajit handle until one is needed)."""
        tables = {name: getattr(mask, name, None) for name in _capi.TABLES}
        return cls(None, tables, seq_lengths, mask.BLOCK_SIZE, mask.mask_mod)

    def _sliced_len_q(self, i, picked):
        """The query length of the `picked` rows index i picks (torch's rule): the picked blocks'
        lengths (the last one clipped) for a slice, their count times the block otherwise."""
        len_q, bq = self.seq_lengths[0], self.BLOCK_SIZE[0]
        if isinstance(i, slice):
            return sum(min(bq, len_q - r * bq) for r in _slice_range(i, -(-len_q // bq)))
        return picked * bq

    def __getitem__(self, index):
        """torch's BlockMask indexing over (batch, head, query block): the mask of the rows picked,
        with the query length of the rows picked (torch's rule: a slice's blocks, the last one
        clipped; a tensor's count times the block) and, as torch's, a mask_mod that raises until
        the caller sets one. An int keeps its dimension (block_mask[0] is [1, H, ...]); torch's
        decoding recipe sets seq_lengths = (1, KV_LEN) and a mask_mod offset by the position."""
        index = index if isinstance(index, tuple) else (index,)
        if len(index) > 3 or any(i is Ellipsis for i in index):
            raise IndexError("block_mask indices: at most 3 (batch, head, query block), no Ellipsis; "
                             f"got {len(index)}")
        sizes = self.kv_num_blocks.shape
        kept = []
        for i, n, what in zip(index, sizes, ("the batch", "the heads", "the query blocks")):
            if isinstance(i, list):  # a list of indices or bools: torch's advanced indexing
                i = torch.tensor(i, device=self.kv_num_blocks.device)
            if isinstance(i, Tensor):
                kept.append(i.reshape(1) if i.dim() == 0 else i)
            elif isinstance(i, (bool, slice)) or i is None:
                kept.append(i)
            else:  # an int keeps its dimension
                j = operator.index(i)
                if not -n <= j < n:
                    raise IndexError(f"block_mask index {j} is out of range for {what} of size {n}")
                j = j + n if j < 0 else j
                kept.append(slice(j, j + 1))
        index = tuple(kept) + (slice(None),) * (3 - len(kept))
        tensors = [d for d, i in enumerate(index) if isinstance(i, Tensor)]  # (the loop below keeps them)
        if len(tensors) > 1:
            raise IndexError("block_mask indices: index lists or tensors in more than one of (batch, head, query "
                             "block) are not supported (torch's indexing folds them into one dimension, which no "
                             "kernel takes); index one dimension at a time")
        # A CPU index is checked here; a CUDA one by the device, as torch's indexing does (no sync),
        # and under torch.compile by the graph's own indexing (no data-dependent branch).
        for d in tensors if not torch.compiler.is_compiling() else ():
            i, n = index[d], sizes[d]
            if i.device.type == "cpu" and i.dtype not in (torch.bool, torch.uint8) and i.numel():
                lo, hi = int(i.min()), int(i.max())
                if lo < -n or hi >= n:
                    what = ("the batch", "the heads", "the query blocks")[d]
                    raise IndexError(f"block_mask index {hi if hi >= n else lo} is out of range for {what} of "
                                     f"size {n}")
        # Batch / head dimensions every table broadcasts (stride 0: fajit's own masks in torch's
        # shape) stay broadcast where a slice picks them: picked from one row and expanded to the
        # picked size, so fajit's mask of the slice keeps one row (a decoding kernel shares a GQA
        # group's K/V read then). _kv_tables gives them with such dimensions already narrowed.
        src = _kv_tables(self)
        shape_out = [None, None]
        for d in (0, 1):
            if sizes[d] > 1 and src[0].shape[d] == 1:  # broadcast by every table
                i = index[d]
                if isinstance(i, slice):
                    shape_out[d] = len(_slice_range(i, sizes[d]))
                    index = index[:d] + (slice(None),) + index[d + 1:]
                else:  # picked by a tensor, None or a bool: indexed in torch's shape
                    src = [t.expand(*[sizes[e] if e == d else t.shape[e] for e in range(t.dim())]) for t in src]
        ix = index[tensors[0]] if tensors else None
        one = (ix is not None and ix.dim() == 1 and ix.dtype in (torch.int32, torch.int64)
               and ix.device == self.kv_num_blocks.device
               and all(isinstance(i, slice) for k, i in enumerate(index) if k != tensors[0]))
        if one:
            # One integer index tensor among slices (the decoding recipe's mask[:, :, pos // 128]):
            # index_select, half the host time of advanced indexing; the same result.
            d = tensors[0]
            rest = tuple(i if k != d else slice(None) for k, i in enumerate(index))
            ix = torch.where(ix < 0, ix + sizes[d], ix)  # Python's negative indices, as t[index] takes them
            if all(i == slice(None) for i in rest):
                picked = [t.index_select(d, ix) for t in src]
            else:
                picked = [t[rest].index_select(d, ix) for t in src]
        else:
            picked = [t[index] for t in src]
        widened = picked
        if shape_out != [None, None]:
            bh = [shape_out[d] if shape_out[d] is not None else picked[0].shape[d] for d in (0, 1)]
            widened = [t.expand(*bh, *t.shape[2:]) for t in picked]
        num, idx, fnum, fidx = (widened + [None, None])[:4]  # full ones may be missing
        tables = {"kv_num_blocks": num, "kv_indices": idx, "full_kv_num_blocks": fnum, "full_kv_indices": fidx}
        out = BlockMask(None, tables, (self._sliced_len_q(index[2], num.shape[2]), self.seq_lengths[1]), self.BLOCK_SIZE,
                        _sliced_mask_mod_error, lazy_q=True)
        if 0 not in shape_out and not torch.compiler.is_compiling():  # (an empty slice's tables are its own)
            out.__dict__["_unbroadcast_kept"] = (widened, _layouts(widened), _unbroadcast(picked))
        return out

    def _adjust(self, new_q_len, new_kv_len):
        """torch's BlockMask._adjust: this mask cropped to its upper-left [new_q_len, new_kv_len]
        (blocks past them dropped), for a call with those lengths; mask_mod kept."""
        if new_q_len > self.seq_lengths[0] or new_kv_len > self.seq_lengths[1]:
            raise ValueError(f"BlockMask._adjust crops a mask to its upper left; it cannot grow Q_LEN={self.seq_lengths[0]}, "
                             f"KV_LEN={self.seq_lengths[1]} to {new_q_len}, {new_kv_len}: create a new block mask")
        rows = -(-int(new_q_len) // self.BLOCK_SIZE[0])
        cols = -(-int(new_kv_len) // self.BLOCK_SIZE[1])

        def crop(num, idx):
            idx = idx[:, :, :rows]
            pos = torch.arange(idx.shape[-1], device=idx.device)
            kept = (pos < num[:, :, :rows, None]) & (idx < cols)
            order = torch.argsort((~kept).to(torch.int8), dim=-1, stable=True)
            return (kept.sum(-1).to(torch.int32).contiguous(),
                    torch.gather(idx, -1, order)[..., :cols].to(torch.int32).contiguous())

        bh = tuple(self.kv_num_blocks.shape[:2])
        tables = _unbroadcast(_kv_tables(self))  # cropped once, broadcast again
        num, idx = (_expand_bh(t, bh) for t in crop(*tables[:2]))
        fnum = fidx = None
        if len(tables) == 4:
            fnum, fidx = (_expand_bh(t, bh) for t in crop(*tables[2:]))
        cropped = _torch_block_mask(num, idx, fnum, fidx, self.BLOCK_SIZE, self.mask_mod, (new_q_len, new_kv_len))
        return BlockMask._of_torch(cropped, (new_q_len, new_kv_len))

    def to(self, device):
        """This mask with its tables on `device` (torch's BlockMask.to)."""
        moved = {name: None if getattr(self, name) is None else getattr(self, name).to(device)
                 for name in _capi.TABLES}
        return BlockMask(None, moved, self.seq_lengths, self.BLOCK_SIZE, self.mask_mod)

    @property
    def shape(self):
        b, h = self.kv_num_blocks.shape[:2]
        return (b, h) + self.seq_lengths

    @property
    def _empty(self):
        """No blocks at all (a batch, head or query-block slice that picked none)."""
        return self.kv_num_blocks.numel() == 0

    def sparsity(self):
        """Percentage of blocks skipped (torch's BlockMask.sparsity)."""
        if self._empty:
            raise ValueError(f"block_mask: the sparsity of an empty mask (tables of shape "
                             f"{tuple(self.kv_num_blocks.shape)}: a batch, head or query-block slice picked none)")
        frac = C.c_double()
        _capi.check(_capi.lib().fajit_block_mask_density(self._handle.h, C.byref(frac), None, None, None))
        return 100.0 * (1.0 - frac.value)

    def to_string(self, grid_size=(20, 20), limit=4):
        """torch's BlockMask.to_string: the block grids (# full, + partial, . empty) of the first
        `limit` (batch, head) pairs, each shrunk to at most grid_size (rows, cols) characters (a
        cell covering blocks of more than one kind shows +). As torch's: a grid size of -1 (or any
        size below 1) is the whole grid, a negative limit every pair, limit 0 none."""
        rows_max, cols_max = grid_size if isinstance(grid_size, (tuple, list)) else (grid_size, grid_size)
        try:
            rows_max, cols_max, limit = int(rows_max), int(cols_max), int(limit)
        except (TypeError, ValueError):
            raise ValueError(f"to_string: grid_size is an int or a (rows, cols) pair and limit an int, got "
                             f"{grid_size!r}, {limit!r}") from None
        rows_max, cols_max = (n if n >= 1 else 2**31 for n in (rows_max, cols_max))
        if self._empty:
            return repr(self) + "\n"
        handle = self._handle
        info = _capi.BlockMaskInfo()
        _capi.check(_capi.lib().fajit_block_mask_get_info(handle.h, C.byref(info)))
        B, H = self.kv_num_blocks.shape[:2]
        out = [repr(self)]
        pairs = [(b, h) for b in range(B) for h in range(H)]
        shown = pairs if limit < 0 else pairs[:limit]
        for b, h in shown:
            text = _capi.text(_capi.lib().fajit_block_mask_to_string(
                handle.h, b if info.batch > 1 else 0, h if info.heads > 1 else 0))
            grid = text.splitlines()[1:]
            out.append(f"({b}, {h})")
            out += _shrink_grid(grid, rows_max, cols_max)
        if len(pairs) > len(shown):
            out.append(f"... {len(pairs) - len(shown)} more (batch, head) pairs: to_string(limit=N) shows them, "
                       "or index the mask (block_mask[b, h])")
        return "\n".join(out) + "\n"

    def to_dense(self):
        """[B, H, num_q_blocks, num_kv_blocks] int32, 1 where a block is computed (partial or full),
        as torch's BlockMask.to_dense."""
        return self.to_torch().to_dense()

    def numel(self):
        """B * H * Q_LEN * KV_LEN (torch's BlockMask.numel)."""
        return math.prod(self.shape)

    def as_tuple(self, flatten=True):
        """torch's BlockMask.as_tuple: the tables, BLOCK_SIZE and mask_mod (seq_lengths first where
        torch's has them)."""
        return self.to_torch().as_tuple(flatten)

    def __repr__(self):
        B, H, Lq, Lkv = self.shape
        return (f"BlockMask(B={B}, H={H}, Lq={Lq}, Lkv={Lkv}, block={self.BLOCK_SIZE[0]}x{self.BLOCK_SIZE[1]}, "
                + ("empty)" if self._empty else f"sparsity={self.sparsity():.2f}%)"))

    def to_torch(self):
        """torch.nn.attention.flex_attention.BlockMask with the same tables."""
        return _torch_block_mask(self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices,
                                 self.BLOCK_SIZE, self.mask_mod, self.seq_lengths)

    @classmethod
    def from_torch(cls, mask, seq_lengths=None):
        """From torch's BlockMask (its kv tables; seq_lengths defaults to the mask's)."""
        lens = seq_lengths or getattr(mask, "seq_lengths", None)
        if lens is None:
            raise ValueError("block_mask: this torch BlockMask has no seq_lengths; pass seq_lengths=(Q_LEN, KV_LEN)")
        bs = mask.BLOCK_SIZE if isinstance(mask.BLOCK_SIZE, tuple) else (mask.BLOCK_SIZE, mask.BLOCK_SIZE)
        device = mask.kv_num_blocks.device
        handle = _mask_for(_kv_tables(mask), (int(lens[0]), int(lens[1]), int(bs[0]), int(bs[1])), 0, 0, device)
        with _on_device(device) if device.type == "cuda" else contextlib.nullcontext():
            _, t, q_tables = _mask_tables(handle, device)
        return cls(handle, t, lens, bs, mask.mask_mod, lazy_q=q_tables)

    @classmethod
    def from_kv_blocks(cls, kv_num_blocks, kv_indices, full_kv_num_blocks=None, full_kv_indices=None,
                       BLOCK_SIZE=128, mask_mod=None, seq_lengths=None, compute_q_blocks=True):
        """torch's BlockMask.from_kv_blocks: a mask from its kv tables (partial blocks, then full
        ones); seq_lengths default to the tables' blocks times BLOCK_SIZE, mask_mod to keep-all.
        fajit derives its own query-side tables (compute_q_blocks is accepted and not needed)."""
        from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask

        args = dict(BLOCK_SIZE=BLOCK_SIZE, mask_mod=mask_mod, seq_lengths=seq_lengths)
        if "compute_q_blocks" in inspect.signature(TorchBlockMask.from_kv_blocks).parameters:
            args["compute_q_blocks"] = False
        return cls.from_torch(TorchBlockMask.from_kv_blocks(kv_num_blocks, kv_indices, full_kv_num_blocks,
                                                            full_kv_indices, **args))

    def __str__(self):
        """As torch's: the shape and sparsity, then the block grids (to_string)."""
        return self.to_string().rstrip("\n")


def noop_mask(b, h, q_idx, kv_idx):
    return b == b  # constant true after simplification


def _check_mask_mods(mask_mods):
    if not all(callable(m) for m in mask_mods):
        raise RuntimeError(f"All inputs should be callable mask_mods: {mask_mods}")  # torch's message


def and_masks(*mask_mods):
    """torch's and_masks: the intersection of mask_mods (all true for none)."""
    _check_mask_mods(mask_mods)

    def and_mask(b, h, q_idx, kv_idx):
        r = b.new_ones((), dtype=torch.bool)
        for m in mask_mods:
            r = r & m(b, h, q_idx, kv_idx)
        return r
    return and_mask


def or_masks(*mask_mods):
    """torch's or_masks: the union of mask_mods (all false for none)."""
    _check_mask_mods(mask_mods)

    def or_mask(b, h, q_idx, kv_idx):
        r = b.new_zeros((), dtype=torch.bool)
        for m in mask_mods:
            r = r | m(b, h, q_idx, kv_idx)
        return r
    return or_mask


def _bind(key, device, what):
    """The captured tensors of a variant, ready for the kernel: buffers as contiguous f32 / i32
    on `device` (converted with torch ops, so autograd reaches the originals), scalars as they are."""
    bufs, scalars = _CAPTURES[key]
    v = _VARIANTS[key]
    out = []
    for name, kind, t in zip(v.buffer_names, v.buffer_kinds, bufs):
        if t.device != device:
            if t.dim() != 0:
                raise ValueError(f"{what} captures tensor '{name}' on {t.device}; it must be on {device}")
            t = t.to(device)  # a 0-d one (one value): copied on the devices, differentiably, no host sync
        t = t.to(torch.float32 if kind == "f32" else torch.int32)
        if t.dim() == 0:
            t = t.reshape(1)  # a captured 0-d GPU tensor: a one-element buffer (fajit._trace)
        out.append(t if t.is_contiguous() else t.contiguous())
    for name, t in zip(v.scalar_names, scalars):
        if t.requires_grad and name in v.score_scalars and torch.is_grad_enabled():
            raise ValueError(f"{what} captures the 0-d tensor '{name}' on the CPU and it requires grad: a CPU "
                             f"scalar is passed by value and gets no gradient; put it on {device} (a 0-d GPU "
                             "tensor is read on the device and gets one)")
    return out, list(scalars)


def _positive_int(name, v, alternatives=""):
    """v as an int (a Python or numpy integer, a 0-d integer tensor) >= 1."""
    try:
        n = None if isinstance(v, bool) else operator.index(v)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive int{alternatives}, got {v!r}")
    return n


def _block_size(block_size):
    """BLOCK_SIZE as (q, kv): an int, or a pair (tuple or list) of ints, positive multiples of 16."""
    pair = tuple(block_size) if isinstance(block_size, (tuple, list)) else (block_size, block_size)
    if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 and n % 16 == 0
                                 for n in pair):
        raise ValueError(f"BLOCK_SIZE must be a positive multiple of 16 or a pair of them (q, kv), got {block_size!r}")
    return pair


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
    """torch's create_block_mask: the block mask of mask_mod for [B, H, Q_LEN, KV_LEN] (B or H
    None = broadcast). Blocks the symbolic analysis decides need no GPU work; the rest are
    evaluated by a kernel generated from the mask_mod, which builds the tables on the GPU too:
    on the current stream, with no host sync (a mask made every training step costs only its GPU
    time). Not inside a CUDA-graph capture (an error): make the mask before it."""
    check_mod(mask_mod, "mask_mod", "mask_mod")
    Q_LEN, KV_LEN = (_positive_int(name, v) for name, v in (("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)))
    B, H = (None if v is None else _positive_int(name, v, " or None") for name, v in (("B", B), ("H", H)))
    bs = _block_size(BLOCK_SIZE)
    # None: the current accelerator, as torch's (fajit's kernels need it to be a CUDA one)
    device = torch.device(device) if device is not None else (
        torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None) or torch.device("cuda")
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = _variant_key(None, mask_mod)
    v = _VARIANTS[key]
    keep = []
    with torch.cuda.device(device):
        bufs, scalars = _bind(key, device, "mask_mod")
        caps = _ccaptures(v, bufs, scalars, keep)
        h = C.c_void_p()
        _capi.check(_capi.lib().fajit_program_block_mask(
            v.program.handle, B or 1, H or 1, Q_LEN, KV_LEN, bs[0], bs[1], C.byref(caps), None, _stream(device),
            C.byref(h)), "create_block_mask")
        handle = _MaskHandle(h)
        info, tables, q_tables = _mask_tables(handle, device)
    # [B, H] as asked (torch's shape), as views where the mask ignores b or h (fajit keeps 1)
    bh = (B or 1, H or 1)
    if (info.batch, info.heads) != bh:
        tables = {n: _expand_bh(t, bh) for n, t in tables.items()}
        q_tables = q_tables[:2] + (bh,)
    return BlockMask(handle, tables, (Q_LEN, KV_LEN), bs, mask_mod, lazy_q=q_tables)


# ---- the custom ops -------------------------------------------------------------------------

def _flex_fwd_impl(q: Tensor, k: Tensor, v: Tensor, variant: str, scale: float, tables: List[Tensor],
                   mask_info: List[int], buffers: List[Tensor], scalars: List[Tensor],
                   want_max: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """out, the LSE, and with want_max each row's largest score [B, Hq, Lq] (else an empty
    tensor): fajit's row-max kernels, compiled on the first call that asks."""
    out, lse, mx = _forward(q, k, v, variant, scale, tables, mask_info, buffers, scalars, want_max, True)
    return out, lse, mx if want_max else torch.empty((0,), dtype=torch.float32, device=q.device)


def _forward(q, k, v, variant, scale, tables, mask_info, buffers, scalars, want_max, want_lse):
    """_flex_fwd_impl's work, the LSE and the row maxima only where wanted (else None): an
    inference call allocates out alone."""
    B, Hq, Lq, D = q.shape
    Dv = v.shape[3]
    device = q.device
    out = torch.empty((B, Hq, Lq, Dv), dtype=q.dtype, device=device)
    lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=device) if want_lse else None
    mx = torch.empty((B, Hq, Lq), dtype=torch.float32, device=device) if want_max else None
    var = _VARIANTS[variant]
    keep = []
    with _on_device(device):
        kern = _kernel(var, q.dtype, D, Dv, device)
        # A short query (the decoding kernel's) or a CUDA-graph capture reads the tables in place.
        mask = _mask_for(tables, mask_info, B, Hq, device,
                         in_place=Lq <= _DECODE_MAX_LEN_Q or torch.cuda.is_current_stream_capturing())
        caps = _ccaptures(var, buffers, scalars, keep)
        ts = [C.byref(_ctensor(t)) for t in (q, k, v, out)] + [C.byref(_ctensor(lse)) if want_lse else None]
        if not want_max:
            _capi.check(_capi.lib().fajit_kernel_forward(
                kern.handle, *ts, scale, mask.h, C.byref(caps), _stream(device)), "flex_attention")
        else:
            opts = _capi.forward_options()
            opts.scale = scale
            cmx = _ctensor(mx)
            opts.max_scores = C.pointer(cmx)
            _capi.check(_capi.lib().fajit_kernel_forward_ex(
                kern.handle, *ts, C.byref(opts), mask.h, C.byref(caps), _stream(device)), "flex_attention")
    return out, lse, mx


# The op for torch.compile; eager calls run _forward directly, or _flex_fwd_impl through _FlexFunction
# when autograd records them (the custom op's dispatch costs more host time than a short decode).
_flex_fwd = torch.library.custom_op("fajit::flex_fwd", mutates_args=())(_flex_fwd_impl)


def _records_grad(tensors, variant, buffers):
    """Whether autograd must record an eager forward (grad mode on, and q, k, v or a buffer that
    gets a gradient requires one: _wanted_grads): then it goes through _FlexFunction, else
    straight to the impl. A buffer read only by the mask_mod has no gradient, so needing one
    records nothing (no saved tensors, no backward for it), as torch's flex_attention."""
    return torch.is_grad_enabled() and (any(t.requires_grad for t in tensors) or any(_wanted_grads(variant, buffers)))


@_flex_fwd.register_fake
def _(q, k, v, variant, scale, tables, mask_info, buffers, scalars, want_max):
    B, Hq, Lq, _ = q.shape
    return (q.new_empty((B, Hq, Lq, v.shape[3])), q.new_empty((B, Hq, Lq), dtype=torch.float32),
            q.new_empty((B, Hq, Lq) if want_max else (0,), dtype=torch.float32))


def _wanted_grads(variant, buffers):
    """Which captured buffers get a gradient: float buffers that need one and that the score_mod
    reads as values (the library's has_gradient); others get none (a buffer read only by the
    mask_mod, say)."""
    v = _VARIANTS[variant]
    return [bool(b.requires_grad and v.gradient.get(n, False)) for n, b in zip(v.buffer_names, buffers)]


def _grad_buffers(buffers, buffer_grads):
    """The backward's buffer gradients: fp32 zeros the kernels accumulate into where wanted, an
    empty placeholder elsewhere (the op's output list keeps one entry per buffer)."""
    return [torch.zeros(b.shape, dtype=torch.float32, device=b.device) if want else b.new_empty((0,))
            for b, want in zip(buffers, buffer_grads)]


def _deterministic(buffer_grads) -> int:
    """The backward's deterministic flag: on where torch.use_deterministic_algorithms(True) is (dQ,
    dK, dV bit-identical run to run, as flex_attention's backward gives them). Gradients of captured
    buffers are still summed by fp32 atomics there: an error says so, as torch's nondeterministic
    ops do (a warning with warn_only=True)."""
    if not torch.are_deterministic_algorithms_enabled():
        return 0
    if any(buffer_grads):
        what = ("fajit.torch flex_attention backward: the gradients of captured buffers are summed by fp32 "
                "atomics, not deterministically, but torch.use_deterministic_algorithms(True) is set")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError(what + "; pass warn_only=True to allow it, or detach the buffer")
        warnings.warn(what, UserWarning, stacklevel=2)
    return 1


def _cbuffer_grads(variant, dbufs, buffer_grads, keep):
    """The wanted gradients of _grad_buffers as the C API's buffer_grads (None: none wanted)."""
    names = [n for n, want in zip(variant.buffer_names, buffer_grads) if want]
    if not names:
        return None
    arr = (_capi.BufferCapture * len(names))()
    for i, (n, g) in enumerate(zip(names, [g for g, w in zip(dbufs, buffer_grads) if w])):
        arr[i].name = n.encode()
        arr[i].tensor = _ctensor(g)
    keep.append(arr)
    grads = _capi.Captures()
    grads.buffers, grads.num_buffers = arr, len(names)
    return grads


def _flex_bwd_impl(dout: Tensor, dlse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              variant: str, scale: float, tables: List[Tensor], mask_info: List[int], buffers: List[Tensor],
              scalars: List[Tensor], buffer_grads: List[bool]) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
    B, Hq, Lq, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    var = _VARIANTS[variant]
    dbufs = _grad_buffers(buffers, buffer_grads)
    keep = []
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    with _on_device(q.device):
        kern = _kernel(var, q.dtype, D, v.shape[3], q.device)
        mask = _mask_for(tables, mask_info, B, Hq, q.device)
        caps = _ccaptures(var, buffers, scalars, keep)
        grads = _cbuffer_grads(var, dbufs, buffer_grads, keep)
        ts = [_ctensor(t) for t in (q, k, v, out, lse, dout, dq, dk, dv)]
        dl = _ctensor(dlse.contiguous()) if dlse is not None else None
        _capi.check(_capi.lib().fajit_kernel_backward(
            kern.handle, *[C.byref(t) for t in ts], C.byref(dl) if dl is not None else None, scale, mask.h,
            C.byref(caps), C.byref(grads) if grads is not None else None, _deterministic(buffer_grads),
            _stream(q.device)), "flex_attention backward")
    return dq, dk, dv, dbufs


_flex_bwd = torch.library.custom_op("fajit::flex_bwd", mutates_args=())(_flex_bwd_impl)


@_flex_bwd.register_fake
def _(dout, dlse, q, k, v, out, lse, variant, scale, tables, mask_info, buffers, scalars, buffer_grads):
    dbufs = [b.new_empty(b.shape, dtype=torch.float32) if want else b.new_empty((0,))
             for b, want in zip(buffers, buffer_grads)]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbufs


def _setup_context(ctx, inputs, output):
    q, k, v, variant, scale, tables, mask_info, buffers, scalars, _ = inputs
    out, lse, mx = output
    ctx.mark_non_differentiable(mx)  # as torch's: the row maxima carry no gradient
    ctx.variant, ctx.scale, ctx.mask_info = variant, scale, mask_info
    ctx.n_tables, ctx.n_buffers = len(tables), len(buffers)
    ctx.buffer_grads = _wanted_grads(variant, buffers)
    ctx.save_for_backward(q, k, v, out, lse, *tables, *buffers, *scalars)


def _buffer_grads_asked(ctx, flat_first=None, list_index=None):
    """ctx.buffer_grads narrowed to the buffers this backward is asked for (ctx.needs_input_grad:
    autograd.grad over q, k, v alone asks for none). flat_first: the first buffer's place among a
    flattened autograd.Function's inputs; list_index: the buffers' argument of a custom op (a list
    of flags there). Where the flags have another shape the forward's choice stands."""
    need = getattr(ctx, "needs_input_grad", None)
    flags = None
    if need is not None and flat_first is not None and len(need) >= flat_first + ctx.n_buffers:
        flags = need[flat_first:flat_first + ctx.n_buffers]
    elif (need is not None and list_index is not None and list_index < len(need)
          and isinstance(need[list_index], (list, tuple)) and len(need[list_index]) == ctx.n_buffers):
        flags = need[list_index]
    if flags is None:
        return ctx.buffer_grads
    return [bool(want and asked) for want, asked in zip(ctx.buffer_grads, flags)]


def _backward(ctx, dout, dlse, dmax=None, bwd=None):
    """The custom op's autograd (bwd: the fajit::flex_bwd op, which torch.compile traces with
    fake tensors) and _FlexFunction's (bwd=_flex_bwd_impl)."""
    q, k, v, out, lse, *rest = ctx.saved_tensors
    tables = rest[:ctx.n_tables]
    buffers = rest[ctx.n_tables:ctx.n_tables + ctx.n_buffers]
    scalars = rest[ctx.n_tables + ctx.n_buffers:]
    if dout is None:
        dout = torch.zeros_like(out)
    # (_FlexFunction's inputs: 9 before the tables; the custom op's: buffers are its 8th argument)
    wanted = _buffer_grads_asked(ctx, flat_first=9 + ctx.n_tables) if bwd is not None else \
        _buffer_grads_asked(ctx, list_index=7)
    dq, dk, dv, dbufs = (bwd or _flex_bwd)(dout, dlse, q, k, v, out, lse, ctx.variant, ctx.scale, list(tables),
                                  ctx.mask_info, list(buffers), list(scalars), wanted)
    gb = [g if want else None for g, want in zip(dbufs, wanted)]
    # one entry per input, tensor lists as long as the input lists (torch checks the structure)
    return dq, dk, dv, None, None, [None] * len(tables), None, gb, [None] * len(scalars), None


_flex_fwd.register_autograd(_backward, setup_context=_setup_context)


class _FlexFunction(torch.autograd.Function):
    """Eager autograd of flex_attention: the custom ops' own forward, context and backward,
    without their dispatch, which cost ~0.3 ms of host time per op call (torch 2.11; fajit
    forward+backward took 1.6 ms of host time per step against compiled flex's 0.8,
    bench/host_profile.py). torch.compile keeps the custom ops (no graph break). Tensor lists
    are flattened so autograd sees the captured buffers as inputs."""

    @staticmethod
    def forward(ctx, q, k, v, variant, scale, info, want_max, n_tables, n_buffers, *rest):
        tables = list(rest[:n_tables])
        buffers = list(rest[n_tables:n_tables + n_buffers])
        scalars = list(rest[n_tables + n_buffers:])
        ctx.set_materialize_grads(False)  # an unused out or LSE gets no zero gradient
        with _on_device(q.device):  # compiled with its backward beside it, if new
            _kernel(_VARIANTS[variant], q.dtype, q.shape[3], v.shape[3], q.device, backward=True)
        out, lse, mx = _flex_fwd_impl(q, k, v, variant, scale, tables, info, buffers, scalars, want_max)
        _setup_context(ctx, (q, k, v, variant, scale, tables, info, buffers, scalars, want_max), (out, lse, mx))
        return out, lse, mx

    @staticmethod
    def backward(ctx, dout, dlse, dmax):
        dq, dk, dv, _, _, tables, _, gb, scalars, _ = _backward(ctx, dout, dlse, dmax, _flex_bwd_impl)
        return (dq, dk, dv, None, None, None, None, None, None, *tables, *gb, *scalars)


# ---- flex_attention -------------------------------------------------------------------------

def _check_types(named):
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_cuda(name, t):
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got one on {t.device}")


_HALF_TYPES = (torch.float16, torch.bfloat16)


def _check_dtype(name, t):
    if t.dtype not in _HALF_TYPES:
        raise ValueError(f"{name} must be float16 or bfloat16, got {t.dtype}")


def _check_one_device(query, key, value):
    if key.device != query.device or value.device != query.device:
        raise ValueError(f"query, key and value must be on one device, got {query.device}, {key.device}, "
                         f"{value.device}")


def _check_one_dtype(query, key, value):
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")


def _check_heads(Hq, Hkv, enable_gqa):
    if Hq != Hkv:
        if not enable_gqa:
            raise ValueError(f"query has {Hq} heads and key {Hkv}: pass enable_gqa=True for grouped-query attention")
        if Hq % Hkv != 0:
            raise ValueError(f"enable_gqa: query heads ({Hq}) must be a multiple of key heads ({Hkv})")


def _check_head_dims(query, key, value):
    """Head dims are the last dimension in every layout."""
    E = query.shape[-1]
    if key.shape[-1] != E:
        raise ValueError(f"key's head dim must be query's ({E}), got {key.shape[-1]}")
    for name, t in (("query", query), ("value", value)):
        d = t.shape[-1]
        if d % 8 != 0 or not 32 <= d <= 256:
            raise ValueError(f"{name}: fajit takes head dims that are multiples of 8 from 32 to 256, got {d}")


def _check_scale(scale):
    """scale as the C API takes it (0.0: 1/sqrt(E))."""
    if scale is None:
        return 0.0
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return float(scale)


def _check_inputs(query, key, value, enable_gqa):
    named = (("query", query), ("key", key), ("value", value))
    _check_types(named)
    for name, t in named:
        if not t.is_cuda:
            _check_cuda(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [B, H, L, E], got shape {list(t.shape)}")
        if t.dtype not in _HALF_TYPES:
            _check_dtype(name, t)
    _check_one_device(query, key, value)
    _check_one_dtype(query, key, value)
    B = query.shape[0]
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(f"key and value must have query's batch size {B}, got {key.shape[0]} and {value.shape[0]}")
    if value.shape[1] != key.shape[1] or value.shape[2] != key.shape[2]:
        raise ValueError(f"value must have key's heads and length {list(key.shape[1:3])}, got "
                         f"{list(value.shape[1:3])}")
    _check_heads(query.shape[1], key.shape[1], enable_gqa)
    _check_head_dims(query, key, value)


def _block_mask_args(block_mask, B, H, L, S, device, notes):
    """(mask_mod, kv tables, mask info) of a block_mask argument for [B, H, L, S] (None: no mask).
    notes: how errors describe the call, templates of "lens" (L, S), "sizes" (B, H), "len_q" (L)."""
    if block_mask is None:
        return None, [], [L, S, 128, 128]
    if not hasattr(block_mask, "kv_num_blocks"):
        raise TypeError(f"block_mask must be a BlockMask, got {type(block_mask).__name__}")
    lens = getattr(block_mask, "seq_lengths", None)
    if lens is not None and (int(lens[0]), int(lens[1])) != (L, S):
        raise ValueError(f"block_mask was created for Q_LEN={lens[0]}, KV_LEN={lens[1]}; "
                         + notes["lens"].format(L=L, S=S))
    bs = block_mask.BLOCK_SIZE if isinstance(block_mask.BLOCK_SIZE, tuple) else (block_mask.BLOCK_SIZE,) * 2
    _check_rank(block_mask.kv_num_blocks)
    nb = block_mask.kv_num_blocks.shape
    if nb[0] not in (1, B) or nb[1] not in (1, H):
        raise ValueError(f"block_mask was created for B={nb[0]}, H={nb[1]}; " + notes["sizes"].format(B=B, H=H))
    if nb[2] != (L + bs[0] - 1) // bs[0]:
        raise ValueError(f"block_mask has {nb[2]} query blocks of {bs[0]}; " + notes["len_q"].format(L=L)
                         + f" needs {(L + bs[0] - 1) // bs[0]}")
    if block_mask.kv_num_blocks.device != device:
        raise ValueError(f"block_mask is on {block_mask.kv_num_blocks.device}, query on {device}")
    mask_mod = block_mask.mask_mod
    if mask_mod is not None and getattr(mask_mod, "__name__", "") == "noop_mask":
        mask_mod = None
    return mask_mod, _kv_tables(block_mask), [L, S, int(bs[0]), int(bs[1])]


_FLEX_NOTES = {"lens": "query has L={L} and key S={S}", "sizes": "query has B={B}, H={H}",
               "len_q": "query length {L}"}


def _rows(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention.flex_attention, computed by fajit's kernels.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (fp16 or bf16, CUDA, E and Ev
    multiples of 8 from 32 to 256); block_mask from fajit.torch.create_block_mask or torch's. Returns out
    [B, Hq, L, Ev]; with return_aux=AuxRequest(lse=True) also AuxOutput(lse=...), the natural-log LSE
    [B, Hq, L], fp32 (so does the older return_lse=True, as a plain tensor); with
    AuxRequest(max_scores=True) AuxOutput(max_scores=...), each row's largest score after score_mod
    and the mask, fp32 [B, Hq, L] (-inf for a row with nothing unmasked; no gradient), as torch's."""
    _check_aux(return_lse, return_aux)
    _check_inputs(query, key, value, enable_gqa)
    B, Hq, L, E = query.shape
    S = key.shape[2]
    scale = _check_scale(scale)
    mask_mod, tables, info = _block_mask_args(block_mask, B, Hq, L, S, query.device, _FLEX_NOTES)
    _guard_mods(score_mod, mask_mod, query.device)
    vkey = _variant_key(score_mod, mask_mod)
    buffers, scalars = _bind(vkey, query.device, "score_mod")
    want_max = bool(return_aux is not None and return_aux.max_scores)
    args = (_rows(query), _rows(key), _rows(value), vkey, scale, tables, info, buffers, scalars, want_max)
    if torch.compiler.is_compiling():
        out, lse, mx = torch.ops.fajit.flex_fwd(*args)
    elif _records_grad((query, key, value), vkey, buffers):
        out, lse, mx = _FlexFunction.apply(*args[:5], info, want_max, len(tables), len(buffers), *tables, *buffers,
                                           *scalars)
    else:
        out, lse, mx = _forward(*args, bool(return_lse or (return_aux is not None and return_aux.lse)))
    if return_aux is not None:
        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=mx if want_max else None)
    if return_lse:
        return out, lse
    return out


def _check_aux(return_lse, return_aux):
    if return_aux is None:
        return
    if return_lse:
        raise ValueError("flex_attention: pass return_lse or return_aux, not both (return_lse is torch's older "
                         "form of return_aux=AuxRequest(lse=True))")
    if not all(hasattr(return_aux, f) for f in ("lse", "max_scores")):
        raise TypeError(f"return_aux must be an AuxRequest(lse=..., max_scores=...), got {type(return_aux).__name__}")


# ragged / paged batches: defined beside, on the helpers above
from ._varlen import flex_attention_varlen  # noqa: E402
