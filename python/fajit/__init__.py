"""fajit: a JIT kernel compiler for FlexAttention-style attention, from Python.

    import fajit
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    print(fajit.mlir(mask_mod=causal))          # fa-dialect IR; needs neither torch nor a GPU

    from fajit.torch import flex_attention, create_block_mask   # torch's signatures
    mask = create_block_mask(causal, B, H, L, L)
    out = flex_attention(q, k, v, score_mod=..., block_mask=mask)

Everything goes through libfajit.so's C API (ctypes); see fajit._capi for where it is found.
"""
from __future__ import annotations

import ctypes as _C

from . import _capi
from ._capi import FajitError, library_path
from ._trace import Buffer, Scalar, TraceError, buffer, scalar, trace
from ._trace import (where, minimum, maximum, clamp, sigmoid, exp, exp2, log, log2, tanh, sqrt, rsqrt, sin,
                     cos, erf)

__version__ = "0.1.0"
__all__ = ["mlir", "trace", "buffer", "scalar", "Buffer", "Scalar", "TraceError", "FajitError", "Program",
           "Kernel", "compile", "preset_mlir", "library_path",
           # for mods written without torch (torch users call torch.where, torch.tanh, ...)
           "where", "minimum", "maximum", "clamp", "sigmoid", "exp", "exp2", "log", "log2", "tanh", "sqrt",
           "rsqrt", "sin", "cos", "erf"]


class Program:
    """A parsed, verified and simplified fa module (the C API's fajit_program)."""

    def __init__(self, mlir_text=None, *, _handle=None):
        lib = _capi.lib()
        if _handle is None:
            h = _C.c_void_p()
            _capi.check(lib.fajit_program_parse(mlir_text.encode(), _C.byref(h)))
            _handle = h
        self._h = _handle
        self._lib = lib

    @classmethod
    def preset(cls, mask=None, score=None):
        """The C++ library mods by CLI preset name ("causal", "sliding:1024", "alibi", ...)."""
        lib = _capi.lib()
        h = _C.c_void_p()
        _capi.check(lib.fajit_program_preset(mask.encode() if mask else None, score.encode() if score else None,
                                             _C.byref(h)))
        return cls(_handle=h)

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._lib.fajit_program_destroy(h)
            self._h = None

    @property
    def handle(self):
        return self._h

    def mlir(self):
        return _capi.text(self._lib.fajit_program_mlir(self._h))

    def score_grad_mlir(self):
        p = _C.c_char_p()
        _capi.check(self._lib.fajit_program_score_grad_mlir(self._h, _C.byref(p)))
        return _capi.text(p.value)

    def captures(self):
        """[dict(name, is_buffer, is_float, rank, used_by_score, used_by_mask, has_gradient)]"""
        out = []
        for i in range(self._lib.fajit_program_num_captures(self._h)):
            c = _capi.CaptureInfo()
            _capi.check(self._lib.fajit_program_capture(self._h, i, _C.byref(c)))
            out.append({f: (_capi.text(getattr(c, f)) if f == "name" else bool(getattr(c, f)) if f != "rank"
                            else c.rank) for f, _ in _capi.CaptureInfo._fields_})
        return out

    def evaluate(self, b, h, q, kv, score=None, buffers=None, scalars=None):
        """The mods evaluated on the CPU as fajit's kernels evaluate them (f32 arithmetic, i32
        indices), at the points (b[i], h[i], q[i], kv[i]): (score_mod results, or None without
        `score`; mask_mod results as bools). buffers: {name: a float32 or int32 array with the
        buffer protocol (a numpy array, a CPU tensor's .numpy(), an array.array; copied, so any
        layout)}; scalars: {name: number}.
        For checking a traced mod against its framework's own evaluation."""
        n = len(b)
        if not len(h) == len(q) == len(kv) == n or (score is not None and len(score) != n):
            raise ValueError("evaluate: b, h, q, kv (and score) must have one length")
        ints = [(_C.c_int32 * n)(*(int(x) for x in xs)) for xs in (b, h, q, kv)]
        caps, keep = _capi.Captures(), []
        infos = {c["name"]: c for c in self.captures()}
        if buffers:
            arr = (_capi.BufferCapture * len(buffers))()
            for i, (name, obj) in enumerate(buffers.items()):
                view = memoryview(obj)
                kind = {"f": _capi.F32, "i": _capi.I32}.get(view.format.lstrip("<=@"))
                if kind is None or view.itemsize != 4 or not 1 <= view.ndim <= 4:
                    raise ValueError(f"evaluate: buffer '{name}' must be float32 or int32 of rank 1 to 4, "
                                     f"got format {view.format!r}, rank {view.ndim}")
                raw = (_C.c_char * view.nbytes).from_buffer_copy(view.tobytes())  # C order, any layout
                keep += [name.encode(), raw]
                arr[i].name = keep[-2]
                arr[i].tensor.data = _C.addressof(raw)
                arr[i].tensor.dtype = kind
                arr[i].tensor.rank = view.ndim
                arr[i].tensor.shape[:view.ndim] = view.shape
                strides, step = [], 1
                for n_dim in reversed(view.shape):
                    strides.insert(0, step)
                    step *= n_dim
                arr[i].tensor.stride[:view.ndim] = strides
            caps.buffers, caps.num_buffers = arr, len(buffers)
            keep.append(arr)
        if scalars:
            arr = (_capi.ScalarCapture * len(scalars))()
            for i, (name, value) in enumerate(scalars.items()):
                keep.append(name.encode())
                arr[i].name = keep[-1]
                if infos.get(name, {}).get("is_float", isinstance(value, float)):
                    arr[i].is_float, arr[i].f = 1, float(value)
                else:
                    arr[i].is_float, arr[i].i = 0, int(value)
            caps.scalars, caps.num_scalars = arr, len(scalars)
            keep.append(arr)
        scores = (_C.c_float * n)(*(float(x) for x in score)) if score is not None else None
        out = (_C.c_float * n)() if score is not None else None
        kept = (_C.c_uint8 * n)()
        _capi.check(self._lib.fajit_program_evaluate(self._h, n, *ints, scores, _C.byref(caps), out, kept),
                    "evaluate")
        return (list(out) if out is not None else None), [bool(x) for x in kept]

    def __str__(self):
        return self.mlir()


def mlir(score_mod=None, mask_mod=None, canonicalize=True):
    """The fa-dialect text of the traced mods.

    canonicalize=True: verified and simplified by libfajit (what it compiles);
    canonicalize=False: the tracer's own text, without loading the library.
    Needs neither torch nor a GPU."""
    t = trace(score_mod, mask_mod)
    if not canonicalize:
        return t.text
    return Program(t.text).mlir()


def preset_mlir(mask=None, score=None):
    """The canonical IR of the C++ library mods (what `fajit dump --mlir --mask M --score S` prints)."""
    return Program.preset(mask, score).mlir()


def _options(dtype="bf16", head_dim_qk=128, head_dim_v=None, arch=None):
    o = _capi.Options()
    if dtype not in ("bf16", "f16"):
        raise ValueError(f"dtype must be 'bf16' or 'f16', got {dtype!r}")
    o.dtype = _capi.DTYPES[dtype]
    o.head_dim_qk = head_dim_qk
    o.head_dim_v = head_dim_qk if head_dim_v is None else head_dim_v
    o.arch = arch.encode() if arch else None
    return o


class Kernel:
    """One compiled attention variant (the C API's fajit_kernel)."""

    def __init__(self, program, dtype="bf16", head_dim_qk=128, head_dim_v=None, arch=None,
                 backward_in_background=False):
        """Compiles the forward. backward_in_background: the backward kernels compile on a
        background thread meanwhile (training's first backward then finds them ready; an error
        there is reported by the first backward)."""
        lib = _capi.lib()
        h = _C.c_void_p()
        o = _options(dtype, head_dim_qk, head_dim_v, arch)
        if backward_in_background:
            _capi.check(lib.fajit_compile_program_background(program.handle, _C.byref(o), _capi.WARM_BACKWARD,
                                                             _C.byref(h)))
        else:
            _capi.check(lib.fajit_compile_program(program.handle, _C.byref(o), _C.byref(h)))
        self._h = h
        self._lib = lib
        self.program = program

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._lib.fajit_kernel_destroy(h)
            self._h = None

    @property
    def handle(self):
        return self._h

    def cuda_source(self):
        return _capi.text(self._lib.fajit_kernel_cuda_source(self._h))

    def cache_key(self):
        return _capi.text(self._lib.fajit_kernel_cache_key(self._h))

    def origin(self):
        """'memory', 'disk' or 'compiled'."""
        return _capi.text(self._lib.fajit_kernel_origin(self._h))

    def autotune_report(self):
        """What autotuning chose so far: one line per shape class ('' when off: FAJIT_AUTOTUNE=0)."""
        return _capi.text(self._lib.fajit_kernel_autotune_report(self._h))

    def warm(self, backward=False, deterministic=False, decode=False, ragged=False, paged=False, block_mask=True,
             row_max=False, candidates=False):
        """Compiles now, through the caches, the kernels otherwise compiled on first use (a server
        warms them at start; no GPU needed); row_max: also the forward-side kernels' twins that
        write max_scores; candidates: the dense forward's autotuning candidates (a first call
        that tunes then only times them; compiled whatever this kernel's autotune setting, for
        the cache's sake). Returns how many kernels the variant has, the forward
        included."""
        flags = ((_capi.WARM_BLOCK_MASK if block_mask else 0) | (_capi.WARM_BACKWARD if backward else 0) |
                 (_capi.WARM_DETERMINISTIC if deterministic else 0) | (_capi.WARM_DECODE if decode else 0) |
                 (_capi.WARM_RAGGED if ragged else 0) | (_capi.WARM_PAGED if paged else 0) |
                 (_capi.WARM_ROW_MAX if row_max else 0) | (_capi.WARM_CANDIDATES if candidates else 0))
        n = _C.c_int(0)
        _capi.check(self._lib.fajit_kernel_warm(self._h, flags, _C.byref(n)))
        return n.value


def compile(score_mod=None, mask_mod=None, dtype="bf16", head_dim_qk=128, head_dim_v=None, arch=None):
    """Traces and compiles a variant (NVRTC; no GPU needed, arch defaults to the GPU's or sm_90a)."""
    return Kernel(Program(trace(score_mod, mask_mod).text), dtype, head_dim_qk, head_dim_v, arch)
