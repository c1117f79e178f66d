#!/usr/bin/env bash
# Where one kernel's warps stall, instruction by instruction: Nsight Compute's warp-state
# sampling (SourceCounters) of one launch, summarised by bench/ncu_top_stalls.py into the SASS
# lines with the most samples and their reasons, so a change to a kernel starts from data.
#
# On the GPU machine (tool `run`, carry [".device-build/bin"]):
#   bench/ncu_source.sh NAME KERNEL-REGEX fajit-run-arguments...
# e.g. bench/ncu_source.sh bwd_d128_full fajit_bwd_dkdv --backward --batch 4 --heads 16 --len 4096
#   bench/ncu_source.sh NAME KERNEL-REGEX --cmd COMMAND...   profiles any other program's kernel,
# e.g. cuDNN's backward: bench/ncu_source.sh cudnn_bwd_d128 bprop --cmd python3 bench/sdpa_backward_once.py 128
# writes $OUT/ncu-src-NAME.txt (the summary) and $OUT/ncu-sass-NAME.txt (every SASS line with its
# samples and execution count; the raw CSV stays in /tmp). The launch profiled is
# the second of the kernel (the first may compile or tune); `--no-check --iters 2` are added.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.device-build/out}; mkdir -p "$OUT"
FAJIT=${FAJIT:-.device-build/bin/fajit}
export FAJIT_CACHE_DIR=${FAJIT_CACHE_DIR:-/tmp/fajit-ncu-cache}
name=$1 regex=$2; shift 2
if [[ "${1:-}" == --cmd ]]; then shift; CMD=("$@"); else CMD=("$FAJIT" run "$@" --no-check --iters 2); fi
rep=/tmp/ncu-src-$name
timeout -k 5 "${NCU_TIMEOUT:-240}" ncu --kernel-name "regex:$regex" --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
    --import-source no -f -o "$rep" "${CMD[@]}" >"$rep.log" 2>&1
echo "ncu rc=$?" >>"$rep.log"
{
  nvidia-smi -L
  echo "${CMD[*]}; kernel $regex (second launch)"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|pipe_xu" <(ncu -i "$rep.ncu-rep" --page details 2>/dev/null) | head -8
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.csv" 2>"$rep.err"
  python3 bench/ncu_top_stalls.py "$rep.csv" "${TOP:-45}" "$OUT/ncu-sass-$name.txt"
  tail -3 "$rep.log"
} >"$OUT/ncu-src-$name.txt" 2>&1
head -5 "$OUT/ncu-src-$name.txt"
