#!/usr/bin/env bash
# Session 50, call 1: session 49's unverified commits (derive_device_kinds, CallMasks, one-copy
# tables, as_strided views, presets): runtime GPU tests, the GPU suite without the backward,
# the whole Python suite, create_block_mask's host time and the per-step-mask probe.
export FAJIT_CACHE_DIR=/tmp/fc PYTHONDONTWRITEBYTECODE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 60 .device-build/s50/fajit_runtime_gpu_test > $OUT/runtime_gpu.txt 2>&1; echo "runtime gpu rc=$? $(( $(date +%s) - t0 )) s"
grep -E '^\[  FAILED|PASSED|tests ran|Failure' $OUT/runtime_gpu.txt | head -20
t0=$(date +%s)
timeout 200 .device-build/bin/fajit_gpu_tests --gtest_filter='-*BackwardTest*' > $OUT/gpu_rest.txt 2>&1; echo "gpu rest rc=$? $(( $(date +%s) - t0 )) s"
grep -E '^\[  FAILED|PASSED|tests ran|Failure' $OUT/gpu_rest.txt | head -30
export FAJIT_LIBRARY=$PWD/.device-build/lib/libfajit.so PYTHONPATH=$PWD/python
t0=$(date +%s)
timeout 220 python3 -m pytest -q -p no:cacheprovider --tb=short -W ignore python/tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^E |^____|passed|failed" $OUT/pytest.txt | head -30
timeout 60 python3 .device-build/s50/profile_mask2.py 2>&1 | grep -v Warn | head -20
for r in 1 2; do timeout 60 python3 bench/train_mask_probe.py --backends fajit --out /tmp/t 2>&1 | grep "^{"; done
