#!/usr/bin/env bash
# The main job: builds when needed, then compiles the default variant (causal mask with the
# ALiBi score_mod) and shows every stage: fa IR, generated CUDA, PTX; where a GPU exists it
# runs the kernel, checks it against the float64 reference and times it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${FAJIT_BUILD_DIR:-build}"
FAJIT="$BUILD/tools/fajit/fajit"
VARIANT=(--mask causal --score alibi)
echo "== fa IR: causal mask + ALiBi score_mod =="
"$FAJIT" dump --mlir "${VARIANT[@]}"
echo
echo "== generated CUDA (the mods; the kernel body comes from templates/fajit/forward_sm90.cuh on sm_90a, the default without a GPU) =="
"$FAJIT" dump --cuda "${VARIANT[@]}"
echo
echo "== PTX (sm_90a) =="
ptx=$("$FAJIT" dump --ptx --arch sm_90a "${VARIANT[@]}")
echo "$ptx" | grep -m1 "\.entry" || true
count() { echo "$ptx" | grep -c "$1" || true; }
echo "$(echo "$ptx" | wc -l) lines: $(count 'wgmma.mma_async') wgmma, $(count 'mma.sync') mma.sync, $(count 'ldmatrix') ldmatrix, $(count 'cp.async.cg') cp.async"
echo
echo "== run on the GPU =="
"$FAJIT" run "${VARIANT[@]}"
