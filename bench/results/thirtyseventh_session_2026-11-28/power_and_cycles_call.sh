#!/usr/bin/env bash
# session 37, call 1: is the d128 forward power-bound? clocks/power while each tile runs; per-tile cycles vs us
cd "$(dirname "$0")/../.."
export FAJIT_CACHE_DIR=/tmp/fc FAJIT_AUTOTUNE=0
nvidia-smi -L
nvidia-smi -q -d POWER | grep -iE "limit|draw" | head -8
T=.device-build/trace/fajit
S=.device-build/s37
Q=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active
sample_start() { nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits -lms 50 > $OUT/smi_$1.csv 2>&1 & SMI=$!; sleep 0.3; }
sample_stop() { kill $SMI; wait $SMI 2>/dev/null; python3 - "$OUT/smi_$1.csv" "$1" <<'PY'
import sys, statistics as st
rows=[l.split(',') for l in open(sys.argv[1]) if l.count(',')>=4]
rows=[r for r in rows if r[1].strip().replace('.','').isdigit()]
busy=[r for r in rows if float(r[2])>250]
if not busy: print(sys.argv[2], 'no busy samples', rows[:3]); sys.exit()
clk=[float(r[1]) for r in busy]; pw=[float(r[2]) for r in busy]
reasons=sorted(set(r[4].strip() for r in busy))
print(f"{sys.argv[2]:28s} samples {len(busy):3d}  sm clock median {st.median(clk):6.0f} MHz (min {min(clk):.0f})  power median {st.median(pw):5.0f} W  max {max(pw):.0f}  temp {busy[-1][3].strip()}  reasons {reasons}")
PY
}
export FAJIT_TEMPLATE_DIR=$S/tpl_trfix
A="--head-dim 128 --batch 4 --heads 16 --len 4096 --no-check --seed 7"
for m in "" "--mask causal"; do
for cfg in "s3np:--kernel wgmma --tile 128x128w12s3" "s2np:--kernel wgmma --tile 128x128w12s2" "s2p:--kernel wgmma --tile 128x128w12s2"; do
  name=${cfg%%:*}; args=${cfg#*:}; n=$(echo "$m" | tr -d ' -')
  if [ $name = s2p ]; then export FAJIT_PERSIST_ANY=1; else unset FAJIT_PERSIST_ANY; fi
  $T run $A $m $args --iters 20 >/dev/null 2>&1   # compile
  sample_start ${name}_$n
  r=$($T run $A $m $args --iters 4000 2>&1 | grep -oE "forward: [0-9.]+ ms")
  sample_stop ${name}_$n
  echo "   -> $name '$m' $r"
  FAJIT_TRACE=$OUT/tr_${name}_$n.bin $T run $A $m $args --iters 4 >/dev/null 2>&1
done; done
unset FAJIT_PERSIST_ANY
python3 - <<'PY' > /dev/null
PY
sample_start cudnn
python3 - <<'PY'
import torch, time
from torch.nn.attention import sdpa_kernel, SDPBackend
q,k,v=[torch.randn(4,16,4096,128,device='cuda',dtype=torch.bfloat16) for _ in range(3)]
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
  for _ in range(20): torch.nn.functional.scaled_dot_product_attention(q,k,v)
  torch.cuda.synchronize(); t=time.time()
  for _ in range(4000): torch.nn.functional.scaled_dot_product_attention(q,k,v)
  torch.cuda.synchronize(); print('cudnn full d128 ms', (time.time()-t)/4000*1e3)
PY
sample_stop cudnn
for f in $OUT/tr_*.bin; do echo "== $f"; python3 $S/trace_report.py $f 2>&1 | head -12; done
# clocks locked by ncu (base): durations of the three tiles, full
for cfg in "s3np:--kernel wgmma --tile 128x128w12s3" "s2np:--kernel wgmma --tile 128x128w12s2" "s2p:--kernel wgmma --tile 128x128w12s2"; do
  name=${cfg%%:*}; args=${cfg#*:}
  if [ $name = s2p ]; then export FAJIT_PERSIST_ANY=1; else unset FAJIT_PERSIST_ANY; fi
  echo "== ncu $name"; ncu --kernel-name regex:fajit_forward --launch-skip 2 --launch-count 3 --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_elapsed.max $T run $A $args --iters 5 2>&1 | grep -E "gpu__|sm__" 
done
