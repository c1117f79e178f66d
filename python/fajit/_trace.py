"""Tracing Python score_mod / mask_mod functions into fa-dialect MLIR text.

The mod is called once with proxy values (`Value`) for score, b, h, q_idx and kv_idx; every
operation on them records a node, and the nodes reachable from the result are printed as an
`fa.score_mod` / `fa.mask_mod` op, the same IR the C++ frontend (fajit/frontend.h) records.

What a mod may use:
  * Python operators, comparisons, `&`, `|`, `^`, `~` on the arguments and on results;
  * Python numbers (constants: a new value is a new kernel);
  * `fajit.scalar("name", dtype)` or, with torch, a captured 0-d CPU tensor: a runtime scalar
    (`fa.scalar`), bound at call time, so a new value never recompiles; a captured 0-d tensor
    on a GPU is a one-element buffer read at 0 on the device (its value never leaves it);
  * `fajit.buffer("name", rank, dtype)` or, with torch, a captured tensor indexed by traced
    integers (`bias[h, q_idx - kv_idx]`): a captured buffer (`fa.load`), bound at call time;
  * torch functions (`torch.where`, `torch.tanh`, ...; see `_torch_table`) and tensor methods;
  * torch's dtypes and type promotion (see "torch dtypes" below): captured bool, uint8, int8 and
    int16 tensors compute as torch's (narrow integers wrap), int64 computes in int32 and float64
    in float32, and a cast to float16 / bfloat16 rounds as torch's.
Python control flow on a traced value (`if`, `and`, `or`, `not`, `bool()`, `int()`) cannot be
traced and raises TraceError naming the construct and the source line.
"""
from __future__ import annotations

import builtins
import functools
import inspect
import linecache
import math
import numbers
import os
import struct
import sys
import types

__all__ = ["TraceError", "Value", "Buffer", "Scalar", "buffer", "scalar", "trace", "Trace"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_RESERVED = ("score", "b", "h", "q", "kv")

F32, I32, I1 = "f32", "i32", "i1"
_KIND_NAMES = {F32: "float", I32: "int", I1: "bool"}


class TraceError(TypeError):
    """A mod that cannot be traced: the message names the construct and the source line."""


# ---- where in the user's code are we --------------------------------------------------------

def _torch_dir():
    t = sys.modules.get("torch")
    f = getattr(t, "__file__", None) if t is not None else None
    return os.path.dirname(os.path.abspath(f)) if f else None


def _user_frame():
    """The innermost frame outside fajit and torch: the line of the mod being traced."""
    tdir = _torch_dir()
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_PKG_DIR + os.sep) and not (tdir and fn.startswith(tdir + os.sep)):
            return f
        f = f.f_back
    return None


def _where():
    f = _user_frame()
    if f is None:
        return ""
    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    loc = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
    return f" (at {loc}: {line})" if line else f" (at {loc})"


def _fail(message):
    t = _Trace.current
    what = f"{t.what}: " if t is not None else ""
    raise TraceError(f"cannot trace {what}{message}{_where()}")


# ---- nodes ----------------------------------------------------------------------------------

class Value:
    """A traced value: an argument of the mod or the result of a recorded operation."""

    __slots__ = ("trace", "kind", "op", "args", "attr", "index", "dt", "__weakref__")

    def __init__(self, trace, kind, op, args=(), attr=None, dt=None):
        self.trace = trace
        self.kind = kind  # the IR type: f32, i32 or i1
        self.op = op
        self.args = args
        self.attr = attr
        self.dt = dt  # the torch dtype when narrower than the kind's: "uint8", "int8", "int16", "float16", "bfloat16"
        self.index = len(trace.nodes)
        trace.nodes.append(self)

    # Python control flow cannot be traced.
    def __bool__(self):
        _fail("Python control flow on a traced value (`if`, `while`, `and`, `or`, `not`, bool()) is "
              "data-dependent; use torch.where(cond, a, b) and the operators &, |, ~ instead")

    def __int__(self):
        _fail("int() of a traced value needs its data; use .int() / .to(torch.int32) to convert it in the kernel")

    def __float__(self):
        _fail("float() of a traced value needs its data; use .float() / .to(torch.float32) to convert it "
              "in the kernel")

    def __index__(self):
        _fail("a traced value cannot index a Python sequence (its value is known only in the kernel); "
              "index a captured tensor or fajit.buffer instead")

    def __iter__(self):
        _fail("a traced value is a scalar and cannot be iterated")

    def __len__(self):
        _fail("a traced value is a scalar and has no len()")

    def __getitem__(self, idx):
        _fail("a traced value is a scalar and cannot be indexed")

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<fajit traced {_KIND_NAMES[self.kind]} %{self.index} ({self.op})>"

    # arithmetic
    def __add__(self, o): return _arith("add", self, o)
    def __radd__(self, o): return _arith("add", o, self)
    def __sub__(self, o): return _arith("sub", self, o)
    def __rsub__(self, o): return _arith("sub", o, self)
    def __mul__(self, o): return _arith("mul", self, o)
    def __rmul__(self, o): return _arith("mul", o, self)
    def __truediv__(self, o): return _truediv(self, o)
    def __rtruediv__(self, o): return _truediv(o, self)
    def __floordiv__(self, o): return _floordiv(self, o)
    def __rfloordiv__(self, o): return _floordiv(o, self)
    def __mod__(self, o): return _mod(self, o)
    def __rmod__(self, o): return _mod(o, self)
    def __pow__(self, o): return _pow(self, o)
    def __rpow__(self, o): return _pow(o, self)
    def __neg__(self): return _neg(self)
    def __pos__(self): return self
    def __abs__(self): return _abs(self)
    def __lshift__(self, o): return _shift("shli", self, o)
    def __rshift__(self, o): return _shift("shrsi", self, o)

    # comparisons
    def __lt__(self, o): return _compare("lt", self, o)
    def __le__(self, o): return _compare("le", self, o)
    def __gt__(self, o): return _compare("gt", self, o)
    def __ge__(self, o): return _compare("ge", self, o)
    def __eq__(self, o): return _compare("eq", self, o)
    def __ne__(self, o): return _compare("ne", self, o)

    # logic / bitwise
    def __and__(self, o): return _bitwise("and", self, o)
    def __rand__(self, o): return _bitwise("and", o, self)
    def __or__(self, o): return _bitwise("or", self, o)
    def __ror__(self, o): return _bitwise("or", o, self)
    def __xor__(self, o): return _bitwise("xor", self, o)
    def __rxor__(self, o): return _bitwise("xor", o, self)
    def __invert__(self): return _invert(self)

    # tensor-like methods flex users call
    def float(self): return _convert_dt(self, "float32")
    def int(self): return _convert_dt(self, "int32")
    def long(self): return _convert_dt(self, "int32")  # int64 is computed in int32 (fajit's indices are)
    def short(self): return _convert_dt(self, "int16")
    def char(self): return _convert_dt(self, "int8")
    def byte(self): return _convert_dt(self, "uint8")
    def bool(self): return _convert_dt(self, "bool")
    def half(self): return _convert_dt(self, "float16")
    def bfloat16(self): return _convert_dt(self, "bfloat16")
    def double(self): return _convert_dt(self, "float32")  # float64 is computed in float32
    def to(self, *args, **kwargs): return _to(self, *args, **kwargs)
    def type_as(self, other): return _convert_dt(self, _operand_dtype(other)[0])
    def abs(self): return _abs(self)
    def exp(self): return _unary("exp", self)
    def exp2(self): return _unary("exp2", self)
    def log(self): return _unary("log", self)
    def log2(self): return _unary("log2", self)
    def tanh(self): return _unary("tanh", self)
    def sqrt(self): return _unary("sqrt", self)
    def rsqrt(self): return _unary("rsqrt", self)
    def sigmoid(self): return _sigmoid(self)
    def sin(self): return _unary("sin", self)
    def cos(self): return _unary("cos", self)
    def floor(self): return _floor(self)
    def ceil(self): return _ceil(self)
    def erf(self): return _unary("erf", self)
    def clamp(self, min=None, max=None): return _clamp(self, min, max)
    clip = clamp
    def minimum(self, o): return _minmax("min", self, o)
    def maximum(self, o): return _minmax("max", self, o)
    def where(self, cond, other): return _where_(cond, self, other)
    # torch's and_masks/or_masks start from b.new_ones((), dtype=torch.bool) / new_zeros
    def new_ones(self, size=(), dtype=None, **kw): return _filled(self, size, dtype, 1)
    def new_zeros(self, size=(), dtype=None, **kw): return _filled(self, size, dtype, 0)
    def logical_not(self): return _invert(_convert(self, I1))
    def logical_and(self, o): return _bitwise("and", _convert(self, I1), _convert(_coerce(o), I1))
    def logical_or(self, o): return _bitwise("or", _convert(self, I1), _convert(_coerce(o), I1))
    def masked_fill(self, mask, value): return _masked_fill(self, mask, value)
    def clamp_min(self, m): return _clamp(self, m, None)
    def clamp_max(self, m): return _clamp(self, None, m)

    # what mods read of a tensor without computing on it (torch's noop_mask passes b.device on)
    @property
    def device(self):
        return None  # a traced value lives in the kernel; new_ones(device=...) ignores it

    @property
    def dtype(self):
        t = sys.modules.get("torch")
        if t is None:
            return self.dt or self.kind
        return getattr(t, _dt(self))

    @property
    def shape(self):
        return ()  # one element: the score or index of one (q, kv) pair

    def dim(self):
        return 0

    def __getattr__(self, name):  # anything else a tensor has: its torch function, or named, with the line
        if name.startswith("__"):
            raise AttributeError(name)
        t = sys.modules.get("torch")
        method = getattr(t.Tensor, name, None) if t is not None else None
        handler = _torch_table().get(method) if method is not None else None
        if handler is not None:  # x.neg(), x.remainder(3), x.logical_xor(y), ...: as torch.Tensor's
            return functools.partial(handler, self)
        _fail(f"`.{name}` of a traced value: fajit traces elementwise torch operations on the score and "
              "indices (arithmetic, comparisons, where, exp/log/tanh/..., clamp, new_ones, to, captured "
              "tensors indexed by them), not this one")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_call(func, args, kwargs or {})


class Scalar:
    """A named runtime scalar declared without torch: `fajit.scalar("window", "int")`."""

    def __init__(self, name, dtype="int"):
        self.name = _check_name(name, "scalar")
        self.kind = _kind_of_dtype(dtype, "scalar " + repr(name))

    def __repr__(self):
        return f"fajit.scalar({self.name!r}, {_KIND_NAMES[self.kind]!r})"


class Buffer:
    """A named captured buffer declared without torch: `fajit.buffer("bias", 2, "float")`;
    index it with traced integers inside a mod (`bias[h, q_idx - kv_idx]`)."""

    def __init__(self, name, rank, dtype="float"):
        self.name = _check_name(name, "buffer")
        if not isinstance(rank, builtins.int) or not 1 <= rank <= 4:
            raise ValueError(f"buffer {name!r}: rank must be 1 to 4, got {rank!r}")
        self.rank = rank
        self.kind = _kind_of_dtype(dtype, "buffer " + repr(name))
        if self.kind == I1:
            raise ValueError(f"buffer {name!r}: dtype must be float or int, got bool")

    def __getitem__(self, idx):
        return _load(self, self.name, self.rank, self.kind, idx)

    def __repr__(self):
        return f"fajit.buffer({self.name!r}, {self.rank}, {_KIND_NAMES[self.kind]!r})"


def scalar(name, dtype="int"):
    return Scalar(name, dtype)


def buffer(name, rank, dtype="float"):
    return Buffer(name, rank, dtype)


def _check_name(name, what):
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"{what} name must be an identifier, got {name!r}")
    if name in _RESERVED:
        raise ValueError(f"{what} name {name!r} is reserved (score, b, h, q and kv name the mod's arguments)")
    return name


def _kind_of_dtype(dtype, what):
    if dtype in (float, "float", "f32", "float32"):
        return F32
    if dtype in (builtins.int, "int", "i32", "int32"):
        return I32
    if dtype in (bool, "bool", "i1"):
        return I1
    t = sys.modules.get("torch")
    if t is not None and isinstance(dtype, t.dtype):
        if dtype == t.bool:
            return I1
        return F32 if dtype.is_floating_point else I32
    raise ValueError(f"{what}: dtype must be 'float', 'int' or 'bool' (or a torch dtype), got {dtype!r}")


# ---- the trace ------------------------------------------------------------------------------

class _Names:
    """Names of captured objects, shared by the score_mod and mask_mod of one trace (a capture
    used by both is one capture)."""

    def __init__(self, hints):
        self.hints = hints  # id(obj) -> variable name, from the mods' closures and globals
        self.by_id = {}  # id(obj) -> name
        self.objects = {}  # name -> obj
        self.kinds = {}  # name -> ("buffer", kind, rank) | ("scalar", kind)

    def name_of(self, obj, fallback):
        key = id(obj)
        if key in self.by_id:
            return self.by_id[key]
        declared = getattr(obj, "name", None) if isinstance(obj, (Buffer, Scalar)) else None
        base = declared or self.hints.get(key) or fallback
        if not base.isidentifier() or not base.isascii():
            base = fallback
        if base in _RESERVED:
            base = base + "_"
        name, n = base, 1
        while name in self.objects and self.objects[name] is not obj:
            if declared is not None and isinstance(self.objects[name], (Buffer, Scalar)):
                break  # two declarations with one name are one capture (like the C++ frontend)
            name = f"{base}_{n}"
            n += 1
        self.by_id[key] = name
        self.objects.setdefault(name, obj)
        return name


class _Trace:
    current = None

    def __init__(self, what, names):
        self.what = what
        self.names = names
        self.nodes = []
        self.buffers = []  # capture order: names
        self.buffer_info = {}  # name -> (kind, rank)


def _coerce(x, what="operand"):
    t = _Trace.current
    if isinstance(x, Value):
        if x.trace is not t:
            _fail("a traced value from another trace was used (traced values must not be kept between calls)")
        return x
    if isinstance(x, bool):
        return Value(t, I1, "const", attr=x)
    if isinstance(x, builtins.int):
        if not -2**31 <= x < 2**31:
            _fail(f"the integer constant {x} does not fit in int32")
        return Value(t, I32, "const", attr=x)
    if isinstance(x, float):
        return Value(t, F32, "const", attr=x)
    if isinstance(x, Scalar):
        name = t.names.name_of(x, "scalar")
        return _scalar_node(t, name, x.kind)
    if isinstance(x, Buffer):
        _fail(f"buffer {x.name!r} used without indexing; index it with the mod's arguments ({x.name}[...])")
    if isinstance(x, _PartialIndex):
        _fail(f"buffer {x.name!r} has {x.rank} dimensions but is indexed with {len(x.idx)} "
              f"ind{'ices' if len(x.idx) != 1 else 'ex'} (every dimension needs one traced integer)")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dim() == 0:
            dt = _tensor_dt(x.dtype)
            if x.device.type != "cpu":
                # Read where it lives: a one-element buffer loaded at 0 (no host copy of the value
                # per call, so no sync and CUDA-graph capture works; a float one gets a gradient).
                hint = t.names.hints.get(id(x), f"buf{len(t.names.objects)}")
                return _load(x, hint, 1, F32 if _DT_KIND[dt] == F32 else I32, (0,), dt)
            name = t.names.name_of(x, f"scalar{len(t.names.objects)}")
            return _scalar_node(t, name, _DT_KIND[dt], obj=x, dt=dt)
        _fail(f"a captured tensor of shape {list(x.shape)} is used without indexing; index it with the "
              "mod's arguments (bias[h, q_idx - kv_idx])")
    _fail(f"{type(x).__name__} {x!r} cannot be used as a traced {what} (expected a traced value, a Python "
          "number, fajit.scalar/fajit.buffer or a captured tensor)")


def _scalar_node(t, name, kind, obj=None, dt=None):
    # a bool scalar is passed as an int (fa.scalar is f32 or i32) and tested against 0, as torch's
    # bool tensors are
    ir_kind = I32 if kind == I1 else kind
    prev = t.names.kinds.get(name)
    if prev is not None and prev != ("scalar", ir_kind):
        _fail(f"capture {name!r} is used as {_describe(prev)} and as a {_KIND_NAMES[kind]} scalar")
    t.names.kinds[name] = ("scalar", ir_kind)
    v = Value(t, ir_kind, "scalar", attr=name, dt=dt if dt in _NARROW else None)
    return _compare("ne", v, 0) if kind == I1 else v


def _describe(k):
    if k[0] == "scalar":
        return f"a {_KIND_NAMES[k[1]]} scalar"
    return f"a rank-{k[2]} {_KIND_NAMES[k[1]]} buffer"


def _load(obj, name_hint, rank, kind, idx, dt=None):
    """obj[idx], a `kind` (f32 or i32) buffer holding torch dtype `dt` (bool ones as i32)."""
    t = _Trace.current
    if t is None:
        raise TraceError(f"buffer {name_hint!r} can be indexed only inside a traced score_mod/mask_mod")
    if not isinstance(idx, tuple):
        idx = (idx,)
    name = t.names.name_of(obj, name_hint)
    if len(idx) < rank and not any(i is None or i is Ellipsis or isinstance(i, slice) for i in idx):
        return _PartialIndex(obj, name, rank, kind, idx, dt)  # bias[h][q_idx]: indexed again next
    if len(idx) != rank:
        _fail(f"buffer {name!r} has {rank} dimension{'s' if rank != 1 else ''} but is indexed with "
              f"{len(idx)} ind{'ices' if len(idx) != 1 else 'ex'} (every dimension needs one traced integer)")
    ids = []
    for i in idx:
        if i is None or i is Ellipsis or isinstance(i, slice):
            _fail(f"buffer {name!r} is indexed with {i!r}; only integers (traced or constant) can index a "
                  "captured buffer")
        v = _coerce(i, "index")
        if v.kind == F32:
            _fail(f"buffer {name!r} is indexed with a float; convert it with .int() first")
        if _dt(v) != "int32":  # torch: a bool or uint8 index is a mask, an int8 / int16 one an error
            _fail(f"buffer {name!r} is indexed with a {_dt(v)} value; torch indexes with int32 / int64 "
                  "ones only (a bool or uint8 index selects by mask); convert it with .int() first")
        ids.append(_convert(v, I32))
    prev = t.names.kinds.get(name)
    if prev is not None and prev != ("buffer", kind, rank):
        _fail(f"capture {name!r} is used as {_describe(prev)} and as {_describe(('buffer', kind, rank))}")
    t.names.kinds[name] = ("buffer", kind, rank)
    if name not in t.buffer_info:
        t.buffers.append(name)
        t.buffer_info[name] = (kind, rank)
    v = Value(t, kind, "load", tuple(ids), attr=name, dt=dt if dt in _NARROW else None)
    return _compare("ne", v, 0) if dt == "bool" else v


class _PartialIndex:
    """A captured buffer indexed in some of its leading dimensions (`bias[h]` of `bias[h][q]`)."""

    def __init__(self, obj, name, rank, kind, idx, dt=None):
        self.obj, self.name, self.rank, self.kind, self.idx, self.dt = obj, name, rank, kind, idx, dt

    def __getitem__(self, more):
        more = more if isinstance(more, tuple) else (more,)
        return _load(self.obj, self.name, self.rank, self.kind, self.idx + more, self.dt)

    def __bool__(self):
        _fail(f"buffer {self.name!r} is indexed in {len(self.idx)} of its {self.rank} dimensions")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _fail(f"{_torch_name(func)} of a partly indexed buffer: index every dimension first")


# ---- torch dtypes ---------------------------------------------------------------------------
#
# A traced value stands for a 0-d tensor: torch's compiled kernels trace the mods on 0-d int32
# indices and its eager path vmaps them, so values promote among themselves as torch.promote_types
# does, and Python numbers are torch's weak scalars, which only raise the category (bool < int <
# float): `u8 + 300` stays uint8, `q_idx * 0.5` is float32. fajit computes in three IR types:
# int64 as int32 (fajit's indices are int32; eager torch's are int64, so an index product beyond
# int32 wraps here and not there) and float64 as float32. The narrower
# dtypes are tracked (Value.dt): uint8, int8 and int16 results wrap as torch's do (and a Python int
# meeting one is converted, wrapping, as torch converts it), and a cast to float16 or bfloat16 rounds
# to nearest even as eager torch's does (torch.compile drops a .half().float() round trip).
# Arithmetic on float16 / bfloat16 values computes in float32 without rounding each result (as
# torch's compiled kernels do; eager torch rounds every op: a float rounding difference).

_DEFAULT_DT = {F32: "float32", I32: "int32", I1: "bool"}
_DT_KIND = {"bool": I1, "uint8": I32, "int8": I32, "int16": I32, "int32": I32,
            "float16": F32, "bfloat16": F32, "float32": F32}
_NARROW_INTS = {"uint8": (0, 255), "int8": (-128, 127), "int16": (-32768, 32767)}
_NARROW = ("uint8", "int8", "int16", "float16", "bfloat16")
_WIDE = {"int64": "int32", "float64": "float32"}  # computed in 32 bits
_CATEGORY_DT = ("bool", "int32", "float32")  # what a weak scalar of each category becomes


def _dt(v):
    """The torch dtype of a traced value, by name."""
    return v.dt or _DEFAULT_DT[v.kind]


def _category(name):
    return 0 if name == "bool" else 2 if _DT_KIND[name] == F32 else 1


def _promote_types(x, y):
    if x == y:
        return x
    cx, cy = _category(x), _category(y)
    if cx != cy:
        return x if cx > cy else y
    if cx == 2:
        return "float32"  # float16 with bfloat16, or either with float32
    if "int32" in (x, y):
        return "int32"
    return "int16"  # uint8, int8 and int16 mixed: int16 holds them


def _tensor_dt(dtype):
    """A captured tensor's torch dtype as fajit computes it."""
    name = str(dtype).rsplit(".", 1)[-1]
    if name in _DT_KIND or name in _WIDE:
        return _WIDE.get(name, name)
    return "float32" if dtype.is_floating_point else "int32"


def _dt_name(dtype, what):
    """A dtype argument (a torch dtype; float, int, bool or their names) as a dtype name."""
    t = sys.modules.get("torch")
    if t is not None and isinstance(dtype, t.dtype):
        name = str(dtype).rsplit(".", 1)[-1]
        if name not in _DT_KIND and name not in _WIDE:
            _fail(f"{what}: fajit computes with bool, uint8, int8/16/32/64 and float16/bfloat16/float32/64 "
                  f"values, not {dtype}")
        return _WIDE.get(name, name)
    return _DEFAULT_DT[_kind_of_dtype(dtype, what)]


def _operand_dtype(x):
    """(dtype name, weak) of an operand: Python numbers are weak."""
    if isinstance(x, Value):
        return _dt(x), False
    if isinstance(x, bool):
        return "bool", True
    if isinstance(x, builtins.int):
        return "int32", True
    if isinstance(x, float):
        return "float32", True
    if isinstance(x, Scalar):
        return _DEFAULT_DT[x.kind], False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _tensor_dt(x.dtype), False
    return "int32", False  # not an operand: _coerce says why


def _result_dtype(*xs):
    """torch's result dtype for operands xs (torch.result_type of 0-d tensors and scalars)."""
    strong, weak = None, -1
    for x in xs:
        name, is_weak = _operand_dtype(x)
        if is_weak:
            weak = max(weak, _category(name))
        else:
            strong = name if strong is None else _promote_types(strong, name)
    if strong is None or weak > _category(strong):
        return _CATEGORY_DT[weak]
    return strong


def _with_dt(v, name):
    """v (of name's kind) as a value of torch dtype `name`; an alias node when v keeps its own."""
    dt = name if name in _NARROW else None
    if v.dt == dt:
        return v
    if v.op == "const":
        return Value(v.trace, v.kind, "const", attr=v.attr, dt=dt)
    return Value(v.trace, v.kind, "alias", (v,), dt=dt)


def _wrap(v, name):
    """An i32 value wrapped into a narrow integer dtype's range, as torch's uint8/int8/int16 wrap."""
    lo, hi = _NARROW_INTS[name]
    c = _const_value(v)
    if c is not None:
        return Value(v.trace, I32, "const", attr=(builtins.int(c) - lo) % (hi - lo + 1) + lo, dt=name)
    if name == "uint8":
        return Value(v.trace, I32, "arith.andi", (v, _coerce(255)), dt=name)
    bits = _coerce(24 if name == "int8" else 16)
    return Value(v.trace, I32, "arith.shrsi", (Value(v.trace, I32, "arith.shli", (v, bits)), bits), dt=name)


def _result(v, name, wraps=True):
    """An op's result v, computed in its kind, as torch's result dtype `name` (wrapped into a
    narrow integer dtype's range unless the op cannot leave it)."""
    if wraps and name in _NARROW_INTS:
        return _wrap(v, name)
    return _with_dt(v, name)


def _round_const(x, name):
    if not math.isfinite(x):
        return x
    try:
        x = struct.unpack("<f", struct.pack("<f", x))[0]  # the float32 constant it is
    except OverflowError:
        return math.copysign(math.inf, x)
    if name == "float16":
        try:
            return struct.unpack("<e", struct.pack("<e", x))[0]
        except OverflowError:
            return math.copysign(math.inf, x)
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000) & 0xFFFFFFFF  # to nearest even
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _round_float(v, name):
    """An f32 value rounded to float16 / bfloat16 as torch's casts round (to nearest even, beyond
    the range to infinity, subnormals included), kept in f32: Veltkamp's split (x * (2^s + 1) and
    two subtractions round x to 24 - s bits) for normal values, a quantum added and taken away
    for subnormal ones."""
    c = _const_value(v)
    if c is not None:
        return Value(v.trace, F32, "const", attr=_round_const(c, name), dt=name)
    t = v.trace

    def op(name, *args):
        return Value(t, F32, name, args)

    def k(x):
        return _coerce(float(x))

    def sel(cond, a, b):
        return Value(t, F32, "arith.select", (cond, a, b))

    def cmp(pred, a, b):
        return Value(t, I1, "cmpf", (a, b), attr=pred)

    a = op("math.absf", v)
    if name == "float16":
        x, split = v, k(2.0**13 + 1)
        tiny, quantum, zero = 2.0**-14, 0.75, 2.0**-25  # 0.75: its ulp is float16's quantum 2^-24
    else:  # bfloat16 has float32's exponents: the split's product would overflow near the top
        big = cmp("oge", a, k(2.0**100))
        x, split = sel(big, op("arith.mulf", v, k(2.0**-64)), v), k(2.0**16 + 1)
        tiny, quantum, zero = 2.0**-126, 1.5 * 2.0**-110, 2.0**-134  # ulp(1.5 * 2^-110) = 2^-133
    cx = op("arith.mulf", x, split)
    hi = op("arith.subf", cx, op("arith.subf", cx, x))
    if name == "bfloat16":
        hi = sel(big, op("arith.mulf", hi, k(2.0**64)), hi)
    sub = op("arith.subf", op("arith.addf", v, k(quantum)), k(quantum))
    r = sel(cmp("olt", a, k(tiny)), sub, hi)
    r = sel(cmp("ole", a, k(zero)), op("arith.mulf", v, k(0.0)), r)  # rounds to a zero of x's sign
    if name == "float16":
        r = sel(cmp("oge", a, k(65520.0)), op("arith.mulf", v, k(math.inf)), r)  # beyond float16: +-inf
    else:
        r = sel(cmp("oeq", a, k(math.inf)), v, r)
    return _with_dt(r, name)


def _convert_dt(v, name):
    """v converted to torch dtype `name` (.to(dtype)): narrow integers wrap, float16 / bfloat16
    round, floats truncate toward zero into integers, anything nonzero is True."""
    v = _coerce(v)
    src = _dt(v)
    if src == name:
        return v
    w = _convert(v, _DT_KIND[name])
    if name in _NARROW_INTS:
        lo, hi = _NARROW_INTS[name]
        if src == "bool" or (src in _NARROW_INTS and lo <= _NARROW_INTS[src][0] and _NARROW_INTS[src][1] <= hi):
            return _with_dt(w, name)
        return _wrap(w, name)
    if name in ("float16", "bfloat16") and src not in ("bool", "uint8", "int8"):
        return _round_float(w, name)  # (bools and 8-bit integers are exact in both)
    return _with_dt(w, name)


# ---- operations -----------------------------------------------------------------------------

def _filled(like, size, dtype, value):
    if tuple(size) not in ((), (1,)):
        _fail(f"a traced mod computes scalars; cannot make a tensor of size {tuple(size)}")
    name = _operand_dtype(like)[0] if dtype is None else _dt_name(dtype, "dtype")
    kind = _DT_KIND[name]
    return _with_dt(_coerce(bool(value) if kind == I1 else float(value) if kind == F32 else int(value)), name)


def _const_value(v):
    return v.attr if v.op == "const" else None


def _convert(v, to):
    """v as IR kind `to` (f32, i32, i1): the value's conversion, torch dtypes aside."""
    v = _coerce(v)
    if v.kind == to:
        return v
    c = _const_value(v)
    if c is not None and (v.kind != F32 or math.isfinite(c)):  # fold constants: `score * 2` is one mulf
        if to == F32:
            return _coerce(float(c))
        if to == I32:
            return _coerce(builtins.int(c) if v.kind != F32 else builtins.int(math.trunc(c)))
        return _coerce(bool(c))
    if to == I1:
        zero = _coerce(0.0 if v.kind == F32 else 0)
        return _compare("ne", v, zero)
    if v.kind == I32 and to == F32:
        return Value(v.trace, F32, "sitofp", (v,))
    if v.kind == F32 and to == I32:
        return Value(v.trace, I32, "fptosi", (v,))
    if v.kind == I1 and to == I32:
        return Value(v.trace, I32, "extui", (v,))
    return Value(v.trace, F32, "uitofp", (v,))  # i1 -> f32


def _promote(a, b, floor=I32, rd=None):
    """Both operands converted to torch's result dtype for them (rd, by default _result_dtype's):
    (a, b, the kind computed in, rd). Bools compute as i32 (0, 1) unless floor is I1; a Python
    int meeting a uint8 / int8 / int16 value is converted into its range, as torch converts it."""
    if rd is None:
        rd = _result_dtype(a, b)
    k = _DT_KIND[rd]
    if k == I1 and floor == I32:
        k = I32
    out = []
    for v in [_coerce(x) for x in (a, b)]:  # both coerced first: their nodes precede the conversions
        v = _convert(v, k)
        if rd in _NARROW_INTS and _const_value(v) is not None:
            v = _wrap(v, rd)
        out.append(v)
    return out[0], out[1], k, rd


def _is_bool_tensor(x):
    return _operand_dtype(x) == ("bool", False)


def _refuse_bool(what, a):
    if _is_bool_tensor(a):
        _fail(f"{what} of a boolean is not supported by torch (not implemented for 'Bool'); convert it "
              "with .int() or .float() first")


def _refuse_bool_result(what, a, b):
    if _result_dtype(a, b) == "bool":
        _fail(f"{what} is not supported by torch (not implemented for 'Bool'); convert one with .int() first")


_IOPS = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli"}
_FOPS = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf"}


def _arith(op, a, b):
    if op == "sub" and (_is_bool_tensor(a) or _is_bool_tensor(b)):
        _fail("subtraction with a boolean is not supported by torch (of two booleans, `^` is their "
              "logical_xor; `~` inverts a mask); convert it with .int() first")
    a, b, k, rd = _promote(a, b, floor=I1)
    if k == I1:  # torch: bool + bool is a logical or, bool * bool an and
        return Value(a.trace, I1, "arith.ori" if op == "add" else "arith.andi", (a, b))
    return _result(Value(a.trace, k, (_FOPS if k == F32 else _IOPS)[op], (a, b)), rd)


def _truediv(a, b):
    rd = _result_dtype(a, b)
    a, b = _convert(_coerce(a), F32), _convert(_coerce(b), F32)
    return _with_dt(Value(a.trace, F32, "arith.divf", (a, b)), rd if _category(rd) == 2 else "float32")


def _float_mod_parts(a, b):
    """(fmod(a, b), whether it has the divisor's sign wrong): the first steps of torch's float
    floor division and remainder (c10's div_floor_floating, remainder), Python's // and %."""
    mod = Value(a.trace, F32, "arith.remf", (a, b))
    wrong = _bitwise("and", _compare("ne", mod, 0.0), _compare("ne", _compare("lt", b, 0.0), _compare("lt", mod, 0.0)))
    return mod, wrong


def _floordiv(a, b):
    _refuse_bool_result("`//` of a boolean by a boolean", a, b)
    a, b, k, rd = _promote(a, b)
    if k == F32:
        # torch's (and Python's) float //, not floor(a / b): that rounds a / b first (1.0 // 0.1
        # is 9, floor(1.0 / 0.1) 10) and gives ±inf for ±inf // b (torch: nan)
        mod, wrong = _float_mod_parts(a, b)
        div = Value(a.trace, F32, "arith.divf", (_arith("sub", a, mod), b))
        div = _where_(wrong, _arith("sub", div, 1.0), div)
        fl = _floor(div)
        fl = _where_(_compare("gt", _arith("sub", div, fl), 0.5), _arith("add", fl, 1.0), fl)
        quotient = Value(a.trace, F32, "arith.divf", (a, b))
        fl = _where_(_compare("ne", div, 0.0), fl, _arith("mul", quotient, 0.0))  # a zero with a / b's sign
        return _with_dt(_where_(_compare("eq", b, 0.0), quotient, fl), rd)  # b == 0: IEEE a / b
    if _const_value(b) == -1:
        return _neg(a)  # torch: INT_MIN // -1 wraps to INT_MIN (arith's floordivsi: undefined)
    # (int8 -128 // -1 wraps to -128, as torch's does)
    return _result(Value(a.trace, I32, "arith.floordivsi", (a, b)), rd, wraps=rd != "uint8")


def _mod(a, b):
    """Python's (and torch.remainder's) %: the result has the divisor's sign."""
    _refuse_bool_result("`%` of a boolean by a boolean", a, b)
    a, b, k, rd = _promote(a, b)
    if k == F32:
        mod, wrong = _float_mod_parts(a, b)  # torch's remainder: fmod, moved by b where the signs differ
        return _with_dt(_where_(wrong, _arith("add", mod, b), mod), rd)
    if _const_value(b) == -1:
        return _with_dt(_coerce(0), rd)  # torch: INT_MIN % -1 is 0 (arith's remsi: undefined)
    # Recorded as one node: `x % d == 0` / `!= 0` compares the remainder alone (the sign fix-up
    # cannot change whether it is zero), the C++ frontend's `(q - kv) % d == 0`.
    return _with_dt(Value(a.trace, I32, "floormod", (a, b)), rd)


def _fmod(a, b):
    """torch.fmod: the result has the dividend's sign (C's %)."""
    _refuse_bool_result("torch.fmod of a boolean by a boolean", a, b)
    a, b, k, rd = _promote(a, b)
    if k == I32 and _const_value(b) == -1:
        return _with_dt(_coerce(0), rd)  # (INT_MIN's too, as torch's)
    return _with_dt(Value(a.trace, k, "arith.remf" if k == F32 else "arith.remsi", (a, b)), rd)


def _pow(a, b):
    _refuse_bool_result("`**` of a boolean to a boolean power", a, b)
    e = b if isinstance(b, builtins.int) and not isinstance(b, bool) else None  # (a weak exponent is not converted)
    a, b, k, rd = _promote(a, b)
    if k != F32:
        # torch: an integer to a non-negative integer power is an integer (q_idx ** 2 stays exact)
        e = _const_value(b) if e is None else e
        if e is None:
            _fail("an integer to a traced integer power: torch keeps it an integer, which fajit computes only "
                  "for constant exponents; convert one side with .float()")
        if e < 0:
            _fail("Integers to negative integer powers are not allowed (torch's error); use a float base")
        out, base = _coerce(1), a
        while e:  # square and multiply
            if e & 1:
                out = base if _const_value(out) == 1 else _arith("mul", out, base)
            e >>= 1
            if e:
                base = _arith("mul", base, base)
        return _with_dt(out, rd)  # (each product wrapped into a narrow dtype's range, as torch's)
    if _const_value(b) == 2.0:
        return _arith("mul", a, a)
    return _with_dt(Value(a.trace, F32, "math.powf", (a, b)), rd)


def _neg(a):
    a = _coerce(a)
    if a.kind == I1:
        _fail("negating a boolean is not supported by torch (\"Negation, the `-` operator, on a bool tensor is "
              "not supported. If you are trying to invert a mask, use the `~` or logical_not() operator "
              "instead\")")
    if a.kind == F32:
        return Value(a.trace, F32, "arith.negf", (a,), dt=a.dt)
    return _arith("sub", 0, a)  # (a uint8 wraps)


def _abs(a):
    a = _coerce(a)
    _refuse_bool("abs", a)
    if a.dt == "uint8":
        return a
    if a.kind == F32:
        return Value(a.trace, F32, "math.absf", (a,), dt=a.dt)
    return _result(Value(a.trace, I32, "math.absi", (a,)), _dt(a))  # (int8's abs(-128) wraps to -128, as torch's)


def _shift(op, a, b):
    a, b, k, rd = _promote(a, b)
    if k != I32 or rd == "bool":
        _fail("shifts need integers")
    t = a.trace
    s = _const_value(b)
    if s is not None and 0 <= s < 32:
        v = Value(t, I32, "arith." + op, (a, b))
    elif op == "shli":
        # torch: a left shift by an amount outside [0, 32) is 0 (arith's shli is poison there)
        if s is not None:
            v = _coerce(0)
        else:
            ok = Value(t, I1, "cmpi", (b, _coerce(32)), attr="ult")
            shifted = Value(t, I32, "arith.shli", (a, Value(t, I32, "arith.minui", (b, _coerce(31)))))
            v = Value(t, I32, "arith.select", (ok, shifted, _coerce(0)))
    else:
        # and a right shift by 32 or more (or a negative amount) fills with the sign bit, as a >> 31:
        # the amount is read unsigned and capped at 31
        v = Value(t, I32, "arith.shrsi", (a, _coerce(31) if s is not None else
                                          Value(t, I32, "arith.minui", (b, _coerce(31)))))
    return _result(v, rd, wraps=op == "shli")


_PRED_I = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}
_PRED_F = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


def _compare(op, a, b):
    rd = _result_dtype(a, b)  # (before coercion: a Python int compared with a uint8 wraps, as in torch)
    a, b = _coerce(a), _coerce(b)
    if op in ("eq", "ne"):
        # x % d == 0: the remainder is zero exactly when C's remainder is.
        for x, y in ((a, b), (b, a)):
            if x.op == "floormod" and _const_value(y) == 0 and y.kind != F32:
                x = Value(x.trace, I32, "arith.remsi", x.args)
                a, b = x, y
                break
    if a.kind == I1 and b.kind == I1 and op in ("eq", "ne"):
        return Value(a.trace, I1, "cmpi", (a, b), attr=op)
    a, b, k, _ = _promote(a, b, rd=rd)
    if k == F32:
        return Value(a.trace, I1, "cmpf", (a, b), attr=_PRED_F[op])
    return Value(a.trace, I1, "cmpi", (a, b), attr=_PRED_I[op])


def _bitwise(op, a, b):
    a, b, k, rd = _promote(a, b, floor=I1)
    if k == F32:
        _fail(f"bitwise `{ {'and': '&', 'or': '|', 'xor': '^'}[op] }` needs booleans or integers, got a float")
    if op == "xor" and k == I1:
        return Value(a.trace, I1, "cmpi", (a, b), attr="ne")
    return _with_dt(Value(a.trace, k, f"arith.{op}i", (a, b)), rd)  # (in the operands' range)


def _invert(a):
    a = _coerce(a)
    if a.kind == F32:
        _fail("`~` needs a boolean or an integer, got a float")
    mask = True if a.kind == I1 else 255 if a.dt == "uint8" else -1
    return Value(a.trace, a.kind, "arith.xori", (a, _coerce(mask)), dt=a.dt)


_UNARY = {"exp": "math.exp", "exp2": "math.exp2", "log": "math.log", "log2": "math.log2", "tanh": "math.tanh",
          "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "sin": "math.sin", "cos": "math.cos", "erf": "math.erf",
          "floor": "math.floor", "ceil": "math.ceil"}


def _unary(op, a):
    a = _convert(_coerce(a), F32)  # (of an integer: float32, as torch's)
    return Value(a.trace, F32, _UNARY[op], (a,), dt=a.dt)


def _floor(a):
    a = _coerce(a)
    _refuse_bool("floor", a)
    return a if a.kind != F32 else _unary("floor", a)


def _ceil(a):
    a = _coerce(a)
    _refuse_bool("ceil", a)
    return a if a.kind != F32 else _unary("ceil", a)


def _sigmoid(a):
    # 1 / (1 + exp(-x)), as the C++ frontend's fa::sigmoid
    a = _convert(_coerce(a), F32)
    return _truediv(1.0, _arith("add", 1.0, _unary("exp", _neg(a))))


def _minmax(op, a, b):
    """torch.minimum / maximum ("min", "max": a NaN operand gives NaN) and torch.fmin / fmax
    ("fmin", "fmax": a NaN operand gives the other one)."""
    a, b, k, rd = _promote(a, b, floor=I1)
    if k == I1:  # torch: of two booleans, minimum is their and, maximum their or
        return Value(a.trace, I1, "arith.andi" if op in ("min", "fmin") else "arith.ori", (a, b))
    if k != F32:
        op = op.lstrip("f")
    name = {("min", F32): "arith.minimumf", ("max", F32): "arith.maximumf",
            ("fmin", F32): "arith.minnumf", ("fmax", F32): "arith.maxnumf",
            ("min", I32): "arith.minsi", ("max", I32): "arith.maxsi"}[(op, k)]
    return _with_dt(Value(a.trace, k, name, (a, b)), rd)


def _clamp(a, lo=None, hi=None):
    a = _coerce(a)
    if lo is None and hi is None:
        _fail("clamp needs min or max")
    rd = _result_dtype(*(x for x in (a, lo, hi) if x is not None))
    if rd in _NARROW_INTS:
        # torch (2.15; 2.11 converted them, wrapping, or raised): a Python int bound beyond a
        # uint8 / int8 / int16 operand's range clamps nothing, or everything (its error)
        lowest, highest = _NARROW_INTS[rd]
        for bound, side in ((lo, "min"), (hi, "max")):
            if isinstance(bound, builtins.int) and not isinstance(bound, bool) and not lowest <= bound <= highest:
                if (bound > highest) == (side == "min"):
                    _fail(f"clamp: the {side} value {bound} is outside the range of torch.{rd} (torch's error)")
        lo = None if isinstance(lo, builtins.int) and not isinstance(lo, bool) and lo < lowest else lo
        hi = None if isinstance(hi, builtins.int) and not isinstance(hi, bool) and hi > highest else hi
        if lo is None and hi is None:
            return a
    if lo is not None:
        a = _minmax("max", a, lo)
    if hi is not None:
        a = _minmax("min", a, hi)
    return a


def _where_(cond, a, b):
    c = _convert(_coerce(cond, "condition"), I1)
    rd = _result_dtype(a, b)
    _check_fits(a, rd, "torch.where")
    _check_fits(b, rd, "torch.where")
    a, b, k, rd = _promote(a, b, floor=I1, rd=rd)
    return _with_dt(Value(c.trace, k, "arith.select", (c, a, b)), rd)


def _masked_fill(x, mask, value):
    """torch's x.masked_fill(mask, value): value converted to x's dtype (an int tensor filled
    with 2.7 holds 2), unlike torch.where, which promotes."""
    x = _coerce(x)
    _check_fits(value, _dt(x), "masked_fill")
    return _where_(mask, _convert_dt(value, _dt(x)), x)


def _check_fits(x, name, what):
    """torch.where and masked_fill convert a Python number into a uint8 / int8 / int16
    operand's dtype checked (a negative int wraps into uint8 down to -255), and a float into an
    integer one only where it has a value there (not inf or NaN): beyond, torch's error."""
    if isinstance(x, float) and _category(name) == 1 and not -2.0**31 <= x < 2.0**31:
        _fail(f"{what}: the value {x!r} cannot be converted to torch.{name} without overflow (torch's error; "
              "fill a float value, e.g. with .float() first, to mask with -inf)")
    if name not in _NARROW_INTS or isinstance(x, bool) or not isinstance(x, (builtins.int, float)):
        return
    lo, hi = _NARROW_INTS[name]
    if isinstance(x, float):
        bad = not lo <= x <= hi  # (NaN and inf too)
    else:
        bad = x > hi or (x < -hi if name == "uint8" else x < lo)
    if bad:
        _fail(f"{what}: the value {x!r} cannot be converted to torch.{name} without overflow (torch's error)")


def _to(v, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, str) or type(a).__name__ == "device":
            continue  # .to("cuda") / .to(device): the trace has no device
        dtype = a
    if dtype is None:
        return v
    t = sys.modules.get("torch")
    if isinstance(dtype, (Value, Scalar)) or (t is not None and isinstance(dtype, t.Tensor)):
        return _convert_dt(v, _operand_dtype(dtype)[0])  # .to(other): other's dtype
    return _convert_dt(v, _dt_name(dtype, ".to()"))


# ---- torch functions ------------------------------------------------------------------------

_TABLE = None


def _torch_table():
    global _TABLE
    if _TABLE is not None:
        return _TABLE
    import torch

    T = torch.Tensor
    un = lambda op: (lambda x, *a, **k: _unary(op, x))  # noqa: E731
    tab = {}

    def add(fns, handler):
        for f in fns:
            if f is not None:
                tab[f] = handler

    g = lambda obj, name: getattr(obj, name, None)  # noqa: E731
    for op in _UNARY:
        if op in ("floor", "ceil"):
            continue
        add([g(torch, op), g(T, op), g(torch.special, op) if op in ("exp2", "erf") else None], un(op))
    add([torch.floor, T.floor], lambda x: _floor(x))
    add([torch.ceil, T.ceil], lambda x: _ceil(x))
    add([torch.sigmoid, T.sigmoid, g(torch.special, "expit"), g(torch.nn.functional, "sigmoid")],
        lambda x: _sigmoid(x))
    add([torch.abs, T.abs, T.__abs__, g(torch, "absolute")], lambda x: _abs(x))
    add([torch.neg, T.neg, T.__neg__, g(torch, "negative")], lambda x: _neg(x))
    add([torch.square, T.square], lambda x: _pow(x, 2))  # (of a bool: an int, as torch's)
    add([torch.where], lambda c, a=None, b=None: _where_(c, a, b))
    add([T.where], lambda x, cond, other: _where_(cond, x, other))  # x.where(cond, other)
    add([torch.minimum, T.minimum], lambda a, b: _minmax("min", a, b))
    add([torch.maximum, T.maximum], lambda a, b: _minmax("max", a, b))
    add([torch.fmin, T.fmin], lambda a, b: _minmax("fmin", a, b))
    add([torch.fmax, T.fmax], lambda a, b: _minmax("fmax", a, b))

    def minmax2(op):
        def f(a, b=None, *rest, **kw):
            if b is None or rest or kw:
                _fail(f"torch.{op} of one traced value (a reduction) is not supported; use torch.{op}imum(a, b)")
            return _minmax(op, a, b)
        return f

    add([torch.min, T.min], minmax2("min"))
    add([torch.max, T.max], minmax2("max"))
    add([torch.clamp, T.clamp, torch.clip, T.clip], lambda x, min=None, max=None: _clamp(x, min, max))
    add([g(torch, "clamp_min"), g(T, "clamp_min")], lambda x, min: _clamp(x, min, None))
    add([g(torch, "clamp_max"), g(T, "clamp_max")], lambda x, max: _clamp(x, None, max))
    add([torch.pow, T.pow, T.__pow__], lambda a, b: _pow(a, b))
    add([T.__rpow__], lambda a, b: _pow(b, a))
    add([torch.add, T.add, T.__add__], lambda a, b, alpha=1: _arith("add", a, b if alpha == 1 else _arith("mul", b, alpha)))
    add([T.__radd__], lambda a, b: _arith("add", b, a))
    add([torch.sub, T.sub, T.__sub__], lambda a, b, alpha=1: _arith("sub", a, b if alpha == 1 else _arith("mul", b, alpha)))
    add([T.__rsub__, g(torch, "rsub")],  # other - alpha * input
        lambda a, b, alpha=1: _arith("sub", b, a if alpha == 1 else _arith("mul", a, alpha)))
    add([torch.mul, T.mul, T.__mul__], lambda a, b: _arith("mul", a, b))
    add([T.__rmul__], lambda a, b: _arith("mul", b, a))

    def div(a, b, rounding_mode=None):
        if rounding_mode is None:
            return _truediv(a, b)
        if rounding_mode == "floor":
            return _floordiv(a, b)
        if rounding_mode != "trunc":
            _fail(f"torch.div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        _refuse_bool_result("torch.div(rounding_mode='trunc') of a boolean by a boolean", a, b)
        a2, b2, k, rd = _promote(a, b)
        if k == F32:
            q = _truediv(a2, b2)
            return _with_dt(_where_(_compare("lt", q, 0.0), _ceil(q), _floor(q)), rd)
        if _const_value(b2) == -1:
            return _neg(a2)  # (INT_MIN's: torch's CPU kernel traps)
        return _result(Value(a2.trace, I32, "arith.divsi", (a2, b2)), rd, wraps=rd != "uint8")

    add([torch.div, T.div, torch.true_divide, T.__truediv__, g(T, "__div__")], div)
    add([T.__rtruediv__, g(T, "__rdiv__")], lambda a, b: _truediv(b, a))
    add([torch.floor_divide, T.floor_divide, T.__floordiv__], lambda a, b: _floordiv(a, b))
    add([T.__rfloordiv__], lambda a, b: _floordiv(b, a))
    add([torch.remainder, T.remainder, T.__mod__], lambda a, b: _mod(a, b))
    add([g(T, "__rmod__")], lambda a, b: _mod(b, a))
    add([torch.fmod, T.fmod], lambda a, b: _fmod(a, b))
    for name, op in (("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne"),
                     ("less", "lt"), ("less_equal", "le"), ("greater", "gt"), ("greater_equal", "ge"),
                     ("not_equal", "ne")):
        add([g(torch, name), g(T, name), g(T, f"__{name}__")], (lambda op: lambda a, b: _compare(op, a, b))(op))
    for name, op in (("and", "and"), ("or", "or"), ("xor", "xor")):
        add([g(torch, f"bitwise_{name}"), g(T, f"bitwise_{name}"), g(T, f"__{name}__")],
            (lambda op: lambda a, b: _bitwise(op, a, b))(op))
        add([g(T, f"__r{name}__")], (lambda op: lambda a, b: _bitwise(op, b, a))(op))
        add([g(torch, f"logical_{name}"), g(T, f"logical_{name}")],
            (lambda op: lambda a, b: _bitwise(op, _convert(_coerce(a), I1), _convert(_coerce(b), I1)))(op))
    add([torch.bitwise_not, T.bitwise_not, T.__invert__], lambda a: _invert(a))
    add([torch.logical_not, T.logical_not], lambda a: _invert(_convert(_coerce(a), I1)))
    add([T.__lshift__, g(torch, "bitwise_left_shift")], lambda a, b: _shift("shli", a, b))
    add([T.__rshift__, g(torch, "bitwise_right_shift")], lambda a, b: _shift("shrsi", a, b))
    add([T.to], lambda x, *a, **k: _to(x, *a, **k))
    for fns, name in (((T.float, T.double), "float32"), ((T.half,), "float16"), ((T.bfloat16,), "bfloat16"),
                      ((T.int, T.long), "int32"), ((T.short,), "int16"), ((T.char,), "int8"),
                      ((T.byte,), "uint8"), ((T.bool,), "bool")):
        add(fns, (lambda name: lambda x, *a, **k: _convert_dt(x, name))(name))
    add([T.type_as], lambda x, o: _convert_dt(x, _operand_dtype(o)[0]))
    add([T.__getitem__], _torch_getitem)
    add([T.masked_fill, g(torch, "masked_fill")], lambda x, mask, value: _masked_fill(x, mask, value))
    add([T.new_ones], lambda x, size=(), dtype=None, **k: _filled(x, size, dtype, 1))
    add([T.new_zeros], lambda x, size=(), dtype=None, **k: _filled(x, size, dtype, 0))
    add([torch.ones_like], lambda x, dtype=None, **k: _filled(x, (), dtype, 1))
    add([torch.zeros_like], lambda x, dtype=None, **k: _filled(x, (), dtype, 0))
    _TABLE = tab
    return tab


def _torch_getitem(tensor, idx):
    import torch

    if not isinstance(tensor, torch.Tensor):
        _fail(f"cannot index {type(tensor).__name__}")
    if tensor.dim() == 0:
        _fail("a 0-d captured tensor cannot be indexed")
    if tensor.dim() > 4:
        _fail(f"captured tensors of rank 1 to 4 can be indexed, got rank {tensor.dim()}")
    if not (tensor.dtype.is_floating_point or tensor.dtype in (
            torch.bool, torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)):
        _fail(f"captured tensors of bool, float or integer dtype can be indexed, got {tensor.dtype}")
    # bound as float32 or int32 (bools too), what each element is in torch's dtype kept (Value.dt)
    dt = _tensor_dt(tensor.dtype)
    kind = F32 if _DT_KIND[dt] == F32 else I32
    t = _Trace.current
    return _load(tensor, t.names.hints.get(id(tensor), f"buf{len(t.names.objects)}"), tensor.dim(), kind, idx, dt)


def _has_value(x):
    """Whether a torch call must be traced: it has a traced value, or a captured 0-d tensor (a
    runtime scalar: `cap * 2` must read the value at run time, not compute it now)."""
    if isinstance(x, (Value, _PartialIndex)):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_value(i) for i in x)
    t = _Trace.current
    if t is not None and id(x) in t.names.hints and getattr(x, "dim", None) is not None:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(x, torch.Tensor) and x.dim() == 0
    return False


def _torch_name(func):
    mod = getattr(func, "__module__", None) or ""
    q = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if q.startswith("TensorBase.") or q.startswith("Tensor."):
        return "Tensor." + q.split(".", 1)[1]
    if q.startswith("_VariableFunctionsClass."):  # torch.cumsum and friends (some torch versions)
        return "torch." + q.split(".", 1)[1]
    return f"{'torch' if mod.startswith('torch') else mod}.{q}" if mod else q


def _torch_call(func, args, kwargs):
    handler = _torch_table().get(func)
    if handler is None:
        _fail(f"{_torch_name(func)} is not supported on traced values (supported: arithmetic, comparisons, "
              "&, |, ~, torch.where, exp, exp2, log, sqrt, tanh, sigmoid, abs, minimum, maximum, clamp, "
              "floor/ceil, .to(dtype), .float(), .int(), //, %)")
    return handler(*args, **kwargs)


def _make_mode():
    import torch

    T = torch.Tensor
    # What a captured tensor is asked about while it is traced (its rank, dtype, shape): answered,
    # never traced (a captured 0-d tensor is otherwise traced on every call, .dim() included).
    metadata = {T.dim, T.size, T.is_floating_point, T.numel, T.dtype.__get__, T.shape.__get__, T.ndim.__get__,
                T.device.__get__, T.requires_grad.__get__, T.is_cuda.__get__}

    class _TraceMode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in metadata:
                return func(*args, **kwargs)
            if _has_value(args) or _has_value(list(kwargs.values())):
                return _torch_call(func, args, kwargs)
            return func(*args, **kwargs)

    return _TraceMode()


# ---- captured names -------------------------------------------------------------------------

def _plain(obj):
    """obj as a comparable record if it is a plain value a trace bakes in as a constant (a number,
    a string, None, a flat tuple / list / dict of up to 16 of those), else _NOT_PLAIN."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj if not isinstance(obj, str) or len(obj) <= 256 else _NOT_PLAIN
    if isinstance(obj, numbers.Number):  # (a tensor is not a numbers.Number)
        return (type(obj).__name__, repr(obj))  # repr: exact for floats, and NaN equals itself
    if isinstance(obj, (list, tuple)) and len(obj) <= 16:  # flat and short: a per-call cost
        items = tuple(_plain_scalar(o) for o in obj)
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else (type(obj).__name__, items)
    if isinstance(obj, dict) and len(obj) <= 16:
        items = tuple((k, _plain_scalar(v)) for k, v in obj.items() if isinstance(k, str))
        return _NOT_PLAIN if any(v is _NOT_PLAIN for _, v in items) else ("dict", items)
    return _NOT_PLAIN


def _plain_scalar(obj):
    return _plain(obj) if not isinstance(obj, (list, tuple, dict)) else _NOT_PLAIN


_NOT_PLAIN = object()


def _name_hints(fns, values=None, reached=None):
    """id(obj) -> variable name for what the mods reach through closures and globals (also
    through functions they call, a few levels deep): names for captured tensors. With `values`
    (a list), also appends (name, record) for every plain value they reach there (numbers,
    strings, their short containers, an object's plain attributes, a method's owner's): what a
    trace bakes in as constants, so that a changed one is seen (fajit.torch traces again). With
    `reached` (a set), also adds the id of every tensor found, named or not.

    Tensors are looked for where the mods can read one: closures, globals, function defaults,
    a partial's arguments; the attributes the code names (an attribute, or a string constant:
    getattr(obj, "ids"), D["ids"]) of objects (their __dict__, slots, class attributes, an
    nn.Module's parameters, buffers and submodules) and of user modules, a few levels deep
    (batch.doc_ids, cfg.sub.bias); short containers' elements (dicts: the keys the code names,
    or all of a short one); the methods the code names, as bound methods; a callable object
    passed as a mod, through its __call__ (an nn.Module's forward). fajit.torch keys its cached
    trace on what is found: a tensor replaced there is a new trace, not a stale binding. Bounded
    (a per-call cost): at most 256 attributes and elements a snapshot, 16 levels; numbers and
    strings inside containers are skipped (a short container of them is a value). Not looked into:
    properties (their getters are code), an nn.Module's forward unless it is the mod itself,
    containers past 64 elements."""
    walker = _HintWalker(values, reached)
    for f in fns:
        if f is not None:
            walker.visit(f, 0, top=True)
    return walker.hints


class _HintWalker:
    """_name_hints' walk (its methods made once: the walk runs on every fajit.torch call)."""

    LIMIT = 16  # nesting (and_masks of and_masks ..., objects in objects); `seen` stops cycles

    def __init__(self, values, reached):
        self.hints = {}
        self.seen = set()
        self.budget = 256
        self.values = values
        self.reached = reached

    def spend(self):
        self.budget -= 1
        return self.budget >= 0

    def found(self, obj, short):
        if self.reached is not None:
            self.reached.add(id(obj))
        if isinstance(short, str) and short.isidentifier() and short.isascii():
            self.hints.setdefault(id(obj), short)

    @staticmethod
    def is_tensor(obj):
        return type(obj).__name__ in ("Tensor", "Parameter") or isinstance(obj, (Buffer, Scalar))

    def keep_value(self, name, obj):
        if self.values is None:
            return False
        rec = _plain(obj)
        if rec is not _NOT_PLAIN:
            self.values.append((name, rec))
            return True
        return False

    @staticmethod
    def attribute(obj, k):
        # obj's attribute k where reading it runs no user code (instance dict, an nn.Module's
        # tables, a slot, a class attribute that is no descriptor), else _NOT_PLAIN
        if isinstance(obj, type):  # a class: its own (and its bases') attributes
            for cls in obj.__mro__:
                v = cls.__dict__.get(k, _NOT_PLAIN)
                if v is not _NOT_PLAIN:
                    return _NOT_PLAIN if hasattr(type(v), "__get__") and not isinstance(v, types.FunctionType) else v
            return _NOT_PLAIN
        try:
            d = object.__getattribute__(obj, "__dict__")
        except Exception:  # noqa: BLE001 - no __dict__, or a hook that raises
            d = None
        if isinstance(d, dict):
            if k in d:
                return d[k]
            for table in ("_parameters", "_buffers", "_modules"):
                t = d.get(table)
                if isinstance(t, dict) and k in t:
                    return t[k]
        for cls in type(obj).__mro__:
            cd = cls.__dict__
            if k in cd:
                v = cd[k]
                if isinstance(v, types.MemberDescriptorType):  # a slot
                    try:
                        return v.__get__(obj, type(obj))
                    except Exception:  # noqa: BLE001 - an unset slot
                        return _NOT_PLAIN
                if isinstance(v, types.FunctionType):
                    return types.MethodType(v, obj)  # a method the code names: its reads too
                if isinstance(v, (property, staticmethod, classmethod)) or hasattr(type(v), "__get__"):
                    return _NOT_PLAIN
                return v
        return _NOT_PLAIN

    def keep_attributes(self, name, obj, read, depth):
        # the attributes of `obj` (an object or a module) that the code names
        if depth > self.LIMIT or (id(obj), read) in self.seen:
            return
        self.seen.add((id(obj), read))
        if isinstance(obj, types.ModuleType):
            d = obj.__dict__
            items = [(k, d[k]) for k in sorted(read) if k in d]
        else:
            items = [(k, self.attribute(obj, k)) for k in sorted(read)]
        for k, v in items:
            if v is not _NOT_PLAIN and self.spend():
                self.note(f"{name}.{k}", v, depth + 1, read, hint=k)

    def container(self, name, obj, depth, read):
        try:
            n = len(obj)
        except Exception:  # noqa: BLE001 - a container whose len() raises: not looked into
            return
        if n > 64 or depth > self.LIMIT or id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, dict):
            # the keys the code names (D["ids"]) where it names any, else a short dict whole
            named = [(k, obj[k]) for k in sorted(read) if k in obj]
            items = named if named or n > 16 else list(obj.items())
        elif n and _is_number(obj[0]) and _is_number(obj[-1]):
            items = ()  # a list of numbers (configuration data): a value if short, no tensor in it
        else:
            items = list(enumerate(obj))
        for k, o in items:
            if o is None or isinstance(o, (bool, int, float, complex, str, bytes)):
                if isinstance(obj, dict) and isinstance(k, str) and k in read:
                    self.keep_value(f"{name}[{k!r}]", o)  # CFG["window"]: a constant the trace bakes in
                continue  # (other numbers and strings: the container's own value, if short)
            if not self.spend():
                return
            label = f"{name}[{k!r}]" if isinstance(k, (str, int)) else f"{name}[?]"
            self.note(label, o, depth + 1, read, hint=k if isinstance(k, str) else None)
        self.keep_value(name, obj)

    def visit(self, fn, depth, top=False):
        if depth > self.LIMIT:
            return
        seen = self.seen
        if isinstance(fn, functools.partial):
            if id(fn) in seen:
                return
            seen.add(id(fn))
            func = fn.func
            read = _code_names(func.__code__) if isinstance(func, types.FunctionType) else frozenset()
            for a in list(fn.args) + list((fn.keywords or {}).values()):
                self.note("arg", a, depth, read)
            self.visit(func, depth + 1)
            return
        if not isinstance(fn, (types.FunctionType, types.MethodType)):
            # A callable object: what calling it runs. An nn.Module's forward only as the mod itself
            # (a module a mod reads attributes of often counts steps in its forward: a new trace
            # every call); other callable objects' __call__ wherever they are reached.
            module = hasattr(type(fn), "_call_impl")
            if top or not module:
                call = getattr(type(fn), "forward" if module else "__call__", None)
                if isinstance(call, types.FunctionType) and id(fn) not in seen:
                    seen.add(id(fn))
                    self.visit(types.MethodType(call, fn), depth + 1)
            return
        if isinstance(fn, types.MethodType):
            # a method of an nn.Module (say): its tensors, parameters and buffers by attribute
            owner_obj = fn.__self__
            owner = getattr(owner_obj, "__dict__", None)
            owner = owner if isinstance(owner, dict) else {}
            for d in (owner, owner.get("_parameters") or {}, owner.get("_buffers") or {}):
                if isinstance(d, dict):
                    for name, obj in d.items():
                        if isinstance(name, str) and type(obj).__name__ in ("Tensor", "Parameter"):
                            self.found(obj, name)
            fn = fn.__func__
            if isinstance(fn, types.FunctionType) and id(fn) not in seen:
                self.keep_attributes("self", owner_obj, _code_names(fn.__code__), depth)
        if not isinstance(fn, types.FunctionType) or id(fn) in seen:
            return
        seen.add(id(fn))
        code = fn.__code__
        if fn.__defaults__ or fn.__kwdefaults__:
            self.keep_value(f"{fn.__qualname__}.__defaults__", fn.__defaults__)
            self.keep_value(f"{fn.__qualname__}.__kwdefaults__", fn.__kwdefaults__)
            for d in list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values()):
                if self.is_tensor(d):
                    self.found(d, None)
        read = _code_names(code)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                self.note(name, cell.cell_contents, depth, read)
            except ValueError:  # empty cell
                pass
        g = fn.__globals__
        for name in read:
            if name in g:
                self.note(name, g[name], depth, read)

    def note(self, name, obj, depth, read=frozenset(), hint=""):
        # what the mods reach by `name` (a closure or global; with `hint`, an attribute or a
        # container's element, named by `hint` if it is a tensor: None, no name)
        try:
            if self.is_tensor(obj):
                self.found(obj, name if hint == "" else hint)
            elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
                self.visit(obj, depth + 1)
            elif isinstance(obj, (list, tuple, dict)):
                self.container(name, obj, depth, read)
            elif isinstance(obj, types.ModuleType):
                # a module's attributes the code reads (state.IDS): not torch's or another library's
                if obj.__name__.split(".")[0] not in _LIBRARY_MODULES:
                    self.keep_attributes(name, obj, read, depth)
            elif isinstance(obj, type):
                if obj.__module__.split(".")[0] not in _LIBRARY_MODULES | {"builtins"}:
                    self.keep_attributes(name, obj, read, depth)  # a user class's attributes: C.table
            elif not self.keep_value(name, obj):
                if callable(obj):
                    self.visit(obj, depth + 1)  # a callable object's __call__ (not an nn.Module's forward)
                self.keep_attributes(name, obj, read, depth)  # cfg.window; an object a closure holds
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - an object whose introspection raises is not looked into
            pass


def _is_number(x):
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool) or x is None


# Modules whose attributes the mods read as API (torch.where, math.pi): never captures of theirs.
_LIBRARY_MODULES = frozenset({"torch", "math", "numpy", "operator", "functools", "builtins", "fajit",
                              "triton", "cmath", "random"})


@functools.lru_cache(maxsize=4096)
@functools.lru_cache(maxsize=4096)
def _code_names(code):
    """The names a code object (and the code nested in it) reads: globals and attributes, and its
    short string constants (dict keys, getattr's names)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
        elif isinstance(c, str) and len(c) <= 64:
            names.add(c)
    return frozenset(names)


# ---- printing -------------------------------------------------------------------------------

def _f32_literal(x):
    try:
        packed = struct.pack("<f", x)
    except OverflowError:  # beyond float32: rounds to infinity
        packed = struct.pack("<f", math.copysign(math.inf, x))
    bits = struct.unpack("<I", packed)[0]
    return f"0x{bits:08X}"


def _emit(trace, result, kind_name, sym, fixed):
    """The fa op text for one traced mod whose value is `result`."""
    # Reachable nodes, in creation order (which is a topological order).
    live = set()
    stack = [result]
    while stack:
        n = stack.pop()
        if n.index in live:
            continue
        live.add(n.index)
        stack.extend(n.args)
    names = {a.index: "%" + a.attr for a in fixed}
    lines = []
    counter = [0]

    def fresh():
        counter[0] += 1
        return f"%{counter[0] - 1}"

    used_buffers = []
    for n in trace.nodes:
        if n.index not in live or n.op == "arg":
            continue
        if n.op == "alias":  # the same value as another dtype (int64 of an int8, ...): no op
            names[n.index] = names[n.args[0].index]
            continue
        ops = [names[a.index] for a in n.args]
        ty = n.kind
        if n.op == "const":
            if n.kind == I1:
                body = f"arith.constant {'true' if n.attr else 'false'}"
            elif n.kind == I32:
                body = f"arith.constant {n.attr} : i32"
            else:
                body = f"arith.constant {_f32_literal(n.attr)} : f32"
        elif n.op == "scalar":
            body = f'fa.scalar "{n.attr}" : {ty}'
        elif n.op == "load":
            kind, rank = trace.buffer_info[n.attr]
            if n.attr not in used_buffers:
                used_buffers.append(n.attr)
            body = f"fa.load %{n.attr}[{', '.join(ops)}] : !fa.buffer<{kind}, {rank}>"
        elif n.op == "cmpi":
            body = f"arith.cmpi {n.attr}, {ops[0]}, {ops[1]} : {n.args[0].kind}"
        elif n.op == "cmpf":
            body = f"arith.cmpf {n.attr}, {ops[0]}, {ops[1]} : f32"
        elif n.op == "arith.select":
            body = f"arith.select {ops[0]}, {ops[1]}, {ops[2]} : {ty}"
        elif n.op in ("sitofp", "fptosi", "extui", "uitofp"):
            body = f"arith.{n.op} {ops[0]} : {n.args[0].kind} to {ty}"
        elif n.op == "floormod":
            # Python's a % b: r = a rem b, plus b where r != 0 and r, b differ in sign.
            a, b = ops
            r, z, nz, x, neg, fix, s = (fresh() for _ in range(7))
            lines += [
                f"    {r} = arith.remsi {a}, {b} : i32",
                f"    {z} = arith.constant 0 : i32",
                f"    {nz} = arith.cmpi ne, {r}, {z} : i32",
                f"    {x} = arith.xori {r}, {b} : i32",
                f"    {neg} = arith.cmpi slt, {x}, {z} : i32",
                f"    {fix} = arith.andi {nz}, {neg} : i1",
                f"    {s} = arith.addi {r}, {b} : i32",
            ]
            body = f"arith.select {fix}, {s}, {r} : i32"
        else:
            body = f"{n.op} {', '.join(ops)} : {ty}"
        name = fresh()
        names[n.index] = name
        lines.append(f"    {name} = {body}")
    caps = ""
    if used_buffers:
        order = [b for b in trace.buffers if b in used_buffers]
        caps = " captures(" + ", ".join(
            f"%{b}: !fa.buffer<{trace.buffer_info[b][0]}, {trace.buffer_info[b][1]}>" for b in order) + ")"
    args = ", ".join(f"%{a.attr}: {a.kind}" for a in fixed)
    res = "f32" if kind_name == "score_mod" else "i1"
    head = f"  fa.{kind_name} @{sym}({args}){caps} -> {res} {{"
    return "\n".join([head] + lines + [f"    fa.yield {names[result.index]} : {res}", "  }"]), \
        [b for b in trace.buffers if b in used_buffers]


# ---- entry point ----------------------------------------------------------------------------

def _arity(fn):
    """How many positional arguments without a default fn takes (None: *args, or unknown)."""
    if type(fn) is types.FunctionType and not hasattr(fn, "__signature__") and not hasattr(fn, "__wrapped__"):
        # from the code object: inspect.signature costs ~50 us, at every create_block_mask call
        code = fn.__code__
        return None if code.co_flags & inspect.CO_VARARGS else code.co_argcount - len(fn.__defaults__ or ())
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    n = 0
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL,):
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            n += 1
    return n


def _symbol(fn, default, taken):
    name = getattr(fn, "__name__", "") or ""
    if not name.isidentifier() or not name.isascii() or name == "<lambda>":
        name = default
    if name == taken:
        name = name + "_" + default
    return name


def check_mod(fn, kind, argname):
    """Raises TypeError/ValueError naming `argname` unless fn is a callable of the mod's arity."""
    want = 5 if kind == "score_mod" else 4
    if not callable(fn):
        raise TypeError(f"{argname} must be a function of {want} arguments, got {type(fn).__name__}")
    n = _arity(fn)
    if n is not None and n != want:
        params = "(score, b, h, q_idx, kv_idx)" if want == 5 else "(b, h, q_idx, kv_idx)"
        raise TypeError(f"{argname} must take {want} arguments {params}; "
                        f"{getattr(fn, '__name__', 'it')!s} takes {n}")


class Trace:
    """The result of tracing: fa-dialect text and what it captures, by name."""

    def __init__(self, text, score_name, mask_name, objects, kinds):
        self.text = text
        self.score_name = score_name
        self.mask_name = mask_name
        self.objects = objects  # capture name -> the captured object (tensor, Buffer, Scalar)
        self.kinds = kinds  # capture name -> ("buffer", kind, rank) | ("scalar", kind)

    def __repr__(self):
        return self.text


def _trace_one(fn, kind, sym, names):
    t = _Trace(f"{kind} '{sym}'", names)
    if kind == "score_mod":
        fixed = [Value(t, F32, "arg", attr="score")] + [Value(t, I32, "arg", attr=a) for a in ("b", "h", "q", "kv")]
    else:
        fixed = [Value(t, I32, "arg", attr=a) for a in ("b", "h", "q", "kv")]
    saved = _Trace.current
    _Trace.current = t
    mode = None
    try:
        if "torch" in sys.modules:
            mode = _make_mode()
            mode.__enter__()
        try:
            r = fn(*fixed)
        finally:
            if mode is not None:
                mode.__exit__(None, None, None)
        if r is None:
            _fail(f"the {kind} returned None")
        if kind == "score_mod":
            r = _coerce(r, "result")
            if r.kind == I1:
                _fail("a score_mod must return a score (a float), got a boolean")
            r = _convert(r, F32)
        else:
            r = _coerce(r, "result")
            if r.kind != I1:
                _fail(f"a mask_mod must return a boolean (a comparison), got {'a float' if r.kind == F32 else 'an integer'}")
        return _emit(t, r, kind, sym, fixed)
    finally:
        _Trace.current = saved


def trace(score_mod=None, mask_mod=None):
    """Traces the mods (either may be None: identity / keep everything) into one fa module."""
    if score_mod is not None:
        check_mod(score_mod, "score_mod", "score_mod")
    if mask_mod is not None:
        check_mod(mask_mod, "mask_mod", "mask_mod")
    names = _Names(_name_hints([score_mod, mask_mod]))
    parts = []
    sname = mname = None
    if score_mod is not None:
        sname = _symbol(score_mod, "score_mod", None)
        parts.append(_trace_one(score_mod, "score_mod", sname, names)[0])
    if mask_mod is not None:
        mname = _symbol(mask_mod, "mask_mod", sname)
        parts.append(_trace_one(mask_mod, "mask_mod", mname, names)[0])
    text = "module {\n" + "\n".join(parts) + ("\n" if parts else "") + "}\n"
    return Trace(text, sname, mname, dict(names.objects), dict(names.kinds))


# ---- functions for mods written without torch (torch users call torch.where etc.) ------------

def where(cond, a, b):
    """a where cond holds, else b (torch.where)."""
    return _where_(cond, a, b)


def minimum(a, b):
    return _minmax("min", a, b)


def maximum(a, b):
    return _minmax("max", a, b)


def clamp(x, min=None, max=None):
    return _clamp(x, min, max)


def sigmoid(x):
    return _sigmoid(x)


def _make_unary(op):
    def f(x):
        return _unary(op, x)
    f.__name__ = op
    f.__doc__ = f"{op}(x) of a traced value (torch.{op})."
    return f


exp, exp2, log, log2, tanh, sqrt, rsqrt, sin, cos, erf = (
    _make_unary(o) for o in ("exp", "exp2", "log", "log2", "tanh", "sqrt", "rsqrt", "sin", "cos", "erf"))
