#!/usr/bin/env bash
# One measurement on the lent H200, in one go: `bash results/h200/run.sh [STAGE...]` from the repo root, on the
# device, with `carry: ["voiceagent/v1", ".whl"]` (wheels listed in results/h200/README.md). Stages (default all):
#   ceilings  the services' own probe (voiceagent.serving.ceilings) in bfloat16 and float32
#   asr-engine    services/asr/benchmark.py on nemotron-0.6b, cuda: NeMo driven directly (the ceiling)
#   asr-service   the same through the gRPC service: cache-aware, then buffered
#   tts-eager     services/tts/benchmark.py on voxcpm2, cuda, eager
#   tts-compiled  the same with --compile (torch.compile + CUDA graphs)
# The whole run takes about 25 minutes: more than one 10-minute device call, so it was run in parts (README).
# Each benchmark runs under its own time limit so that a slow one leaves the others their turn; every line
# they print is kept under $OUT (at most 8 files come back).
set -u
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
stages=${*:-ceilings asr-engine asr-service tts-eager tts-compiled}
# Chunk sizes per ASR part (the 320 ms anchor first); overridable to finish a run that ran out of time.
ENGINE_CHUNKS=${ENGINE_CHUNKS:-320,80,160,560,1120}
CACHE_AWARE_CHUNKS=${CACHE_AWARE_CHUNKS:-320,80,160,560,1120}
BUFFERED_CHUNKS=${BUFFERED_CHUNKS:-320,80,160,560,1120}
# ASR: dtype of encoder/decoder/caches, and the capacity search (one try per probe, bisect to within 10 %)
ASR_DTYPE=${ASR_DTYPE:-bfloat16}
ASR_SEARCH=${ASR_SEARCH:---runs 1 --trials 1 --precision 0.1}
# TTS worker counts (each worker is one VoxCPM2 copy in its own process; compiled ones compile ~23 s each).
TTS_EAGER_WORKERS=${TTS_EAGER_WORKERS:-1,2,4,8}
TTS_COMPILED_WORKERS=${TTS_COMPILED_WORKERS:-1,2,4}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/svc .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/svc
# The benchmarks start services with .venv/<name>/bin/python; here every service runs in the image's python.
# A wrapper, not a symlink: a symlinked interpreter would not find the image's own venv (pyvenv.cfg) beside it.
for venv in asr tts; do
    mkdir -p .venv/$venv/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/$venv/bin/python
    chmod +x .venv/$venv/bin/python
done

{
    date -u; timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv
    python3 -c 'import torch, grpc, google.protobuf as p, nemo, voxcpm, transformers as t
print("torch", torch.__version__, "cuda", torch.version.cuda, "grpcio", grpc.__version__, "protobuf", p.__version__,
      "nemo", nemo.__version__, "transformers", t.__version__, "tf32 matmul", torch.backends.cuda.matmul.allow_tf32)'
    nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

for stage in $stages; do
    case $stage in
    ceilings)
        python3 - >"$OUT/ceilings.json" 2>"$OUT/ceilings.err" <<'PY'
import dataclasses, json
from voiceagent.serving.ceilings import measure_ceilings
print(json.dumps([dataclasses.asdict(measure_ceilings("cuda", dtype, budget_s=6.0)) for dtype in
                  ("bfloat16", "float16", "float32", "bfloat16", "float32")], indent=1))
PY
        cat "$OUT/ceilings.json" "$OUT/ceilings.err"
        ;;
    asr-engine) # NeMo's own batched loop, no gRPC: the ceiling
        timeout "${ASR_ENGINE_S:-200}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype "$ASR_DTYPE" --threads 8 --only engine --max-streams 2048 --chunks "$ENGINE_CHUNKS" $ASR_SEARCH \
            2>&1 | tee -a "$OUT/asr_engine.txt"
        ;;
    asr-service) # the gRPC service, cache-aware then buffered; float32 if the dtype asked for fails to start
        for backend in ${ASR_BACKENDS:-cache-aware buffered}; do
            chunks=$CACHE_AWARE_CHUNKS limit=${ASR_CACHE_AWARE_S:-240}
            [ $backend = buffered ] && chunks=$BUFFERED_CHUNKS limit=${ASR_BUFFERED_S:-150}
            for dtype in "$ASR_DTYPE" float32; do
                timeout "$limit" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda --dtype "$dtype" \
                    --threads 8 --only $backend --max-streams 2048 --chunks "$chunks" $ASR_SEARCH 2>&1 \
                    | tee -a "$OUT/asr_$backend.txt"
                grep -q "service $backend" "$OUT/asr_$backend.txt" && break
            done
        done
        ;;
    tts-eager)
        timeout 240 python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 2 --rounds 5 \
            --workers "$TTS_EAGER_WORKERS" --requests 2 2>&1 | tee "$OUT/tts_eager.txt"
        ;;
    tts-compiled) # torch.compile + CUDA graphs; every worker compiles its own copy (~23 s each)
        timeout 280 python3 -m services.tts.benchmark --preset voxcpm2 --device cuda --threads 2 --rounds 5 \
            --compile --workers "$TTS_COMPILED_WORKERS" --requests 2 2>&1 | tee "$OUT/tts_compiled.txt"
        ;;
    esac
done
date -u
