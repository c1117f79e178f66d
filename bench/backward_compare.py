#!/usr/bin/env python3
"""Backward attention: fajit (libfajit.so through its C API, ctypes) vs torch flex_attention
(torch.compile'd) vs SDPA (cuDNN backend, full/causal), on the same bf16 Q/K/V/dO in one process.

    PYTHONUNBUFFERED=1 python3 bench/backward_compare.py --lib .device-build/lib/libfajit.so

For each case: fajit compiles cold (fresh FAJIT_CACHE_DIR), runs its forward with LSE, then its
backward into NaN-poisoned dQ/dK/dV, which are checked against flex's gradients (and SDPA's) on
the same tensors before anything is timed. Timed with triton.testing.do_bench (median): the
backward alone (fajit: the three backward kernels; torch: autograd.grad of a retained graph)
and forward+backward. Backward TFLOP/s = 2.5 x the forward's FLOPs on unmasked work
(4 * B * Hq * kept_pairs * D), FlashAttention's convention. Cases whose score_mod has no
derivative in fajit yet are reported as such.

Writes the table to stdout and as markdown to $OUT/backward.md (or --out).
"""
import argparse
import ctypes
import datetime
import statistics
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flex_compare as fc  # noqa: E402  (the C API bindings, mods and cases of the forward bench)

REL_TOL = 3e-2
CASES = ["full", "causal", "sliding", "document", "alibi_causal", "softcap_causal"]


def bind_backward(lib):
    T = ctypes.POINTER(fc.FajitTensor)
    vp = ctypes.c_void_p
    lib.fajit_kernel_backward.restype = ctypes.c_int
    lib.fajit_kernel_backward.argtypes = [vp, T, T, T, T, T, T, T, T, T, T, ctypes.c_float, vp,
                                          ctypes.POINTER(fc.FajitCaptures), ctypes.POINTER(fc.FajitCaptures),
                                          ctypes.c_int, vp]


def run_case(fj, base, flex, case, B, Hq, Hkv, S, D, args, device):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    from triton.testing import do_bench

    mask_preset, score_preset, sdpa_kind = fc.CASES[case]
    row = dict(case=case, B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, fajit="-", fajit_fb="-", fajit_det="-", flex="-",
               flex_fb="-",
               cudnn="n/a", cudnn_fb="n/a", err="-", check="?", errors=[])
    gen = torch.Generator(device="cuda").manual_seed(7 + S + D + Hq)
    mk = lambda h: torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v, do = mk(Hq), mk(Hkv), mk(Hkv), mk(Hq)
    doc_lens, doc_ids = None, None
    if case == "document":
        doc_lens = fc.random_doc_lens(S, seed=7)
        doc_ids = torch.repeat_interleave(torch.arange(len(doc_lens), dtype=torch.int32),
                                          torch.tensor(doc_lens)).to(device="cuda", dtype=torch.int32)
    pairs = fc.kept_pairs(case, S, doc_lens)
    fwd_flops = 4.0 * B * Hq * pairs * D
    mask_mod, score_mod = fc.torch_mods(case, Hq, doc_ids)
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    grads = {}

    # ---- torch flex (compiled): gradients of sum(O * dO)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    block_mask = (create_block_mask(mask_mod, None, None, S, S, device="cuda")
                  if mask_mod and not args.no_torch else None)

    def flex_fwd():
        return flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask, enable_gqa=Hq != Hkv)
    try:
        if args.no_torch:
            raise RuntimeError("skipped (--no-torch)")
        o = flex_fwd()
        grads["flex"] = torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
        row["flex"] = do_bench(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True),
                               warmup=args.warmup, rep=args.rep, return_mode="median")
        row["flex_fb"] = do_bench(lambda: torch.autograd.grad(flex_fwd(), (qg, kg, vg), do),
                                  warmup=args.warmup, rep=args.rep, return_mode="median")
        del o
    except Exception as e:  # noqa: BLE001
        row["flex"] = "ERR"
        row["errors"].append("flex: " + fc.short(e, 300))
    # ---- SDPA cuDNN (full / causal)
    if sdpa_kind is not None and not args.no_torch:
        def sdpa_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qg, kg, vg, is_causal=sdpa_kind == "causal",
                                                      enable_gqa=Hq != Hkv)
        try:
            o = sdpa_fwd()
            grads["cudnn"] = torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
            row["cudnn"] = do_bench(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True),
                                    warmup=args.warmup, rep=args.rep, return_mode="median")
            row["cudnn_fb"] = do_bench(lambda: torch.autograd.grad(sdpa_fwd(), (qg, kg, vg), do),
                                       warmup=args.warmup, rep=args.rep, return_mode="median")
            del o
        except Exception as e:  # noqa: BLE001
            row["cudnn"] = "ERR"
            row["errors"].append("cudnn: " + fc.short(e, 300))

    # ---- fajit (and the baseline library, if given): cold compile, block mask, forward with
    # LSE, backward; the two libraries timed on the same tensors, base and fajit in turn
    libs = [("fajit", fj)] + ([("base", base)] if base is not None else [])
    for name, lib in libs:
        fajit_backward(lib, name, row, grads, mask_preset, score_preset, D, B, Hq, S, q, k, v, do, doc_ids,
                       case, stream, args)
    if "base" in grads and "fajit" in grads:
        e = max(fc.rel_err(a, b) for a, b in zip(grads["fajit"], grads["base"]))
        row["base_err"] = e
        if e > REL_TOL:
            row["errors"].append(f"fajit: gradients differ from the baseline library's by {e:.1e}")
    try:
        if base is not None and isinstance(row["fajit"], float) and isinstance(row["base"], float):
            for _ in range(args.ab_rounds - 1):  # more rounds, alternating, for run-to-run noise
                for name, lib in libs:
                    row[name + "_rounds"].append(row[name + "_again"]())
            row["fajit"] = statistics.median(row["fajit_rounds"])
            row["base"] = statistics.median(row["base_rounds"])
            row["vs_base"] = row["base"] / row["fajit"]
    finally:
        for name, _ in libs:
            row.pop(name + "_again", None)
            row.pop(name + "_release")()

    # ---- correctness: fajit's gradients vs flex's (and cuDNN's)
    ok = "fajit" in grads and not any(e.startswith("fajit") for e in row["errors"])
    compared = "base_err" in row  # the finite check alone is no comparison
    for other in ("flex", "cudnn"):
        if "fajit" in grads and other in grads:
            e = max(fc.rel_err(a, b) for a, b in zip(grads["fajit"], grads[other]))
            row["err"] = max(e, row["err"]) if isinstance(row["err"], float) else e
            ok &= e < REL_TOL
            compared = True
    row["check"] = ("ok" if compared else "finite only") if ok else ("-" if "fajit" not in grads else "MISMATCH")
    for name in ("fajit", "flex", "cudnn", "base"):
        if isinstance(row.get(name), float):
            row[name + "_tf"] = 2.5 * fwd_flops / (row[name] * 1e-3) / 1e12
    if isinstance(row["fajit"], float) and isinstance(row["flex"], float):
        row["vs_flex"] = row["flex"] / row["fajit"]
    if isinstance(row["fajit"], float) and isinstance(row["cudnn"], float):
        row["vs_cudnn"] = row["cudnn"] / row["fajit"]
    row["device"] = device
    return row


def fajit_backward(fj, name, row, grads, mask_preset, score_preset, D, B, Hq, S, q, k, v, do, doc_ids, case,
                   stream, args):
    """One library's compile, forward and backward on the case's tensors: its gradients into
    grads[name], its median backward ms into row[name] (row[name + '_again'] re-times it)."""
    import torch
    from triton.testing import do_bench
    kern = bm = None
    try:
        kern = fj.compile(mask_preset, score_preset, D)
        scalars, buffers = fc.fajit_captures_for(case, Hq, doc_ids)
        caps = fc.make_captures(scalars, buffers)
        bm = ctypes.c_void_p()
        fj.check(fj.lib.fajit_kernel_block_mask(kern, B, Hq, S, S, ctypes.byref(caps), stream(), ctypes.byref(bm)),
                 "fajit_kernel_block_mask")
        o = torch.empty_like(q)
        lse = torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        tq, tk, tv, to, tl, tdo, tdq, tdk, tdv = (fc.tensor_desc(t) for t in (q, k, v, o, lse, do, dq, dk, dv))
        r = ctypes.byref

        def fajit_fwd():
            fj.check(fj.lib.fajit_kernel_forward(kern, r(tq), r(tk), r(tv), r(to), r(tl), 0.0, bm, r(caps),
                                                 stream()), "fajit_kernel_forward")

        def fajit_bwd(deterministic=0):
            fj.check(fj.lib.fajit_kernel_backward(kern, r(tq), r(tk), r(tv), r(to), r(tl), r(tdo), r(tdq), r(tdk),
                                                  r(tdv), None, 0.0, bm, r(caps), None, deterministic, stream()),
                     "fajit_kernel_backward")
        fajit_fwd()
        fajit_bwd()
        torch.cuda.synchronize()
        grads[name] = (dq.clone(), dk.clone(), dv.clone())
        bad = sum(int((~torch.isfinite(g)).sum()) for g in grads[name])
        if bad:
            row["errors"].append(f"{name}: {bad} non-finite/unwritten gradient elements")
        row[name] = do_bench(fajit_bwd, warmup=args.warmup, rep=args.rep, return_mode="median")
        if name == "base":
            return  # the baseline: the backward's time only (kern, bm outlive this call)
        row["fajit_fb"] = do_bench(lambda: (fajit_fwd(), fajit_bwd()), warmup=args.warmup, rep=args.rep,
                                   return_mode="median")
        fajit_bwd(1)
        torch.cuda.synchronize()
        det_err = max(fc.rel_err(a, b) for a, b in zip((dq, dk, dv), grads[name]))
        if det_err > REL_TOL:
            row["errors"].append(f"fajit deterministic: gradients differ from the default mode by {det_err:.1e}")
        row["fajit_det"] = do_bench(lambda: fajit_bwd(1), warmup=args.warmup, rep=args.rep, return_mode="median")
    except Exception as e:  # noqa: BLE001
        msg = fc.short(e, 300)
        row[name] = "n/a (no derivative yet)" if "not available yet" in msg else "ERR"
        row["errors"].append(f"{name}: " + msg)
        if row[name] == "ERR":
            print(traceback.format_exc(), flush=True)
    finally:
        if isinstance(row.get(name), float):  # kept for more A/B rounds; run_case releases it
            row[name + "_rounds"] = [row[name]]
            row[name + "_again"] = lambda: do_bench(fajit_bwd, warmup=args.warmup, rep=args.rep,
                                                    return_mode="median")
        # the tensors the closures' descriptors point at stay alive until run_case releases
        # them (else a later round writes into memory torch has handed to other tensors)
        keep = [t for t in (locals().get(x) for x in ("o", "lse", "dq", "dk", "dv", "caps")) if t is not None]
        row[name + "_release"] = lambda: (release(fj, kern, bm), keep.clear())


def release(fj, kern, bm):
    if bm is not None and bm.value:
        fj.lib.fajit_block_mask_destroy(bm)
    if kern is not None:
        fj.lib.fajit_kernel_destroy(kern)


COLUMNS = [
    ("case", lambda r: r["case"]),
    ("B×Hq/Hkv×S", lambda r: f"{r['B']}×{r['Hq']}/{r['Hkv']}×{r['S']}"),
    ("D", lambda r: str(r["D"])),
    ("fajit bwd ms", lambda r: fc.fmt_ms(r["fajit"])),
    ("flex bwd ms", lambda r: fc.fmt_ms(r["flex"])),
    ("cudnn bwd ms", lambda r: fc.fmt_ms(r["cudnn"])),
    ("fajit det bwd ms", lambda r: fc.fmt_ms(r.get("fajit_det", "-"))),
    ("base bwd ms", lambda r: fc.fmt_ms(r.get("base", "-"))),
    ("fajit/base", lambda r: f"{r['vs_base']:.3f}×" if "vs_base" in r else "-"),
    ("fajit TFLOP/s", lambda r: fc.fmt_tf(r.get("fajit_tf", "-"))),
    ("flex TFLOP/s", lambda r: fc.fmt_tf(r.get("flex_tf", "-"))),
    ("cudnn TFLOP/s", lambda r: fc.fmt_tf(r.get("cudnn_tf", "n/a"))),
    ("fajit/flex", lambda r: f"{r['vs_flex']:.2f}×" if "vs_flex" in r else "-"),
    ("fajit/cudnn", lambda r: f"{r['vs_cudnn']:.2f}×" if "vs_cudnn" in r else "-"),
    ("fwd+bwd ms fajit / flex / cudnn", lambda r: " / ".join(fc.fmt_ms(r[x]) for x in ("fajit_fb", "flex_fb", "cudnn_fb"))),
    ("max rel err", lambda r: f"{r['err']:.1e}" if isinstance(r["err"], float) else "-"),
    ("rel err vs base", lambda r: f"{r['base_err']:.1e}" if "base_err" in r else "-"),
    ("check", lambda r: r["check"]),
    ("device", lambda r: r.get("device", "-")),
]


def write_md(args, rows, device, partial):
    import torch
    import triton
    lines = ["| " + " | ".join(c for c, _ in COLUMNS) + " |", "|---" + "|---:" * (len(COLUMNS) - 1) + "|"]
    lines += ["| " + " | ".join(str(f(r)) for _, f in COLUMNS) + " |" for r in rows]
    notes = [f"- {r['case']} D{r['D']} Hq{r['Hq']}: {e}" for r in rows for e in r["errors"]]
    text = (f"Device: {device}. torch {torch.__version__}, triton {triton.__version__}, {datetime.date.today()}. "
            f"bf16, do_bench median (warmup {args.warmup} ms, rep {args.rep} ms). Backward TFLOP/s = 2.5 x "
            f"4·B·Hq·kept_pairs·D / backward time. fajit/x = x ms / fajit ms (>1: fajit faster)."
            f"{f' Baseline library: {args.baseline_lib} (medians of {args.ab_rounds} alternating rounds).' if args.baseline_lib else ''}"
            f"{' (PARTIAL)' if partial else ''}\n\n" + "\n".join(lines) + "\n")
    if notes:
        text += "\nNotes:\n" + "\n".join(notes) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "backward.md"), "w") as f:
        f.write(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("FAJIT_LIB", ".device-build/lib/libfajit.so"))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--no-gqa", action="store_true", help="skip Hq=2*heads Hkv=heads/2 d128 full/causal")
    ap.add_argument("--baseline-lib", default=None,
                    help="a second libfajit.so timed on the same tensors (columns base ms, fajit/base)")
    ap.add_argument("--ab-rounds", type=int, default=3,
                    help="with --baseline-lib: timings per library, alternating; the median is reported")
    ap.add_argument("--no-torch", action="store_true",
                    help="skip flex and cuDNN (an A/B of two libraries; gradients checked against each other)")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()

    os.environ["FAJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="fajit-cache-")
    fj = fc.Fajit(os.path.abspath(args.lib))
    bind_backward(fj.lib)
    base = None
    if args.baseline_lib:
        base = fc.Fajit(os.path.abspath(args.baseline_lib))
        bind_backward(base.lib)
    import torch
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    flex = torch.compile(flex_attention, dynamic=False)
    device = torch.cuda.get_device_name()
    print(f"device: {device}; torch {torch.__version__}; lib {args.lib}; baseline {args.baseline_lib}", flush=True)
    cases = [c for c in args.cases.split(",") if c]
    B, H, S = args.batch, args.heads, args.seq
    plan = [(c, B, H, H, S, int(d)) for d in args.dims.split(",") for c in cases]
    if not args.no_gqa:
        plan += [(c, B, 2 * H, H // 2, S, 128) for c in ("full", "causal")]
    rows = []
    t_all = time.perf_counter()
    for (c, B, Hq, Hkv, S, D) in plan:
        try:
            r = run_case(fj, base, flex, c, B, Hq, Hkv, S, D, args, device)
        except Exception as e:  # noqa: BLE001
            print(traceback.format_exc(), flush=True)
            r = dict(case=c, B=B, Hq=Hq, Hkv=Hkv, S=S, D=D, fajit="ERR", fajit_fb="-", flex="-", flex_fb="-",
                     cudnn="-", cudnn_fb="-", err="-", check="CRASH", errors=[fc.short(e, 300)])
        rows.append(r)
        print(f"[{time.perf_counter() - t_all:6.1f}s] {c} B{B} Hq{Hq} Hkv{Hkv} D{D}: fajit {fc.fmt_ms(r['fajit'])} ms, "
              f"flex {fc.fmt_ms(r['flex'])} ms, cudnn {fc.fmt_ms(r['cudnn'])} ms, err {r['err']}, "
              f"check {r['check']} {r['errors'] or ''}", flush=True)
        torch.cuda.empty_cache()
        write_md(args, rows, device, partial=True)
    print("\n" + write_md(args, rows, device, partial=False), flush=True)


if __name__ == "__main__":
    main()
