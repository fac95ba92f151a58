#!/usr/bin/env bash
# Issue 16 on the lent H200, one device call of < 5 minutes: where the batched TTS step's time goes
# (results/h200/tts_profile.py: voxcpm2 preset, bf16 model, float32 VAE; the graph-replayed step timed, then the
# same step eagerly under torch.profiler by phase and kernel class). From the repo root on the device, carry
# `.whl` (voxcpm and its needs, grpcio 1.85) and `voiceagent/v1`: `bash results/h200/tts_profile.sh`.
# BATCHES (default 128,16) picks the batch sizes; VARIANTS (e.g. base,fold,compile,compile-math,vae-bf16) times the
# engine's speed-ups one after another first (tts_profile.py --variants; SWEEP_ONLY=1: only that); outputs go to $OUT (env.txt, tts_profile.txt).
set -u
# shellcheck source=results/h200/tts_device_env.sh
. results/h200/tts_device_env.sh
timeout -k 10 "${PROFILE_S:-260}" python3 results/h200/tts_profile.py --batch "${BATCHES:-128,16}" \
    --variants "${VARIANTS:-}" ${SWEEP_ONLY:+--sweep-only} 2>&1 \
    | grep -v -i "warn" | tee "$OUT/tts_profile.txt"
date -u
