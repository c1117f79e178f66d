#!/usr/bin/env bash
# The fuzzer's GPU mode as parallel processes on the GPU machine (tests/fuzz/README.md).
#   scripts/gpu-fuzz.sh FIRST_SEED PROCS CASES SECONDS [fajit binary]
# runs PROCS processes `fajit fuzz --gpu --seed S --cases CASES --seconds SECONDS --nvrtc-every 0`
# for S = FIRST_SEED .. FIRST_SEED+PROCS-1, each to $OUT/fuzz-S.log (OUT defaults to
# .device-build/out), then prints every failure's first lines and the summed counts and times. A
# process still running GRACE (default 150) seconds past SECONDS is killed: its log ends with the
# "case K ..." it was in. FUZZ_FLAGS adds flags to every process (e.g. --kv-linear).
set -uo pipefail
first=${1:?first seed}; procs=${2:?processes}; cases=${3:?cases per process}; secs=${4:?seconds}
bin=${5:-.device-build/bin/fajit}
OUT=${OUT:-.device-build/out}; mkdir -p "$OUT"
export FAJIT_CACHE_DIR=${FAJIT_CACHE_DIR:-/tmp/fajit-fuzz-cache}
for ((s = first; s < first + procs; ++s)); do
  timeout -k 10 $((secs + ${GRACE:-150})) "$bin" fuzz --gpu --seed "$s" --cases "$cases" --seconds "$secs" --nvrtc-every 0 ${FUZZ_FLAGS:-} >"$OUT/fuzz-$s.log" 2>&1 &
done
wait
cat "$OUT"/fuzz-[0-9]*.log >"$OUT/fuzz-all.log" && rm -f "$OUT"/fuzz-[0-9]*.log
grep -A3 '^FAIL' "$OUT/fuzz-all.log" | grep -v '^--$' | grep -v '^  score\|^  mask' | cut -c1-400
python3 - "$OUT/fuzz-all.log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
tot = {}
for m in re.finditer(r"fajit fuzz: (\d+) cases?, (\d+) failures?, ([\d.]+) s", text):
    for k, v in zip(("cases", "failures", "seconds"), m.groups()):
        tot[k] = tot.get(k, 0) + float(v)
for key, pat in [("mix", r"mix: (\d+) MLIR-text cases, (\d+) identity score_mods, (\d+) GQA shapes, (\d+) with"),
                 ("gpu", r"gpu: (\d+) forwards, (\d+) ragged/paged layouts, (\d+) backwards"),
                 ("time", r"time: ([\d.]+) s CPU checks, ([\d.]+) s fa::compile \(NVRTC\), ([\d.]+) s float64 references, ([\d.]+) s the")]:
    sums = None
    for m in re.finditer(pat, text):
        vals = [float(x) for x in m.groups()]
        sums = vals if sums is None else [a + b for a, b in zip(sums, vals)]
    tot[key] = sums
print("fuzz total:", tot)
PY
