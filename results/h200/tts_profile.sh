#!/usr/bin/env bash
# Issue 16 on the lent H200, one device call of < 5 minutes: where the batched TTS step's time goes
# (results/h200/tts_profile.py: voxcpm2 preset, bf16 model, float32 VAE; the graph-replayed step timed, then the
# same step eagerly under torch.profiler by phase and kernel class). From the repo root on the device, carry
# `.whl` (voxcpm and its needs, grpcio 1.85) and `voiceagent/v1`: `bash results/h200/tts_profile.sh`.
# BATCHES (default 128,16) picks the batch sizes; outputs go to $OUT (env.txt, tts_profile.txt).
set -u
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
{
    date -u; timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
    python3 -c 'import torch, grpc, voxcpm; print("torch", torch.__version__, "grpcio", grpc.__version__)'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout -k 10 "${PROFILE_S:-260}" python3 results/h200/tts_profile.py --batch "${BATCHES:-128,16}" 2>&1 \
    | grep -v -i "warn" | tee "$OUT/tts_profile.txt"
date -u
