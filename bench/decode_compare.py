#!/usr/bin/env python3
"""Decoding: fajit's split-KV kernel (through the fajit Python package, C API) vs torch
flex_attention (torch.compile'd: its flex_decoding path for short queries) vs SDPA (flash and
cuDNN backends) vs a plain copy of K and V, on the same bf16 tensors in one process.

    FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python \\
        python3 bench/decode_compare.py [--lq 1,16] [--lkv 8192,32768,131072]

Shape (issue "head dims, split-KV decoding"): B=4 Hq=32 Hkv=8 D=128, no mask (every query sees
every key; causal-at-the-end is the same work), Lq queries over Lkv keys. Every backend's output
is checked against fp32 SDPA math on expanded K/V (rel. error < 2e-2) before timing; a backend
that fails or refuses the shape is n/a with its error in the notes; times are
triton.testing.do_bench medians; GB/s counts the K+V bytes read (the bound of a decode). fajit is
timed twice: the eager Python call (host cost included when it exceeds the GPU's) and the same
call replayed from a CUDA graph (GPU time only).

--paged 16,64,256 adds fajit on a paged cache of each page size (flex_attention_varlen with a
page table: K and V cut into pages shuffled over a pool, every sequence Lkv keys long), checked
against the same reference, eager and graph-replayed, and its time as a ratio of the dense
call's (issue 11's paged-vs-contiguous target: >= 0.95).
Writes the table to stdout and as markdown to $OUT/decode.md (or --out).
"""
import argparse
import datetime
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lq", default="1,16")
    ap.add_argument("--lkv", default="8192,32768,131072")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--paged", default="", help="page sizes for the paged-cache columns, e.g. 16,64,256")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    pages = [int(x) for x in args.paged.split(",") if x]  # page sizes of the paged columns

    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import fajit.torch as ft

    dev = torch.cuda.get_device_name()
    flex = torch.compile(flex_attention, dynamic=False)
    B, Hq, Hkv, D = args.batch, args.heads_q, args.heads_kv, args.dim
    rows = []

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    def noop(b, h, q, kv):
        return q >= 0

    for lkv in [int(x) for x in args.lkv.split(",")]:
        for lq in [int(x) for x in args.lq.split(",")]:
            torch.manual_seed(0)
            q = torch.randn(B, Hq, lq, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, Hkv, lkv, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(B, Hkv, lkv, D, device="cuda", dtype=torch.bfloat16)
            kv_bytes = 2 * k.numel() * k.element_size()
            row = {"lq": lq, "lkv": lkv}

            kr = k.repeat_interleave(Hq // Hkv, dim=1)
            vr = v.repeat_interleave(Hq // Hkv, dim=1)
            with sdpa_kernel(SDPBackend.MATH):  # the reference: fp32 math on expanded K/V
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), kr.float(), vr.float())
            del kr, vr

            # flex: with a block mask (what a masked decode uses), else without one
            row["flex"] = float("nan")
            tmask = create_block_mask(noop, None, None, lq, lkv)
            for label, kw in (("", {"block_mask": tmask}), ("no block mask", {})):
                try:
                    out = flex(q, k, v, enable_gqa=True, **kw)
                    assert rel(out, ref) < 2e-2, f"flex rel. error {rel(out, ref):.1e}"
                    row["flex"] = bench(lambda: flex(q, k, v, enable_gqa=True, **kw))
                    if label:
                        row["flex_note"] = label
                    break
                except Exception as e:
                    first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
                    row["flex_note"] = f"{type(e).__name__}: {first[:120]}"
                    print(f"flex failed at Lq={lq} Lkv={lkv} ({label or 'block mask'}): {row['flex_note']}",
                          flush=True)
                    torch._dynamo.reset()

            fmask = ft.create_block_mask(noop, None, None, lq, lkv)
            out = ft.flex_attention(q, k, v, block_mask=fmask, enable_gqa=True)
            err = rel(out, ref)
            row["fajit_err"] = err
            row["fajit"] = bench(lambda: ft.flex_attention(q, k, v, block_mask=fmask, enable_gqa=True)) \
                if err < 2e-2 else float("nan")
            row["fajit_graph"] = float("nan")  # the same call replayed from a CUDA graph: GPU time only
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    gout = ft.flex_attention(q, k, v, block_mask=fmask, enable_gqa=True)
                graph.replay()
                assert torch.equal(gout, out), "the graph's output differs from the eager call's"
                row["fajit_graph"] = bench(graph.replay)
            except Exception as e:
                row["fajit_graph_note"] = f"{type(e).__name__}: {str(e)[:100]}"

            for ps in pages:
                row[f"paged{ps}"] = row[f"paged{ps}_graph"] = float("nan")
                if lkv % ps:
                    row[f"paged{ps}_note"] = f"Lkv {lkv} is not a multiple of the page size"
                    continue
                per = lkv // ps  # pages of each sequence, shuffled over one pool
                perm = torch.randperm(B * per, device="cuda")
                kpool = torch.empty(B * per, ps, Hkv, D, device="cuda", dtype=k.dtype)
                vpool = torch.empty_like(kpool)
                kpool[perm] = k.transpose(1, 2).reshape(B * per, ps, Hkv, D)
                vpool[perm] = v.transpose(1, 2).reshape(B * per, ps, Hkv, D)
                table = perm.view(B, per).to(torch.int32)
                lens = torch.full((B,), lkv, device="cuda", dtype=torch.int32)

                def paged():
                    return ft.flex_attention_varlen(q, kpool, vpool, seqlens_k=lens, page_table=table,
                                                    max_seqlen_k=lkv, enable_gqa=True)
                pout = paged()
                perr = rel(pout, ref)
                if perr >= 2e-2:
                    row[f"paged{ps}_note"] = f"rel. error {perr:.1e}"
                    continue
                row[f"paged{ps}"] = bench(paged)
                try:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        gout = paged()
                    graph.replay()
                    assert torch.equal(gout, pout), "the graph's output differs from the eager call's"
                    row[f"paged{ps}_graph"] = bench(graph.replay)
                except Exception as e:
                    row[f"paged{ps}_note"] = f"graph: {type(e).__name__}: {str(e)[:100]}"
                del kpool, vpool

            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        s = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        assert rel(s, ref) < 2e-2
                        row[name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, enable_gqa=True))
                except Exception as e:  # a backend that refuses the shape
                    try:
                        kr = k.repeat_interleave(Hq // Hkv, dim=1)
                        vr = v.repeat_interleave(Hq // Hkv, dim=1)
                        with sdpa_kernel(backend):
                            row[name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, kr, vr))
                        row[name + "_note"] = "expanded KV"
                    except Exception as e2:
                        row[name] = float("nan")
                        row[name + "_note"] = str(e2)[:60] or str(e)[:60]
            kc, vc = torch.empty_like(k), torch.empty_like(v)
            row["copy"] = bench(lambda: (kc.copy_(k), vc.copy_(v)))  # reads and writes K+V
            row["kv_bytes"] = kv_bytes
            rows.append(row)
            print(row, flush=True)

    def tbs(ms, nbytes):
        return nbytes / (ms * 1e-3) / 1e12

    lines = [f"Decoding, {dev}, {datetime.date.today()}: bf16 B={B} Hq={Hq} Hkv={Hkv} D={D}, no mask; "
             "ms (TB/s of K+V read)", "",
             "| Lq | Lkv | fajit | fajit, CUDA graph | flex | SDPA flash | SDPA cuDNN | copy K,V (TB/s read+write) | "
             "fajit / flex | fajit TB/s / copy TB/s | graph TB/s / copy TB/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        n = r["kv_bytes"]
        cells = [f"{r[x]:.3f} ({tbs(r[x], n):.2f})" for x in ("fajit", "fajit_graph", "flex", "flash", "cudnn")]
        cells.append(f"{r['copy']:.3f} ({tbs(r['copy'], 2 * n):.2f})")
        copy = tbs(r['copy'], 2 * n)
        lines.append(f"| {r['lq']} | {r['lkv']} | " + " | ".join(cells) +
                     f" | {r['flex'] / r['fajit']:.2f}x | {tbs(r['fajit'], n) / copy:.2f} | "
                     f"{tbs(r['fajit_graph'], n) / copy:.2f} |")
    if pages:
        lines += ["", "Paged cache (pages shuffled over a pool): ms eager / graph-replayed, and as a ratio of the "
                  "dense call's time (dense / paged: >= 0.95 is issue 11's target)", "",
                  "| Lq | Lkv | dense eager / graph | " +
                  " | ".join(f"page {ps}: eager / graph | ratio eager / graph" for ps in pages) + " |",
                  "|---:|---:|---:|" + "---:|---:|" * len(pages)]
        for r in rows:
            cells = [f"{r['fajit']:.3f} / {r['fajit_graph']:.3f}"]
            for ps in pages:
                e, g = r[f"paged{ps}"], r[f"paged{ps}_graph"]
                cells += [f"{e:.3f} / {g:.3f}", f"{r['fajit'] / e:.2f} / {r['fajit_graph'] / g:.2f}"]
            lines.append(f"| {r['lq']} | {r['lkv']} | " + " | ".join(cells) + " |")
    notes = [f"- Lq={r['lq']} Lkv={r['lkv']} {x}: {r[x + '_note']}" for r in rows
             for x in ["flex", "fajit_graph", "flash", "cudnn"] + [f"paged{ps}" for ps in pages] if x + "_note" in r]
    if notes:
        lines += ["", "Notes:"] + notes
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
