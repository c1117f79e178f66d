#!/usr/bin/env python3
"""Summarise Nsight Compute's source page (SASS, CSV: `ncu -i R --page source --csv --print-source
sass`): total warp-state samples by reason, then the N SASS lines with the most samples, each with
its execution count and top three reasons; where the page has them, shared-memory wavefronts (all,
ideal, excess, the wgmma operand reads' share) and the lines with the most excess (bank
conflicts). Column names vary between ncu versions, so they are matched loosely and the header is
printed once for the record.

    python3 bench/ncu_top_stalls.py report.csv [N] [LISTING]

LISTING, if given, receives every SASS line in address order with its samples and execution count
(to read a hot spot in its loop).
"""
import csv
import sys


def number(text):
    try:
        return float(str(text).replace(",", "").strip() or 0)
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        lines = [line for line in f if line.strip()]
    # ncu may print lines before the header: the header is the first row naming an address
    start = next((i for i, line in enumerate(lines) if "Address" in line and "Source" in line), 0)
    rows = list(csv.reader(lines[start:]))
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    print("columns:", "; ".join(header))

    def col(*needles, avoid=()):
        for i, name in enumerate(header):
            low = name.lower()
            if all(n in low for n in needles) and not any(a in low for a in avoid):
                return i
        return None

    addr = col("address")
    src = col("source")
    samples = col("warp stall sampling (all")
    if samples is None:
        samples = col("sampl", avoid=("not-issued", "not issued"))
    executed = col("instructions executed", avoid=("predicated", "thread"))
    # per-reason columns: names with "stall_" (ncu 2023+: "stall_long_sb" ...) or "(All Samples)"
    # reason columns; fall back to nothing
    reasons = [i for i, name in enumerate(header)
               if i != samples and "not issued" not in name.lower()
               and ("stall_" in name.lower() or name.lower().startswith("smsp__pcsamp"))]
    if samples is None:
        print("no sample column found")
        return
    total = sum(number(r[samples]) for r in body)
    print(f"{len(body)} SASS lines, {total:.0f} warp-state samples")
    if reasons:
        by = sorted(((sum(number(r[i]) for r in body), header[i]) for i in reasons), reverse=True)
        print("by reason:", ", ".join(f"{n} {v:.0f}" for v, n in by if v > 0))
    # execution counts name the roles (e.g. a consumer's per-tile line runs once per tile and
    # consumer warp): samples by count, the most sampled counts first
    counts = {}
    for r in body:
        if executed is not None:
            k = number(r[executed])
            counts[k] = counts.get(k, 0) + number(r[samples])
    if counts:
        print("samples by execution count:",
              ", ".join(f"{k:.0f}x: {v:.0f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:8]))
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as out:
            for r in body:
                ex = f"{number(r[executed]):.0f}" if executed is not None else "-"
                a = r[addr][-5:] if addr is not None else "?"
                out.write(f"{a} {number(r[samples]):7.0f} {ex:>9}  {r[src].strip() if src is not None else ''}\n")
    shared_wavefronts(body, col, src, executed)
    print(f"\n{'address':>8} {'samples':>8} {'%':>5} {'executed':>10}  instruction  [top reasons]")
    for r in sorted(body, key=lambda r: -number(r[samples]))[:top]:
        s = number(r[samples])
        why = ""
        if reasons:
            rs = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:3]
            why = "[" + ", ".join(f"{n.replace('stall_', '')} {v:.0f}" for v, n in rs if v > 0) + "]"
        ex = f"{number(r[executed]):.0f}" if executed is not None else "-"
        a = r[addr] if addr is not None else "?"
        text = r[src].strip() if src is not None else ""
        print(f"{a:>8} {s:8.0f} {100 * s / max(total, 1):5.1f} {ex:>10}  {text[:70]:70}  {why}")


def shared_wavefronts(body, col, src, executed, top=6):
    """Shared-memory wavefronts (LSU: loads, stores, ldmatrix/stmatrix and wgmma operand reads),
    the ideal count and the excess, and the lines with the most excess."""
    wf = col("wavefronts shared", avoid=("ideal", "excessive"))
    ideal = col("wavefronts shared ideal")
    excess = col("wavefronts shared excessive")
    if wf is None or src is None:
        return
    total = sum(number(r[wf]) for r in body)
    if total == 0:
        return
    gmma = sum(number(r[wf]) for r in body if "GMMA" in r[src])
    line = f"shared wavefronts {total:.4g} ({100 * gmma / total:.1f} % wgmma operand reads)"
    if ideal is None or excess is None:
        print(line)
        return
    ex = sum(number(r[excess]) for r in body)
    print(f"{line}, ideal {sum(number(r[ideal]) for r in body):.4g}, excess {ex:.4g} ({100 * ex / total:.1f} %)")
    for r in sorted(body, key=lambda r: -number(r[excess]))[:top]:
        if number(r[excess]) <= 0:
            break
        ex_n = f"{number(r[executed]):.0f}" if executed is not None else "-"
        print(f"  excess {number(r[excess]):10.0f} of {number(r[wf]):10.0f}  executed {ex_n:>9}  {r[src].strip()[:60]}")


if __name__ == "__main__":
    main()
