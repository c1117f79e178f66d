#!/usr/bin/env python3
"""Forward attention: fajit (libfajit.so through its C API, ctypes) vs torch flex_attention
(torch.compile'd) vs SDPA (flash and cuDNN backends), on the same bf16 (or --dtype f16) Q/K/V in one process.

    PYTHONUNBUFFERED=1 python3 bench/flex_compare.py --lib .device-build/lib/libfajit.so

For each case: compile fajit (cold: FAJIT_CACHE_DIR is a fresh temp dir, and CUDA_CACHE_DISABLE=1
unless set: NVRTC 12.9+ keeps compiled PTX/cubins in the driver's compute cache, ~/.nv, so a
"cold" compile in a second process would be a hit there), build its block
mask (timed twice: the first build also compiles the builder kernel), build flex's block mask
with create_block_mask of the same mask_mod, check fajit's output (poisoned with NaN first)
against flex's, SDPA's (full/causal) and an fp32 reference on two heads of batch 0, then time
every backend with triton.testing.do_bench (median; compile and mask builds excluded).
TFLOP/s count the unmasked work only: 4 * B * H * kept_pairs * D, kept pairs counted exactly.

Writes the table to stdout and as markdown to $OUT/bench.md (or --out).
`--compile-only` needs no GPU and no torch: it compiles every fajit variant and exits.
"""
import argparse
import ctypes
import datetime
import math
import os
import sys
import tempfile
import time
import traceback

REL_TOL = 2e-2

# ---------------------------------------------------------------------------------------
# fajit C API (compiler/include/fajit/fajit_c.h)
FAJIT_F16, FAJIT_BF16, FAJIT_F32, FAJIT_I32 = 0, 1, 2, 3
DTYPE = "bf16"  # --dtype: the element type of Q/K/V/O for every system in the run
STATUS = {0: "OK", 1: "INVALID_ARGUMENT", 2: "COMPILE", 3: "CUDA", 4: "IO", 5: "INTERNAL"}


class FajitOptions(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("head_dim_qk", ctypes.c_int),
                ("head_dim_v", ctypes.c_int), ("arch", ctypes.c_char_p)]


class FajitTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class FajitBufferCapture(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", FajitTensor)]


class FajitScalarCapture(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("is_float", ctypes.c_int), ("f", ctypes.c_float),
                ("i", ctypes.c_int32)]


class FajitCaptures(ctypes.Structure):
    _fields_ = [("buffers", ctypes.POINTER(FajitBufferCapture)), ("num_buffers", ctypes.c_int),
                ("scalars", ctypes.POINTER(FajitScalarCapture)), ("num_scalars", ctypes.c_int)]


class FajitError(RuntimeError):
    pass


class Fajit:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.fajit_last_error.restype = ctypes.c_char_p
        lib.fajit_last_error.argtypes = []
        lib.fajit_default_options.restype = FajitOptions
        lib.fajit_default_options.argtypes = []
        lib.fajit_compile_preset.restype = ctypes.c_int
        lib.fajit_compile_preset.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.POINTER(FajitOptions), ctypes.POINTER(vp)]
        lib.fajit_kernel_destroy.restype = None
        lib.fajit_kernel_destroy.argtypes = [vp]
        lib.fajit_kernel_origin.restype = ctypes.c_char_p
        lib.fajit_kernel_origin.argtypes = [vp]
        lib.fajit_kernel_cubin.restype = vp
        lib.fajit_kernel_cubin.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
        lib.fajit_kernel_block_mask.restype = ctypes.c_int
        lib.fajit_kernel_block_mask.argtypes = [vp, ctypes.c_int, ctypes.c_int, i64, i64,
                                                ctypes.POINTER(FajitCaptures), vp,
                                                ctypes.POINTER(vp)]
        lib.fajit_block_mask_destroy.restype = None
        lib.fajit_block_mask_destroy.argtypes = [vp]
        lib.fajit_block_mask_density.restype = ctypes.c_int
        lib.fajit_block_mask_density.argtypes = [vp, ctypes.POINTER(ctypes.c_double),
                                                 ctypes.POINTER(i64), ctypes.POINTER(i64),
                                                 ctypes.POINTER(i64)]
        T = ctypes.POINTER(FajitTensor)
        lib.fajit_kernel_forward.restype = ctypes.c_int
        lib.fajit_kernel_forward.argtypes = [vp, T, T, T, T, T, ctypes.c_float, vp,
                                             ctypes.POINTER(FajitCaptures), vp]
        self.has_autotune = hasattr(lib, "fajit_kernel_autotune_report")  # older baselines lack it
        if self.has_autotune:
            lib.fajit_kernel_autotune_report.restype = ctypes.c_char_p
            lib.fajit_kernel_autotune_report.argtypes = [vp]
        self.lib = lib

    def check(self, status, what):
        if status != 0:
            msg = self.lib.fajit_last_error().decode(errors="replace")
            raise FajitError(f"{what}: FAJIT_ERROR_{STATUS.get(status, status)}: {msg}")

    def compile(self, mask, score, head_dim, dtype=FAJIT_BF16):
        o = self.lib.fajit_default_options()
        o.dtype, o.head_dim_qk, o.head_dim_v, o.arch = dtype, head_dim, head_dim, None
        k = ctypes.c_void_p()
        self.check(self.lib.fajit_compile_preset(mask.encode() if mask else None,
                                                 score.encode() if score else None,
                                                 ctypes.byref(o), ctypes.byref(k)),
                   f"fajit_compile_preset({mask!r}, {score!r}, d={head_dim})")
        return k

    def origin(self, k):
        return self.lib.fajit_kernel_origin(k).decode()

    def cubin_size(self, k):
        n = ctypes.c_size_t()
        self.lib.fajit_kernel_cubin(k, ctypes.byref(n))
        return n.value


def tensor_desc(t):
    """fajit_tensor for a torch tensor (bf16/f16/f32/i32, rank <= 4)."""
    import torch
    dt = {torch.bfloat16: FAJIT_BF16, torch.float16: FAJIT_F16, torch.float32: FAJIT_F32,
          torch.int32: FAJIT_I32}[t.dtype]
    d = FajitTensor()
    d.data, d.dtype, d.rank = t.data_ptr(), dt, t.dim()
    for i in range(t.dim()):
        d.shape[i], d.stride[i] = t.shape[i], t.stride(i)
    return d


def make_captures(scalars, buffers):
    """scalars: {name: int|float}; buffers: {name: torch tensor}. Keeps the arrays alive."""
    sc = (FajitScalarCapture * max(1, len(scalars)))()
    for i, (n, v) in enumerate(scalars.items()):
        sc[i].name = n.encode()
        if isinstance(v, float):
            sc[i].is_float, sc[i].f = 1, v
        else:
            sc[i].is_float, sc[i].i = 0, int(v)
    bc = (FajitBufferCapture * max(1, len(buffers)))()
    for i, (n, t) in enumerate(buffers.items()):
        bc[i].name = n.encode()
        bc[i].tensor = tensor_desc(t)
    c = FajitCaptures(bc, len(buffers), sc, len(scalars))
    c._keep = (sc, bc)
    return c


# ---------------------------------------------------------------------------------------
# Cases. mask/score are fajit presets; the torch mods below compute the same functions as
# compiler/lib/frontend/mods.cpp.
WINDOW, PREFIX, SOFTCAP = 1024, 1024, 30.0


def kept_pairs(case, S, doc_lens=None):
    """Exact number of kept (q, kv) pairs for one (b, h) of an S x S problem."""
    if case in ("full",):
        return S * S
    if case in ("causal", "alibi_causal", "softcap_causal"):
        return S * (S + 1) // 2
    if case == "sliding":   # q >= kv && q - kv <= W: min(q, W) + 1 keys per query
        w = min(WINDOW, S - 1)
        return sum(range(1, w + 2)) + (S - w - 1) * (w + 1)
    if case == "prefix_lm":  # kv < P || q >= kv
        p = min(PREFIX, S)
        return p * p + sum(q + 1 for q in range(p, S))
    if case == "document":
        return sum(n * n for n in doc_lens)
    raise ValueError(case)


CASES = {
    # name: (fajit mask preset, fajit score preset, sdpa expressible)
    "full": (None, None, "full"),
    "causal": ("causal", None, "causal"),
    "sliding": (f"sliding:{WINDOW}", None, None),
    "prefix_lm": (f"prefix_lm:{PREFIX}", None, None),
    "document": ("document", None, None),
    "alibi_causal": ("causal", "alibi", None),
    "softcap_causal": ("causal", f"softcap:{SOFTCAP:g}", None),
}


def torch_mods(case, H, doc_ids):
    import torch

    def causal(b, h, q, kv):
        return q >= kv

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv <= WINDOW)

    def prefix_lm(b, h, q, kv):
        return (kv < PREFIX) | (q >= kv)

    def document(b, h, q, kv):
        return doc_ids[q] == doc_ids[kv]

    def alibi(score, b, h, q, kv):
        return score + torch.exp2(-8.0 * (h + 1) / H) * (kv - q)

    def softcap(score, b, h, q, kv):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    return {
        "full": (None, None), "causal": (causal, None), "sliding": (sliding, None),
        "prefix_lm": (prefix_lm, None), "document": (document, None),
        "alibi_causal": (causal, alibi), "softcap_causal": (causal, softcap),
    }[case]


def fajit_captures_for(case, H, doc_ids):
    scalars, buffers = {}, {}
    if case == "sliding":
        scalars["window"] = WINDOW
    elif case == "prefix_lm":
        scalars["prefix"] = PREFIX
    elif case == "document":
        buffers["doc_ids"] = doc_ids
    elif case == "alibi_causal":
        scalars["num_heads"] = H
    elif case == "softcap_causal":
        scalars["softcap"] = float(SOFTCAP)
    return scalars, buffers


def random_doc_lens(S, seed):
    import random
    rng = random.Random(seed)
    n_docs = rng.randint(6, 14)
    cuts = sorted(rng.sample(range(64, S - 64), n_docs - 1))
    edges = [0] + cuts + [S]
    return [edges[i + 1] - edges[i] for i in range(n_docs)]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def reference(q, k, v, mask_mod, score_mod, heads):
    """fp32 attention on batch 0 for the given heads, with the torch mods broadcast."""
    import torch
    out = []
    S, D = q.shape[2], q.shape[3]
    qi = torch.arange(S, device=q.device)[:, None]
    ki = torch.arange(S, device=q.device)[None, :]
    b = torch.zeros((), dtype=torch.int64, device=q.device)
    for h in heads:
        hh = torch.full((), h, dtype=torch.int64, device=q.device)
        s = (q[0, h].float() @ k[0, h].float().T) / math.sqrt(D)
        if score_mod is not None:
            s = score_mod(s, b, hh, qi, ki)
        if mask_mod is not None:
            s = s.masked_fill(~mask_mod(b, hh, qi, ki), float("-inf"))
        out.append(torch.softmax(s, dim=-1) @ v[0, h].float())
    return torch.stack(out)


def fmt_ms(x):
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def fmt_tf(x):
    return f"{x:.0f}" if isinstance(x, float) else str(x)


def short(e, n=120):
    s = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return s if len(s) <= n else s[:n] + "..."


# ---------------------------------------------------------------------------------------
def setup_fajit(fj, case, q, k, v, B, H, S, D, doc_ids, stream):
    """Compiles (cold) the case with one libfajit, builds its block mask (twice: the first
    build also compiles the builder), runs the forward once into a NaN-poisoned output.
    Returns (forward fn, output, row info, (kernel, block mask) handles to free)."""
    import torch
    info = {}
    t0 = time.perf_counter()
    kern = fj.compile(CASES[case][0], CASES[case][1], D, fajit_dtype())
    info["compile_s"] = time.perf_counter() - t0
    info["origin"] = fj.origin(kern)
    scalars, buffers = fajit_captures_for(case, H, doc_ids)
    caps = make_captures(scalars, buffers)
    bm = None
    bms = []
    for _ in range(2):
        if bm is not None:
            fj.lib.fajit_block_mask_destroy(bm)
        bm = ctypes.c_void_p()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fj.check(fj.lib.fajit_kernel_block_mask(kern, B, H, S, S, ctypes.byref(caps),
                                                stream(), ctypes.byref(bm)),
                 "fajit_kernel_block_mask")
        torch.cuda.synchronize()
        bms.append((time.perf_counter() - t0) * 1e3)
    info["bm_cold_ms"], info["bm_ms"] = bms
    frac, nf, npart, ne = ctypes.c_double(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
    fj.check(fj.lib.fajit_block_mask_density(bm, ctypes.byref(frac), ctypes.byref(nf),
                                             ctypes.byref(npart), ctypes.byref(ne)),
             "fajit_block_mask_density")
    info["density"] = f"{frac.value:.3f} (full {nf.value}, partial {npart.value}, empty {ne.value})"
    o = torch.full_like(q, float("nan"))
    tq, tk, tv, to = (tensor_desc(t) for t in (q, k, v, o))
    fwd = fj.lib.fajit_kernel_forward

    def fajit_fn():
        st = fwd(kern, ctypes.byref(tq), ctypes.byref(tk), ctypes.byref(tv),
                 ctypes.byref(to), None, 0.0, bm, ctypes.byref(caps), stream())
        if st != 0:
            fj.check(st, "fajit_kernel_forward")

    fajit_fn.out = o  # the launches write into o: it lives as long as the function
    t0 = time.perf_counter()
    fajit_fn()  # the first call of a shape autotunes (unless FAJIT_AUTOTUNE=0)
    torch.cuda.synchronize()
    info["first_call_s"] = time.perf_counter() - t0
    if fj.has_autotune:
        info["tune"] = fj.lib.fajit_kernel_autotune_report(kern).decode().strip()
    return fajit_fn, o.clone(), info, (kern, bm)


def torch_dtype():
    import torch
    return torch.float16 if DTYPE == "f16" else torch.bfloat16


def fajit_dtype():
    return FAJIT_F16 if DTYPE == "f16" else FAJIT_BF16


def run_case(fj, base, flex, case, B, H, S, D, args, device_name):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    from triton.testing import do_bench

    mask_preset, score_preset, sdpa_kind = CASES[case]
    row = dict(case=case, B=B, H=H, S=S, D=D, fajit="-", flex="-", sdpa_flash="n/a",
               sdpa_cudnn="n/a", compile_s="-", origin="-", bm_cold_ms="-", bm_ms="-",
               flex_bm_ms="-", density="-", err_flex="-", err_sdpa="-", err_ref="-",
               flex_err_ref="-", check="?", errors=[], base="-")
    torch.manual_seed(1234 + D + S)
    gen = torch.Generator(device="cuda").manual_seed(42 + S + D)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch_dtype(), generator=gen)
    k = torch.randn(B, H, S, D, device="cuda", dtype=torch_dtype(), generator=gen)
    v = torch.randn(B, H, S, D, device="cuda", dtype=torch_dtype(), generator=gen)
    doc_lens, doc_ids = None, None
    if case == "document":
        doc_lens = random_doc_lens(S, seed=7)
        doc_ids = torch.repeat_interleave(
            torch.arange(len(doc_lens), dtype=torch.int32),
            torch.tensor(doc_lens)).to(device="cuda", dtype=torch.int32).contiguous()
        row["docs"] = doc_lens
    pairs = kept_pairs(case, S, doc_lens)
    flops = 4.0 * B * H * pairs * D
    row["kept_frac"] = pairs / (S * S)
    mask_mod, score_mod = torch_mods(case, H, doc_ids)
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    outs = {}
    fns = {}

    # ---- fajit: cold compile, block mask, forward (and the baseline library, if given) ----
    kernels = []   # (lib, (kernel, block mask)) to free at the end
    for name, lib in (("fajit", fj), ("base", base)):
        if lib is None:
            continue
        if args.autotune_ab:  # one library: tuned ("fajit") against the defaults ("base")
            os.environ["FAJIT_AUTOTUNE"] = "1" if name == "fajit" else "0"
        try:
            fn, out, info, handles = setup_fajit(lib, case, q, k, v, B, H, S, D, doc_ids, stream)
            kernels.append((lib, handles))
            if name == "fajit":
                row.update(info)
            n_bad = (~torch.isfinite(out)).sum().item()
            if n_bad:
                row["errors"].append(f"{name}: {n_bad} non-finite/unwritten outputs")
            outs[name] = out
            fns[name] = fn
        except Exception as e:  # noqa: BLE001 - reported in the table
            row[name] = "ERR"
            row["errors"].append(f"{name}: " + short(e, 400))
            print(f"  {name} FAILED on {case} d{D}:\n{traceback.format_exc()}", flush=True)

    # ---- flex ------------------------------------------------------------------------
    try:
        t0 = time.perf_counter()
        block_mask = (create_block_mask(mask_mod, None, None, S, S, device="cuda")
                      if mask_mod is not None else None)
        torch.cuda.synchronize()
        row["flex_bm_ms"] = (time.perf_counter() - t0) * 1e3

        def flex_fn():
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask)

        t0 = time.perf_counter()
        outs["flex"] = flex_fn()
        torch.cuda.synchronize()
        row["flex_compile_s"] = time.perf_counter() - t0
        fns["flex"] = flex_fn
    except Exception as e:  # noqa: BLE001
        row["flex"] = "ERR"
        row["errors"].append("flex: " + short(e, 400))
        print(f"  flex FAILED on {case} d{D}:\n{traceback.format_exc()}", flush=True)

    # ---- SDPA ------------------------------------------------------------------------
    if sdpa_kind is not None:
        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            causal = sdpa_kind == "causal"

            def sdpa_fn(backend=backend, causal=causal):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            try:
                outs[name] = sdpa_fn()
                torch.cuda.synchronize()
                fns[name] = sdpa_fn
            except Exception as e:  # noqa: BLE001
                row[name] = "ERR"
                row["errors"].append(f"{name}: " + short(e, 200))

    # ---- correctness -----------------------------------------------------------------
    ok = "fajit" in outs
    if "fajit" in outs and "base" in outs:
        row["err_base"] = rel_err(outs["fajit"], outs["base"])
        ok &= row["err_base"] < REL_TOL
    if "fajit" in outs and "flex" in outs:
        row["err_flex"] = rel_err(outs["fajit"], outs["flex"])
        ok &= row["err_flex"] < REL_TOL
    for name in ("sdpa_flash", "sdpa_cudnn"):
        if "fajit" in outs and name in outs:
            e = rel_err(outs["fajit"], outs[name])
            row["err_sdpa"] = max(e, row["err_sdpa"]) if isinstance(row["err_sdpa"], float) else e
            ok &= e < REL_TOL
    try:
        heads = sorted({0, H - 1})
        ref = reference(q, k, v, mask_mod, score_mod, heads)
        if "fajit" in outs:
            row["err_ref"] = rel_err(outs["fajit"][0, heads], ref)
            ok &= row["err_ref"] < REL_TOL
        if "flex" in outs:
            row["flex_err_ref"] = rel_err(outs["flex"][0, heads], ref)
        del ref
    except Exception as e:  # noqa: BLE001
        row["errors"].append("reference: " + short(e, 200))
    if row["errors"] and "fajit" in outs and any(s.startswith("fajit") for s in row["errors"]):
        ok = False
    row["check"] = "ok" if ok else "MISMATCH" if "fajit" in outs else "FAILED"
    if row["check"] != "ok":
        print(f"  !!! {case} d{D} S{S}: fajit check {row['check']}: err_flex={row['err_flex']} "
              f"err_sdpa={row['err_sdpa']} err_ref={row['err_ref']} flex_err_ref="
              f"{row['flex_err_ref']} {row['errors']}", flush=True)
    del outs

    # ---- timing ----------------------------------------------------------------------
    for name, fn in fns.items():
        try:
            ms = do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")
            row[name] = float(ms)
        except Exception as e:  # noqa: BLE001
            row[name] = "ERR"
            row["errors"].append(f"{name} timing: " + short(e, 200))
    for name in ("fajit", "base", "flex", "sdpa_flash", "sdpa_cudnn"):
        if isinstance(row[name], float):
            row[name + "_tf"] = flops / (row[name] * 1e-3) / 1e12
    if isinstance(row["fajit"], float) and isinstance(row["flex"], float):
        row["ratio"] = row["flex"] / row["fajit"]   # > 1: fajit faster
    if isinstance(row["fajit"], float) and isinstance(row["base"], float):
        row["vs_base"] = row["base"] / row["fajit"]   # > 1: fajit faster than the baseline
    for lib, (kern, bm) in kernels:
        lib.lib.fajit_block_mask_destroy(bm)
        lib.lib.fajit_kernel_destroy(kern)
    row["device"] = device_name
    return row


def tune_choice(report):
    """'tuned wgmma 128x128w12s3' from an autotune report line ('-' when nothing was tuned)."""
    if not report:
        return "-"
    line = report.splitlines()[0]
    return line.split(": ", 1)[-1].split(" (")[0].split(" on ")[0]


COLUMNS = [
    ("case", lambda r: r["case"]),
    ("B×H×S", lambda r: f"{r['B']}×{r['H']}×{r['S']}"),
    ("D", lambda r: str(r["D"])),
    ("fajit ms", lambda r: fmt_ms(r["fajit"])),
    ("flex ms", lambda r: fmt_ms(r["flex"])),
    ("sdpa-flash ms", lambda r: fmt_ms(r["sdpa_flash"])),
    ("sdpa-cudnn ms", lambda r: fmt_ms(r["sdpa_cudnn"])),
    ("fajit TFLOP/s", lambda r: fmt_tf(r.get("fajit_tf", "-"))),
    ("flex TFLOP/s", lambda r: fmt_tf(r.get("flex_tf", "-"))),
    ("cudnn TFLOP/s", lambda r: fmt_tf(r.get("sdpa_cudnn_tf", "n/a" if r["sdpa_cudnn"] == "n/a" else "-"))),
    ("fajit/flex", lambda r: f"{r['ratio']:.2f}×" if "ratio" in r else "-"),
    ("base ms", lambda r: fmt_ms(r.get("base", "-"))),
    ("fajit/base", lambda r: f"{r['vs_base']:.3f}×" if "vs_base" in r else "-"),
    ("max rel err", lambda r: max([x for x in (r["err_flex"], r["err_sdpa"], r["err_ref"])
                                   if isinstance(x, float)], default="-")),
    ("check", lambda r: r["check"]),
    ("fajit compile s", lambda r: f"{r['compile_s']:.2f} ({r['origin']})"
     if isinstance(r["compile_s"], float) else "-"),
    ("fajit mask ms cold/warm", lambda r: f"{r['bm_cold_ms']:.1f} / {r['bm_ms']:.2f}"
     if isinstance(r["bm_ms"], float) else "-"),
    ("flex mask ms", lambda r: f"{r['flex_bm_ms']:.1f}" if isinstance(r["flex_bm_ms"], float) else "-"),
    ("autotune", lambda r: tune_choice(r.get("tune"))),
    ("device", lambda r: r.get("device", "-")),
]


def cell(x):
    return f"{x:.1e}" if isinstance(x, float) else str(x)


def table(rows, device):
    head = "| " + " | ".join(c for c, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if i < 1 else "---:" for i in range(len(COLUMNS))) + "|"
    lines = [head, sep]
    for r in rows:
        lines.append("| " + " | ".join(cell(f(r)) for _, f in COLUMNS) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("FAJIT_LIB", ".device-build/lib/libfajit.so"))
    ap.add_argument("--baseline-lib", default=None,
                    help="a second libfajit.so (e.g. built from an older commit) timed on the "
                         "same tensors: columns 'base ms' and 'fajit/base' (>1: --lib faster)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"], help="Q/K/V/O element type")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--no-long", action="store_true", help="skip B=1 S=16384 d128 full/causal")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    ap.add_argument("--quick", action="store_true", help="full and causal at d128 only")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile fajit variants")
    ap.add_argument("--autotune-ab", action="store_true",
                    help="the baseline is --lib itself with FAJIT_AUTOTUNE=0, fajit the same with it on: "
                         "'fajit/base' is what autotuning gains")
    args = ap.parse_args()
    global DTYPE
    DTYPE = args.dtype

    cache = tempfile.mkdtemp(prefix="fajit-cache-")
    os.environ["FAJIT_CACHE_DIR"] = cache
    os.environ.setdefault("CUDA_CACHE_DISABLE", "1")  # NVRTC's own cache (the driver's): see above
    fj = Fajit(os.path.abspath(args.lib))
    base = Fajit(os.path.abspath(args.baseline_lib)) if args.baseline_lib else None
    if args.autotune_ab:
        if base is not None:
            sys.exit("--autotune-ab compares --lib with itself: no --baseline-lib")
        base = fj
    cases = [c for c in args.cases.split(",") if c]
    dims = [int(d) for d in args.dims.split(",")]
    if args.quick:
        cases, dims, args.no_long = ["full", "causal"], [128], True
    for c in cases:
        if c not in CASES:
            sys.exit(f"unknown case {c}; known: {','.join(CASES)}")

    if args.compile_only:
        for D in dims:
            for c in cases:
                t0 = time.perf_counter()
                kern = fj.compile(CASES[c][0], CASES[c][1], D, fajit_dtype())
                print(f"{c:16s} d{D}: {time.perf_counter() - t0:.2f} s  origin={fj.origin(kern)} "
                      f"cubin={fj.cubin_size(kern)} B", flush=True)
                fj.lib.fajit_kernel_destroy(kern)
        return

    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention
    # Every case is a new graph for dynamo; keep them all compiled (not eager fallbacks) and
    # static (no automatic dynamic shapes after the first recompile).
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    flex = torch.compile(flex_attention, dynamic=False)
    device = torch.cuda.get_device_name()
    import triton
    print(f"device: {device}; torch {torch.__version__}; triton {triton.__version__}; "
          f"cuda {torch.version.cuda}; lib {args.lib}; baseline {args.baseline_lib}; "
          f"FAJIT_CACHE_DIR={cache}; "
          f"date {datetime.date.today()}", flush=True)

    plan = [(c, args.batch, args.heads, args.seq, D) for D in dims for c in cases]
    if not args.no_long:
        plan += [(c, 1, args.heads, 16384, 128) for c in ("full", "causal") if c in cases]
    rows = []
    t_all = time.perf_counter()
    for (c, B, H, S, D) in plan:
        t0 = time.perf_counter()
        try:
            r = run_case(fj, base, flex, c, B, H, S, D, args, device)
        except Exception as e:  # noqa: BLE001
            print(f"  case {c} d{D} crashed:\n{traceback.format_exc()}", flush=True)
            r = dict(case=c, B=B, H=H, S=S, D=D, fajit="ERR", flex="ERR", sdpa_flash="-",
                     sdpa_cudnn="-", compile_s="-", bm_ms="-", flex_bm_ms="-", err_flex="-",
                     err_sdpa="-", err_ref="-", check="CRASH", errors=[short(e, 400)])
        rows.append(r)
        extra = {k2: r.get(k2) for k2 in ("flex_compile_s", "density", "err_flex", "err_sdpa",
                                           "err_ref", "flex_err_ref", "kept_frac", "docs", "err_base",
                                           "first_call_s", "tune")}
        print(f"[{time.perf_counter() - t_all:6.1f}s] {c} B{B} H{H} S{S} D{D}: "
              f"fajit {fmt_ms(r['fajit'])} ms, base {fmt_ms(r.get('base', '-'))} ms, "
              f"flex {fmt_ms(r['flex'])} ms, "
              f"sdpa-flash {fmt_ms(r['sdpa_flash'])}, sdpa-cudnn {fmt_ms(r['sdpa_cudnn'])}, "
              f"check {r['check']} ({time.perf_counter() - t0:.1f}s) {extra} "
              f"{r['errors'] or ''}", flush=True)
        torch.cuda.empty_cache()
        write_md(args, rows, device, torch.__version__, triton.__version__, partial=True)

    text = write_md(args, rows, device, torch.__version__, triton.__version__, partial=False)
    print("\n" + text, flush=True)
    bad = [r for r in rows if r["check"] != "ok"]
    if bad:
        print(f"!!! {len(bad)} case(s) did not pass the fajit check: "
              f"{[(r['case'], r['D'], r['S'], r['check']) for r in bad]}", flush=True)


def write_md(args, rows, device, torch_v, triton_v, partial):
    md = table(rows, device)
    notes = []
    for r in rows:
        for e in r["errors"]:
            notes.append(f"- {r['case']} D{r['D']} S{r['S']}: {e}")
    text = (f"Device: {device}. torch {torch_v}, triton {triton_v}. "
            f"{DTYPE}, do_bench median (warmup {args.warmup} ms, rep {args.rep} ms). "
            f"TFLOP/s = 4·B·H·kept_pairs·D / time. fajit/flex = flex ms / fajit ms "
            f"(>1: fajit faster).{' (PARTIAL: run still going)' if partial else ''}\n\n" + md + "\n")
    if notes:
        text += "\nErrors:\n" + "\n".join(notes) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    main()
