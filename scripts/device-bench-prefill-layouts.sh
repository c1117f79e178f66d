#!/usr/bin/env bash
# Ragged and paged prefill against the dense layout, per forward family, on the GPU machine
# (run from the repository root with .device-build/bin carried; see scripts/gpu-test.sh).
# `fajit run` host-timed medians (ms), autotuning off, the same inputs and --varlen lengths for
# both families (--seed). Prints one markdown row per case and layout.
export FAJIT_CACHE_DIR=/tmp/fc FAJIT_AUTOTUNE=0; F=.device-build/bin/fajit; nvidia-smi -L
echo "== checks (small, each sequence against float64)"
for K in auto mma; do
  $F run --kernel $K --batch 5 --heads 8 --heads-kv 2 --len-q 300 --len-kv 700 --mask causal --varlen --iters 3 | grep -E "vs float64"
  $F run --kernel $K --batch 5 --heads 8 --heads-kv 2 --len-q 300 --len-kv 700 --head-dim 64 --paged 16 --varlen --iters 3 | grep -E "vs float64"
done
ms() { "$F" run --no-check --iters 30 --seed 7 "$@" | sed -n 's/^forward: \([0-9.]*\) ms.*/\1/p'; }
echo "| case | layout | mma.sync ms | wgmma ms | wgmma / mma.sync speed |"
echo "|---|---|---:|---:|---:|"
while read -r name args; do
  for L in "dense:" "paged 16:--paged 16" "paged 64:--paged 64" "paged 256:--paged 256" "ragged (random):--varlen"; do
    lname=${L%%:*}; largs=${L#*:}
    m=$(ms --kernel mma $args $largs); w=$(ms --kernel auto $args $largs)
    echo "| $name | $lname | $m | $w | $(python3 -c "print(f'{$m/$w:.2f}x')" 2>/dev/null) |"
  done
done <<'CASES'
d128_causal_B4_Hq32_Hkv8_S4096 --batch 4 --heads 32 --heads-kv 8 --len 4096 --mask causal
d128_full_B4_Hq32_Hkv8_S4096 --batch 4 --heads 32 --heads-kv 8 --len 4096
d64_full_B4_H16_S4096 --batch 4 --heads 16 --heads-kv 16 --len 4096 --head-dim 64
d64_causal_B8_H16_S2048 --batch 8 --heads 16 --heads-kv 16 --len 2048 --head-dim 64 --mask causal
d80_full_B4_H16_S4096 --batch 4 --heads 16 --heads-kv 16 --len 4096 --head-dim 80
d256_causal_B4_H16_S4096 --batch 4 --heads 16 --heads-kv 16 --len 4096 --head-dim 256 --mask causal
CASES
