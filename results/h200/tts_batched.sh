#!/usr/bin/env bash
# The batched TTS engine on the lent H200, one device call: from a copy of the repo root on the device
# (carry .stage/tts, which holds voiceagent/v1, and .whl), `WHL=../../.whl bash results/h200/tts_batched.sh`.
#   1. results/h200/tts_graph_check.py: graph replay vs eager step (tiny preset), capture time
#   2. bench-tts on voxcpm2 (bf16 model, float32 VAE): the batched service (CUDA graphs per batch bucket,
#      captured at start-up) and the batched engine in-process, C = 1..256; pool and direct are not rerun
#      here (their H200 numbers: results/h200/README.md section 3).
set -u
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
mkdir -p .venv/tts/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/tts/bin/python
chmod +x .venv/tts/bin/python
{
    date -u; timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
    python3 -c 'import torch, grpc, voxcpm; print("torch", torch.__version__, "grpcio", grpc.__version__)'; nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout "${CHECK_S:-90}" python3 results/h200/tts_graph_check.py tiny 2>&1 | grep -v -i "warn" | tee "$OUT/tts_graph_check.txt"
timeout "${BENCH_S:-330}" python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 4 \
    --concurrency "${LEVELS:-1,2,4,8,16,32,64,128,256}" --requests 2 --skip pool,direct \
    --cache-positions 512 2>&1 | grep -v -i "warn" | tee "$OUT/tts_batched.txt"
date -u
