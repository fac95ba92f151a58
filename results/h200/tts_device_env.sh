# Sourced by the TTS stages on the lent H200 (tts_batched.sh, tts_profile.sh): the carried wheels installed into
# /tmp/svc (WHL, default .whl: voxcpm and its needs, grpcio 1.85), the environment the TTS code runs in, the
# image's python as .venv/tts's, and what the machine and its packages are ($OUT/env.txt).
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
WHL=${WHL:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/svc "$WHL"/*.whl || exit 1
export PYTHONPATH=/tmp/svc:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
mkdir -p .venv/tts/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/tts/bin/python
chmod +x .venv/tts/bin/python
{
    date -u; timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
    python3 -c 'import torch, grpc, voxcpm; print("torch", torch.__version__, "grpcio", grpc.__version__)'; nproc; grep -m1 "model name" /proc/cpuinfo
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
