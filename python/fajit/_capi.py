"""ctypes bindings of the C API (compiler/include/fajit/fajit_c.h): the only way this package
talks to libfajit.so.

The library is found, in order, at $FAJIT_LIBRARY, next to this file (an installed wheel), or
in the source tree's build directory ($FAJIT_BUILD_DIR, else build/) when running from a
checkout with PYTHONPATH=python.
"""
from __future__ import annotations

import ctypes as C
import glob
import os
import threading

__all__ = ["lib", "FajitError", "check", "library_path", "Tensor", "Options", "Captures", "BufferCapture",
           "ScalarCapture", "CaptureInfo", "BlockMaskInfo", "ForwardOptions", "forward_options", "BackwardOptions",
           "backward_options", "DTYPES", "PATHS"]

# fajit_status
OK, INVALID_ARGUMENT, COMPILE, CUDA, IO, INTERNAL = range(6)
_STATUS = {INVALID_ARGUMENT: "invalid argument", COMPILE: "compile error", CUDA: "CUDA error", IO: "I/O error",
           INTERNAL: "internal error"}

# fajit_dtype
F16, BF16, F32, I32 = 0, 1, 2, 3
DTYPES = {"f16": F16, "bf16": BF16, "f32": F32, "i32": I32}

# fajit_warm_flag
(WARM_BLOCK_MASK, WARM_BACKWARD, WARM_DETERMINISTIC, WARM_DECODE, WARM_RAGGED, WARM_PAGED, WARM_ROW_MAX,
 WARM_CANDIDATES) = (1, 2, 4, 8, 16, 32, 64, 128)

# fajit_forward_path
PATH_AUTO, PATH_PREFILL, PATH_DECODE = 0, 1, 2
PATHS = {"auto": PATH_AUTO, "prefill": PATH_PREFILL, "decode": PATH_DECODE}

# fajit_block_table
TABLES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")


class FajitError(RuntimeError):
    """An error reported by libfajit (the C API's status and message)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class Options(C.Structure):
    _fields_ = [("dtype", C.c_int), ("head_dim_qk", C.c_int), ("head_dim_v", C.c_int), ("arch", C.c_char_p)]


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("rank", C.c_int), ("shape", C.c_int64 * 4),
                ("stride", C.c_int64 * 4)]


class BufferCapture(C.Structure):
    _fields_ = [("name", C.c_char_p), ("tensor", Tensor)]


class ScalarCapture(C.Structure):
    _fields_ = [("name", C.c_char_p), ("is_float", C.c_int), ("f", C.c_float), ("i", C.c_int32)]


class Captures(C.Structure):
    _fields_ = [("buffers", C.POINTER(BufferCapture)), ("num_buffers", C.c_int),
                ("scalars", C.POINTER(ScalarCapture)), ("num_scalars", C.c_int)]


class CaptureInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("is_buffer", C.c_int), ("is_float", C.c_int), ("rank", C.c_int),
                ("used_by_score", C.c_int), ("used_by_mask", C.c_int), ("has_gradient", C.c_int)]


class BlockMaskInfo(C.Structure):
    _fields_ = [("batch", C.c_int), ("heads", C.c_int), ("len_q", C.c_int64), ("len_kv", C.c_int64),
                ("q_block", C.c_int), ("kv_block", C.c_int), ("num_q_blocks", C.c_int),
                ("num_kv_blocks", C.c_int)]


class ForwardOptions(C.Structure):
    """fajit_forward_options; start from forward_options() (struct_size set by the library)."""
    _fields_ = [("struct_size", C.c_size_t), ("scale", C.c_float), ("path", C.c_int), ("decode_splits", C.c_int),
                ("cu_seqlens_q", C.POINTER(Tensor)), ("cu_seqlens_k", C.POINTER(Tensor)),
                ("seqlens_k", C.POINTER(Tensor)), ("page_table", C.POINTER(Tensor)), ("max_seqlen_q", C.c_int),
                ("max_seqlen_k", C.c_int), ("check_tables", C.c_int), ("max_scores", C.POINTER(Tensor))]


class BackwardOptions(C.Structure):
    """fajit_backward_options; start from backward_options() (struct_size set by the library)."""
    _fields_ = [("struct_size", C.c_size_t), ("scale", C.c_float), ("dlse", C.POINTER(Tensor)),
                ("deterministic", C.c_int), ("cu_seqlens_q", C.POINTER(Tensor)), ("cu_seqlens_k", C.POINTER(Tensor)),
                ("max_seqlen_q", C.c_int), ("max_seqlen_k", C.c_int), ("check_tables", C.c_int)]


_P = C.c_void_p
_PT = C.POINTER(Tensor)
_PC = C.POINTER(Captures)
_SIGNATURES = {
    "fajit_last_error": (C.c_char_p, []),
    "fajit_default_options": (Options, []),
    "fajit_compile_mlir": (C.c_int, [C.c_char_p, C.POINTER(Options), C.POINTER(_P)]),
    "fajit_compile_preset": (C.c_int, [C.c_char_p, C.c_char_p, C.POINTER(Options), C.POINTER(_P)]),
    "fajit_program_parse": (C.c_int, [C.c_char_p, C.POINTER(_P)]),
    "fajit_program_preset": (C.c_int, [C.c_char_p, C.c_char_p, C.POINTER(_P)]),
    "fajit_program_destroy": (None, [_P]),
    "fajit_program_mlir": (C.c_char_p, [_P]),
    "fajit_program_score_grad_mlir": (C.c_int, [_P, C.POINTER(C.c_char_p)]),
    "fajit_program_num_captures": (C.c_int, [_P]),
    "fajit_program_capture": (C.c_int, [_P, C.c_int, C.POINTER(CaptureInfo)]),
    "fajit_program_evaluate": (C.c_int, [_P, C.c_int64] + [C.POINTER(C.c_int32)] * 4 +
                               [C.POINTER(C.c_float), _PC, C.POINTER(C.c_float), C.POINTER(C.c_uint8)]),
    "fajit_compile_program": (C.c_int, [_P, C.POINTER(Options), C.POINTER(_P)]),
    "fajit_compile_program_background": (C.c_int, [_P, C.POINTER(Options), C.c_uint, C.POINTER(_P)]),
    "fajit_program_block_mask": (C.c_int, [_P, C.c_int, C.c_int, C.c_int64, C.c_int64, C.c_int, C.c_int, _PC,
                                           C.POINTER(Options), _P, C.POINTER(_P)]),
    "fajit_kernel_destroy": (None, [_P]),
    "fajit_kernel_cuda_source": (C.c_char_p, [_P]),
    "fajit_kernel_mlir": (C.c_char_p, [_P]),
    "fajit_kernel_cache_key": (C.c_char_p, [_P]),
    "fajit_kernel_origin": (C.c_char_p, [_P]),
    "fajit_kernel_autotune_report": (C.c_char_p, [_P]),
    "fajit_kernel_warm": (C.c_int, [_P, C.c_uint, C.POINTER(C.c_int)]),
    "fajit_kernel_block_mask_sized": (C.c_int, [_P, C.c_int, C.c_int, C.c_int64, C.c_int64, C.c_int, C.c_int,
                                                _PC, _P, C.POINTER(_P)]),
    "fajit_block_mask_from_kv_blocks": (C.c_int, [C.c_int, C.c_int, C.c_int64, C.c_int64, C.c_int, C.c_int,
                                                  _P, _P, _P, _P, C.POINTER(_P)]),
    "fajit_block_mask_from_device_kv_blocks": (C.c_int, [C.c_int, C.c_int, C.c_int64, C.c_int64, C.c_int, C.c_int,
                                                         _P, _P, _P, _P, C.POINTER(_P)]),
    "fajit_block_mask_all_full": (C.c_int, [C.c_int, C.c_int, C.c_int64, C.c_int64, C.c_int, C.c_int,
                                            C.POINTER(_P)]),
    "fajit_block_mask_destroy": (None, [_P]),
    "fajit_block_mask_get_info": (C.c_int, [_P, C.POINTER(BlockMaskInfo)]),
    "fajit_block_mask_table": (C.c_int, [_P, C.c_int, _P, C.c_size_t, C.POINTER(C.c_size_t)]),
    "fajit_block_mask_copy_tables": (C.c_int, [_P, _P, C.c_size_t, _P]),
    "fajit_block_mask_built_on_device": (C.c_int, [_P, C.POINTER(C.c_int)]),
    "fajit_block_mask_to_string": (C.c_char_p, [_P, C.c_int, C.c_int]),
    "fajit_block_mask_density": (C.c_int, [_P, C.POINTER(C.c_double), C.POINTER(C.c_int64),
                                           C.POINTER(C.c_int64), C.POINTER(C.c_int64)]),
    "fajit_kernel_forward": (C.c_int, [_P, _PT, _PT, _PT, _PT, _PT, C.c_float, _P, _PC, _P]),
    "fajit_forward_options_init_sized": (None, [C.POINTER(ForwardOptions), C.c_size_t]),
    "fajit_kernel_forward_ex": (C.c_int, [_P, _PT, _PT, _PT, _PT, _PT, C.POINTER(ForwardOptions), _P, _PC, _P]),
    "fajit_kernel_backward": (C.c_int, [_P, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, C.c_float, _P,
                                        _PC, _PC, C.c_int, _P]),
    "fajit_backward_options_init": (None, [C.POINTER(BackwardOptions)]),
    "fajit_kernel_backward_ex": (C.c_int, [_P, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT, _PT,
                                           C.POINTER(BackwardOptions), _P, _PC, _PC, _P]),
}

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("FAJIT_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = sorted(glob.glob(os.path.join(here, "libfajit.so*")), key=len)
    root = os.path.dirname(os.path.dirname(here))
    build = os.environ.get("FAJIT_BUILD_DIR", "build")
    build = build if os.path.isabs(build) else os.path.join(root, build)
    out.append(os.path.join(build, "libfajit.so"))
    return out


def library_path():
    """Where libfajit.so is (loading it if needed)."""
    lib()
    return _path


def lib():
    """The loaded library, with argument and result types set."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for p in _candidates():
            if not os.path.exists(p):
                tried.append(p + " (missing)")
                continue
            try:
                handle = C.CDLL(p)
            except OSError as e:
                tried.append(f"{p} ({e})")
                continue
            for name, (res, args) in _SIGNATURES.items():
                try:
                    f = getattr(handle, name)
                except AttributeError:
                    raise FajitError(INTERNAL, f"{p} lacks {name}: it is older than this fajit package")
                f.restype = res
                f.argtypes = args
            _lib, _path = handle, p
            return _lib
        raise FajitError(IO, "cannot find libfajit.so; set FAJIT_LIBRARY to its path (tried: "
                         + "; ".join(tried) + ")")


def last_error():
    return (lib().fajit_last_error() or b"").decode("utf-8", "replace")


def check(status, what=None):
    if status != OK:
        msg = last_error()
        raise FajitError(status, f"{what}: {msg}" if what else msg)


def text(p):
    return (p or b"").decode("utf-8", "replace")


def _options(struct, init, name, sized=False):
    """A `struct` set to the defaults by the library's `init` (`sized`: told this module's
    sizeof), checked to be the layout this module mirrors (a library of another version would
    read the fields at other offsets)."""
    o = struct()
    getattr(lib(), init)(C.byref(o), *((C.sizeof(struct),) if sized else ()))
    if o.struct_size != C.sizeof(struct):
        raise FajitError(INTERNAL, f"{_path}: {name} is {o.struct_size} bytes there and {C.sizeof(struct)} in this "
                         f"fajit package; they are from different versions")
    return o


def forward_options():
    """A fajit_forward_options with the library's defaults (fajit_forward_options_init_sized)."""
    return _options(ForwardOptions, "fajit_forward_options_init_sized", "fajit_forward_options", sized=True)


def backward_options():
    """A fajit_backward_options with the library's defaults (fajit_backward_options_init)."""
    return _options(BackwardOptions, "fajit_backward_options_init", "fajit_backward_options")
