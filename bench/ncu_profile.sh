#!/usr/bin/env bash
# Nsight Compute profiles of one launch of each kernel that issue 14's targets are about, so the
# next optimisation is chosen from data (summarise them in bench/RESULTS.md): fajit's forward at d128
# causal, d64 full and d128 softcap, its backward dK/dV kernel at d128 full, and the same
# forwards of cuDNN (SDPA) and torch flex_attention. bf16, B=4 H=16 S=4096, as bench/flex_compare.py.
#
# On the GPU machine (tool `run`, kind nvidia-h200, carry [".device-build/bin"]):
#   bench/ncu_profile.sh            writes $OUT/ncu-<case>.txt (sections) and $OUT/ncu-summary.txt
#   bench/ncu_profile.sh backward   instead: where the backward's memory traffic goes (issue 10's
#                                   d128 gap to cuDNN): fajit's dK/dV kernel at d128 full and
#                                   causal and cuDNN's backward kernels at d128 full, with the
#                                   MemoryWorkloadAnalysis section and L2 / DRAM / shared byte
#                                   counts (the dQ reductions' L2 `red` sectors among them).
#                                   First run (H200, 2026-11-27, bench/RESULTS.md thirty-second
#                                   session): L2 at 41 % for fajit, 50 % for cuDNN; same red
#                                   sectors; fajit 19 % more shared wavefronts
# Sections: SpeedOfLight, ComputeWorkloadAnalysis (pipe utilisation), InstructionStats,
# WarpStateStats (stall reasons), Occupancy, LaunchStats. `fajit run --no-check` skips the
# float64 reference (at this shape it would take minutes); each profile is cut at NCU_TIMEOUT
# (150) seconds. Kernel names: fajit_forward, fajit_bwd_{pre,dkdv,dq}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-.device-build/out}; mkdir -p "$OUT"
FAJIT=${FAJIT:-.device-build/bin/fajit}
export FAJIT_CACHE_DIR=${FAJIT_CACHE_DIR:-/tmp/fajit-ncu-cache}
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
          --section WarpStateStats --section Occupancy --section LaunchStats)
# Explicit pipe metrics (names of Nsight Compute 2025 on GH100; a run without them still has the
# sections): tensor (wgmma / mma.sync), MUFU (xu), FMA pipes, as % of peak while active.
METRICS=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum

if [[ "${1:-}" == backward ]]; then  # memory traffic: L2 / DRAM / shared bytes, L2 `red` sectors
  SECTIONS=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats)
  # (shared-memory wavefronts count the wgmma operand reads too: an SS m64n64k16 reads 4 KB, 32
  # wavefronts, as fast as the tensor core consumes them; ld / st split them from the stores'
  # and loads' own, bank conflicts the excess)
  METRICS=lts__t_bytes.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
fi

# Keep the metrics this ncu knows (an unknown name would fail the whole profile).
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
METRICS=$(tr ',' '\n' <<<"$METRICS" | while read -r m; do grep -qx "${m%%.*}" <<<"$known" && echo "$m"; done | paste -sd,)
[[ -n "$METRICS" ]] || METRICS=gpu__time_duration.sum

profile() {  # name kernel-regex skip command...
  local name=$1 regex=$2 skip=$3; shift 3
  timeout -k 5 "${NCU_TIMEOUT:-150}" ncu --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "${NCU_LAUNCHES:-1}" "${SECTIONS[@]}" \
      --metrics "$METRICS" "$@" >"$OUT/ncu-$name.txt" 2>&1
  echo "$name: rc=$? $(grep -c 'Section:' "$OUT/ncu-$name.txt") sections" >>"$OUT/ncu-summary.txt"
}

nvidia-smi -L >"$OUT/ncu-summary.txt"
ncu --version | tail -1 >>"$OUT/ncu-summary.txt"
echo "metrics: $METRICS" >>"$OUT/ncu-summary.txt"
SHAPE=(--batch 4 --heads 16 --len 4096 --no-check --iters 3)

if [[ "${1:-}" == backward ]]; then
  profile fajit_bwd_dkdv_d128_full_mem fajit_bwd_dkdv 1 "$FAJIT" run --backward "${SHAPE[@]}"
  profile fajit_bwd_dkdv_d128_causal_mem fajit_bwd_dkdv 1 "$FAJIT" run --backward --mask causal "${SHAPE[@]}"
  # the third iteration's kernels whose names look like cuDNN's attention (forward and backward:
  # the report names each)
  NCU_LAUNCHES=6 profile cudnn_bwd_d128_full_mem "sdpa|fmha|flash|dgrad|bprop|cudnn" 4 python3 bench/sdpa_backward_once.py 128
  cat "$OUT/ncu-summary.txt"
  exit 0
fi
profile fajit_fwd_d128_causal fajit_forward 1 "$FAJIT" run --mask causal "${SHAPE[@]}"
profile fajit_fwd_d64_full fajit_forward 1 "$FAJIT" run "${SHAPE[@]}" --head-dim 64
profile fajit_fwd_d128_softcap_causal fajit_forward 1 "$FAJIT" run --mask causal --score softcap:30 "${SHAPE[@]}"
profile fajit_bwd_dkdv_d128_full fajit_bwd_dkdv 1 "$FAJIT" run --backward "${SHAPE[@]}"

# torch's kernels on the same shapes: cuDNN SDPA (full/causal) and flex_attention (compiled).
cat >"$OUT/ncu_torch.py" <<'PY'
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
which, mask, d = sys.argv[1], sys.argv[2], int(sys.argv[3])
q, k, v = (torch.randn(4, 16, 4096, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
causal = mask == "causal"
for _ in range(3):
    if which == "cudnn":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 4096, 4096) if causal else None
        torch.compile(flex_attention)(q, k, v, block_mask=bm)
torch.cuda.synchronize()
PY
profile cudnn_fwd_d128_causal "sdpa|fmha|flash|fprop" 1 python3 "$OUT/ncu_torch.py" cudnn causal 128
profile cudnn_fwd_d64_full "sdpa|fmha|flash|fprop" 1 python3 "$OUT/ncu_torch.py" cudnn full 64
profile flex_fwd_d128_causal "triton_tem|flex" 1 python3 "$OUT/ncu_torch.py" flex causal 128
profile flex_fwd_d64_full "triton_tem|flex" 1 python3 "$OUT/ncu_torch.py" flex full 64
cat "$OUT/ncu-summary.txt"
