#!/usr/bin/env bash
# Decoding, decode/prefill crossover and paged-vs-contiguous timings on the GPU machine (run
# from the repository root with .device-build/bin and .device-build/lib carried; see
# scripts/gpu-test.sh and scripts/gpu-bench.sh). Prints markdown-ready lines.
export FAJIT_CACHE_DIR=/tmp/fc; F=.device-build/bin/fajit; nvidia-smi -L
export FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
timeout 150 python3 bench/decode_compare.py --lq 1,16 --warmup 10 --rep 40 2>&1 | grep -v "^{" | tail -16
echo "== checks (small)"
$F run --batch 5 --heads 8 --heads-kv 2 --len-q 1 --len-kv 3000 --paged 16 --varlen --iters 5 | tail -2
$F run --batch 5 --heads 8 --heads-kv 2 --len-q 300 --len-kv 3000 --paged 16 --varlen --iters 5 | tail -2
echo "== paged vs contiguous: B=4 Hq=32 Hkv=8 D=128 Lq=1"
for L in 8192 32768 131072; do for P in 0 16 64 256; do echo "Lkv=$L page=$P: $($F run --batch 4 --heads 32 --heads-kv 8 --len-q 1 --len-kv $L $( [ $P -gt 0 ] && echo --paged $P ) --no-check --iters 50 | grep 'forward:')"; done; done
echo "== crossover decode vs prefill: B=4 Hq=32 Hkv=8 D=128 Lkv=8192/32768"
for L in 8192 32768; do for Q in 1 8 16 32 64; do for P in decode prefill; do echo "Lkv=$L Lq=$Q $P: $($F run --batch 4 --heads 32 --heads-kv 8 --len-q $Q --len-kv $L --path $P --no-check --iters 30 | grep 'forward:')"; done; done; done
