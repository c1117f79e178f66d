#!/usr/bin/env bash
# The main job: builds when needed, then compiles the default variant (causal mask with the
# ALiBi score_mod) and prints its IR.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD="${FAJIT_BUILD_DIR:-build}"
FAJIT="$BUILD/tools/fajit/fajit"
echo "== fa IR: causal mask + ALiBi score_mod =="
"$FAJIT" dump --mlir --mask causal --score alibi
