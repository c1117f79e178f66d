#!/usr/bin/env bash
# Builds fajit_gpu_tests (and fajit_cli) for the GPU machine into the git-ignored .device-build/,
# then prints the `run` command that executes them there. Only the two targets are built.
#   scripts/gpu-test.sh            configure + build + copy to .device-build/bin/
# On the GPU machine (repository root, `carry: [".device-build/bin"]`):
#   .device-build/bin/fajit_gpu_tests                        the whole suite (~6-7 min on an H100 or H200; with the sanitizer subsets the runner needs ~10)
#   .device-build/bin/fajit_gpu_tests --gtest_filter=...      a subset (e.g. under compute-sanitizer)
# The binaries link MLIR/LLVM statically; libcuda is dlopen()ed and libnvrtc.so.13 is found
# through the RPATH /usr/local/cuda/lib64.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${FAJIT_DEVICE_BUILD_DIR:-.device-build/build}"   # an existing build dir may be reused
JOBS="${FAJIT_JOBS:-$(nproc)}"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD" -j "$JOBS" fajit_gpu_tests fajit_cli
mkdir -p .device-build/bin
cp -f "$BUILD/tests/gpu/fajit_gpu_tests" .device-build/bin/
# fajit_cli's output name is `fajit`.
cp -f "$BUILD/tools/fajit/$(cd "$BUILD/tools/fajit" && ls fajit fajit_cli 2>/dev/null | head -1)" .device-build/bin/fajit
# Only bin/ needs to travel: keep the carried tree small (the 64 MiB limit counts it).
du -sh .device-build/bin
F=Cases/ForwardTest.MatchesReference
BW=Cases/BackwardTest.MatchesReference      # the family the host picks: wgmma on sm_90a
BM=MmaSync/BackwardTest.MatchesReference    # the same cases on the mma.sync backward
# memcheck: the persistent forward with its CTAs capped (many query blocks each), every 17-row case (forward -- the decoding kernel -- and backward), odd head dims, exact-size capture buffers with tail tiles (an out-of-range q or
# kv read is out of bounds), no-LSE, a 4097 case, the builder, the validation paths; values by key
# gathered across a warp (key_keep_bias, key_pad_bias: [B, Lkv] buffers) on the decoder and the
# mma.sync forward, dense, ragged and paged; the deterministic Hopper backward's counters of a
# last query tile whose second 64 rows lie past Lq.
SMALL="$F/*_ctas*:$F/*_17x*:$F/relative_bias_f16_d64x64_b2h4g1_1000x1000:$F/*nolse_stream:$F/document_softcap_bf16_d64x128_b1h4g4_4097x4097:Cases/BlockMaskTest.MatchesBruteForce/document2d_causal_b4h1_17x1000_p5:ForwardValidation.*:$BW/*_17x*:$BW/padding_f16_d128x64_b1h4g1_17x1000_allmasked:$BW/*allmasked_nandlse*:$BW/causal_bf16_d128x128_b2h4g2_1000x1000_noncontig:$BW/dilated_f16_d64x128_b1h4g4_4097x1000:$BM/*_17x*_mma:$BM/causal_bf16_d128x128_b2h4g2_1000x1000_noncontig_mma:$F/causal_offset_bf16_d256x256_b1h4g4_1x3000:$F/*d40x40*:$F/*d72x136*:$F/*d144x144*:$F/*d200x168*:$BW/*d40x40*:$BW/*d80x48*:$BW/*d72x72*:$BW/*d80x80*_17x*:$BW/*d160x160*:Layouts/SequencesTest.*/*document2d*:Layouts/SequencesTest.*/*alibi_slopes*:Layouts/SequencesTest.*/*none_bf16*:Layouts/SequencesTest.*/*_p6_*:Layouts/SequencesTest.*/*d256x256*:SequencesValidation.*:Layouts/RaggedBackwardTest.*/*sliding*:Layouts/RaggedBackwardTest.*/*alibi_slopes*:$F/*16x3000_stridedcaps:$F/relative_bias_f16_d64x64_b2h4g1_1000x1000_stridedcaps:$BW/document_softcap_f16_d64x64_b1h4g4_1000x1000_stridedcaps:$F/key_keep_bias*:$F/key_pad_bias*_mma*:Layouts/SequencesTest.*/*key_keep_bias*:$BW/none_f16_d64x64_b1h4g2_300x1000_det"
# racecheck: the persistent forward with its CTAs capped, 4- and 8-warp configurations, with and without a score_mod; backward tiles of
# both families (64/64 and d128 configs), and every deterministic-mode case of both but the two of
# 33 key blocks (minutes under racecheck); the
# decoding kernel with forced splits and per-head tiles; the wgmma forward at 192/128 and 256/256;
# the Hopper backward at 96 and 48, its wide-head kernel at 256 (17 rows, det) and 64/256;
# ragged / paged prefill on both forward families; the ragged backward (TMA tiles beside a
# cp.async tail) on both Hopper kernels.
RACE="$F/*_ctas*:$F/*1000x1000_tile192x112*:$F/*tile192x128s2*:$BW/*det*:$BW/document_softcap_bf16_d64x64_b1h4g2_300x300:$BM/*det*:$BM/sliding_f16_d64x64_b2h4g4_1000x1000_mma:$BW/sliding_f16_d64x64_b2h4g4_1000x1000:$BW/prefix_lm_bf16_d128x64_b2h8g8_17x17:$BW/none_f16_d64x64_b1h8g8_17x17:$F/sliding_f16_d128x64_b2h4g2_17x4097_mma:$F/sliding_bf16_d64x128_b1h4g1_17x17:$F/none_f16_d64x64_b1h8g8_17x17:$F/causal_alibi_f16_d64x128_b2h4g1_17x1000:$F/dilated_bf16_d128x128_b1h2g1_1000x1000:$F/*splits7:$F/head_sliding_f16_d128x128_b2h8g4_3x5000:$F/causal_bf16_d192x128_b1h8g8_4097x4097:$F/causal_bf16_d256x256_b1h4g2_1000x1000_cpasync:$BW/*d96x96*1000x1000*:$BW/*d48x48*:$BW/*d256x256*17x*:$BW/*d64x256*:Layouts/SequencesTest.*/*document_softcap*:Layouts/SequencesTest.*/causal_bf16_d128x128*:Layouts/RaggedBackwardTest.*/*det*:Layouts/RaggedBackwardTest.*/causal_bf16_d128x128_h8g4*:Layouts/RaggedBackwardTest.*/causal_f16_d256*-$BW/*4097x4097_det:$BW/*300x4097_det:$BM/*4097x4097_det_mma:$BM/*300x4097_det_mma"
# The runner the device machine executes: the suite, then memcheck and racecheck on subsets.
cat > .device-build/bin/run-gpu-tests.sh <<RUNNER
#!/usr/bin/env bash
# Generated by scripts/gpu-test.sh. Run from the repository root on the GPU machine.
set -o pipefail
B=.device-build/bin/fajit_gpu_tests
OUT=\${OUT:-.device-build/out}; mkdir -p "\$OUT"
CS=\$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
export FAJIT_CACHE_DIR=\${FAJIT_CACHE_DIR:-/tmp/fajit-gpu-test-cache}
# Argument: suite | backward | backward-sm90 | backward-mma | rest | sanitizers | (none: suite
# and sanitizers). On a freshly started H200 (2026-11-29, every variant compiled cold) the
# backward cases take ~13.5 min: the Hopper ones with the ragged backward (\`backward-sm90\`)
# ~7, the mma.sync ones (\`backward-mma\`) ~6.5; the rest ~3.5; the sanitizers over 7
# (memcheck ~3, racecheck the rest). One run call (10 min at most) each for \`backward-sm90\`,
# \`backward-mma\`, \`rest\` and \`sanitizers\`.
WHAT="\${*:-suite sanitizers}"
has() { case " \$WHAT " in *" \$1 "*) return 0 ;; esac; return 1; }
nvidia-smi -L
rc=0
FILTER=
has suite && FILTER='*'
has backward && FILTER='*BackwardTest*'
has backward-sm90 && FILTER='Cases/BackwardTest*:Layouts/*Backward*'
has backward-mma && FILTER='MmaSync/BackwardTest*'
has rest && FILTER='-*BackwardTest*'
if [ -n "\$FILTER" ]; then
\$B --gtest_filter="\$FILTER" 2>&1 | tee "\$OUT/gpu.log" | grep -v '^\[       OK \]\|^\[ RUN      \]' || rc=1
echo "suite (\$FILTER) rc=\$rc"
fi
if has sanitizers; then
"\$CS" --tool memcheck --error-exitcode 9 \$B --gtest_filter='$SMALL' >"\$OUT/memcheck.log" 2>&1 || rc=1
grep -E 'ERROR SUMMARY|tests? ran|PASSED|FAILED' "\$OUT/memcheck.log"
"\$CS" --tool racecheck --error-exitcode 9 \$B --gtest_filter='$RACE' >"\$OUT/racecheck.log" 2>&1 || rc=1
grep -E 'RACECHECK SUMMARY|tests? ran|PASSED|FAILED' "\$OUT/racecheck.log"
fi
echo "overall rc=\$rc"
exit \$rc
RUNNER
chmod +x .device-build/bin/run-gpu-tests.sh

cat <<MSG
built .device-build/bin/fajit_gpu_tests and .device-build/bin/fajit (fajit_cli)
run on the GPU machine with the run tool (default kind), carry [".device-build/bin"] (bin/ is all
it needs; the build tree would overflow the 64 MiB limit), command:
  .device-build/bin/run-gpu-tests.sh
(the suite to \$OUT/gpu.log, then compute-sanitizer memcheck and racecheck over small subsets to
\$OUT/memcheck.log and \$OUT/racecheck.log; exit status non-zero if anything failed; ~15 min
together, over a run call's limit: \`run-gpu-tests.sh backward-sm90\`, \`backward-mma\`, \`rest\`
and \`sanitizers\` in four calls split them)
MSG
