#!/usr/bin/env python3
"""Summarises a FAJIT_TRACE dump of the Hopper forward (branch wip-fwd-trace)."""
import sys, struct
import numpy as np

def load(path):
    raw = open(path, 'rb').read()
    gx, gy, pers, threads = struct.unpack('4i', raw[:16])
    n = gx * gy
    a = np.frombuffer(raw[16 + 64:16 + 64 + n * 4 * 24 * 8 * 8], dtype=np.uint64).reshape(n, 4, 24, 8).astype(np.int64)
    return gx, gy, pers, threads, a

def main(path):
    gx, gy, pers, threads, a = load(path)
    n = gx * gy
    cons = 3 if threads == 512 else 2
    print(f'== {path}: grid {gx}x{gy}, persistent {pers}, threads {threads}, consumers {cons}')
    # clock rate from consumer 1's first block
    c = a[:, 1, 0]
    ok = (c[:, 0] > 0) & (c[:, 3] > c[:, 0]) & (c[:, 5] > c[:, 4])
    ghz = np.median((c[ok, 3] - c[ok, 0]) / (c[ok, 5] - c[ok, 4]))
    print(f'clock {ghz:.3f} GHz (cycles per ns)')
    us = lambda cyc: cyc / ghz / 1e3
    rows = []
    for role in range(1, cons + 1):
        for k in range(24):
            e = a[:, role, k]
            v = e[:, 0] > 0
            if not v.any(): continue
            for i in np.nonzero(v)[0]:
                r = e[i]
                nxt = a[i, role, k + 1, 0] if k + 1 < 24 else 0
                rows.append((role, k, i, r[6], r[1] - r[0] if r[6] > 0 else 0, r[2] - r[1] if r[6] > 0 else 0,
                             r[3] - r[2], (nxt - r[3]) if nxt > 0 else -1, r[3] - r[0], r[4], r[5], r[7]))
    R = np.array(rows, dtype=np.int64)
    tiles = R[:, 3]
    has = tiles > 1
    per_tile = R[has, 5] / (tiles[has] - 1 + 0.5)
    print(f'blocks traced {len(R) // cons}, tiles per block mean {tiles.mean():.2f}')
    print(f'steady tile (loop / (tiles-0.5)) median {us(np.median(per_tile)):.3f} us')
    print(f'first S done after block start: median {us(np.median(R[has, 4])):.3f} us, p90 {us(np.percentile(R[has, 4], 90)):.3f}')
    print(f'epilogue (last PV done -> LSE stored): median {us(np.median(R[:, 6])):.3f} us, p90 {us(np.percentile(R[:, 6], 90)):.3f}')
    g = R[R[:, 7] >= 0, 7]
    if len(g):
        print(f'gap to next block start (q_full wait): median {us(np.median(g)):.3f} us, p90 {us(np.percentile(g, 90)):.3f}, n {len(g)}')
    tot = R[:, 8]
    exp = np.where(tiles > 0, tiles * np.median(per_tile), 0)
    print(f'block time median {us(np.median(tot)):.2f} us; minus tiles x steady tile: median {us(np.median(tot - exp)):.3f} us, mean {us(np.mean(tot - exp)):.3f}')
    # per role
    for role in range(1, cons + 1):
        m = (R[:, 0] == role) & has
        print(f'  consumer {role}: first S {us(np.median(R[m, 4])):.3f}, tile {us(np.median(R[m, 5] / (R[m, 3] - 0.5))):.3f}, epi {us(np.median(R[m, 6])):.3f}, over {us(np.median((R[m, 8] - R[m, 3] * np.median(per_tile)))):.3f} us')
    # SM-level (globaltimer, ns): busy span per SM and idle between CTAs / blocks
    sm = R[:, 11]
    span, idle, blocks = [], [], []
    for s in np.unique(sm):
        m = (sm == s) & (R[:, 0] == 1)
        st, en = R[m, 9], R[m, 10]
        o = np.argsort(st)
        st, en = st[o], en[o]
        span.append(en.max() - st.min())
        idle.append(np.maximum(st[1:] - en[:-1], 0).sum() if len(st) > 1 else 0)
        blocks.append(len(st))
    span, idle, blocks = map(np.array, (span, idle, blocks))
    t0 = R[:, 9].min(); t1 = R[:, 10].max()
    print(f'kernel span (first block start -> last LSE) {(t1 - t0) / 1e3:.1f} us; per SM busy span median {np.median(span) / 1e3:.1f} us, blocks per SM {blocks.min()}-{blocks.max()}')
    print(f'consumer 1 idle between its blocks on an SM (globaltimer): median per SM {np.median(idle) / 1e3:.2f} us = {np.median(idle / np.maximum(blocks - 1, 1)) / 1e3:.3f} us a change')
    # the SMs' finishing spread (tail)
    ends = []
    for s in np.unique(sm):
        m = (sm == s)
        ends.append(R[m, 10].max())
    ends = np.sort(np.array(ends)) - t0
    print(f'SM finish times (us from start): min {ends[0] / 1e3:.1f}, median {np.median(ends) / 1e3:.1f}, max {ends[-1] / 1e3:.1f}')
    if pers:
        p = a[:, 0]
        w = []
        for k in range(2, 24):
            v = p[:, k, 0] > 0
            w.extend((p[v, k, 1] - p[v, k, 0]).tolist())
        if w:
            print(f'producer q_empty wait: median {us(np.median(w)):.3f} us, p90 {us(np.percentile(w, 90)):.3f}')
        ahead = []
        for k in range(1, 24):
            for i in range(n):
                if p[i, k, 1] > 0 and a[i, 1, k, 0] > 0:
                    ahead.append(a[i, 1, k, 0] - p[i, k, 1])
        if ahead:
            print(f'consumer 1 block start after its Q was issued: median {us(np.median(ahead)):.3f} us (negative: Q issued late)')

for f in sys.argv[1:]:
    main(f)
