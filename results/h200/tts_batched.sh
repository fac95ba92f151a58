#!/usr/bin/env bash
# The batched TTS engine on the lent H200, one device call: from a copy of the repo root on the device
# (carry .stage/tts, which holds voiceagent/v1, and .whl), `WHL=../../.whl bash results/h200/tts_batched.sh`.
#   1. results/h200/tts_graph_check.py: graph replay vs eager step (tiny preset), capture time
#   2. bench-tts on voxcpm2 (bf16 model, float32 VAE): the batched service (CUDA graphs per batch bucket,
#      captured at start-up) and the batched engine in-process, C = 1..256; pool and direct are not rerun
#      here (their H200 numbers: results/h200/README.md section 3).
# CLIENT_PROCESSES: client processes of bench-tts (default 4: the 16-core machine's clients are not the limit);
# CHECK_S=0 leaves step 1 out; BENCH_ARGS adds benchmark flags (e.g. "--compile --vae-dtype bfloat16"), SKIP the paths
# left out (default pool,direct), LEVELS the concurrency levels. TREE runs the benchmark of another tree (e.g. .tbase
# from `python -m results.h200.bundles base REV --dest .tbase`, carried too) with the same wheels, TAG names its output
# (tts_batched$TAG.txt): two calls, TREE=.tbase TAG=_base and TAG=_here, compare a revision with this one on one machine.
set -u
# shellcheck source=results/h200/tts_device_env.sh
. results/h200/tts_device_env.sh
[ "${CHECK_S:-90}" = 0 ] ||
    timeout "${CHECK_S:-90}" python3 results/h200/tts_graph_check.py tiny 2>&1 | grep -v -i "warn" | tee "$OUT/tts_graph_check.txt"
if [ "${TREE:-.}" != . ]; then # that tree's code, the image's python as its .venv/tts (tts_device_env.sh made ours)
    mkdir -p "$TREE/.venv/tts/bin" && cp .venv/tts/bin/python "$TREE/.venv/tts/bin/python" || exit 1
    cd "$TREE" || exit 1
    export PYTHONPATH=/tmp/svc:$PWD
fi
# shellcheck disable=SC2086 # BENCH_ARGS are words, e.g. "--compile --vae-dtype bfloat16"
timeout "${BENCH_S:-330}" python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 4 \
    --concurrency "${LEVELS:-1,2,4,8,16,32,64,128,256}" --requests 2 --skip "${SKIP:-pool,direct}" \
    --cache-positions 512 --client-processes "${CLIENT_PROCESSES:-4}" ${BENCH_ARGS:-} 2>&1 | grep -v -i "warn" | tee "$OUT/tts_batched${TAG:-}.txt"
date -u
