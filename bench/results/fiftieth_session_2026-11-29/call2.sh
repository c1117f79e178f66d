#!/usr/bin/env bash
# Session 50, call 2: the backward cases of both families on main 084ab4b (device kv masks
# derived on the GPU for the backward since 57f12da).
export FAJIT_CACHE_DIR=/tmp/fc
t0=$(date +%s)
OUT=$OUT timeout 560 bash .device-build/bin/run-gpu-tests.sh backward 2>&1 | tail -25
echo "backward $(( $(date +%s) - t0 )) s"
