#!/usr/bin/env bash
# The main job (`make run DEVICE=cuda` = `python -m loadgen run --device cuda`) on the lent H200, in parts: one
# device call lasts at most 10 minutes and carries at most 64 MiB, so the run is split into stages that each fit a
# call, and what the image lacks travels beside the tree (results/h200/README.md, "Main job"). From a copy of the
# repo root on the device (a tree without .venv; the carried folders beside it, see the variables below):
#   bash results/h200/main_job.sh STEP...
# Steps, in the order the calls make them (calls back to back: a machine keeps /tmp only while warm):
#   unpack N   vLLM 0.26 part N (results/h200/llm.sh unpack; parts from `llm.sh pack`, checked against
#              results/h200/vllm026.sha256) into /tmp/site once all parts are there
#   env        the device, the image's and the carried packages' versions -> $OUT/env.txt
#   llm asr tts voice peer
#              one stage each: `python -m loadgen run --device cuda --only STAGE --folder /tmp/runs/STAGE`
#              under its own time limit; its folder comes back as $OUT/STAGE.tar.gz (no requests.jsonl),
#              its output as $OUT/STAGE.log
# The parts are joined here afterwards: `python -m loadgen combine --into results/h200/run PART...`.
set -u
OUT=${OUT:-/tmp/h200-out}
RUNS=${RUNS:-/tmp/runs}
LOADGEN_WHEELS=${LOADGEN_WHEELS:-../lg}     # Locust and its needs, `vllm serve`'s needs beyond the vLLM bundle
SERVICE_WHEELS=${SERVICE_WHEELS:-../../../.whl} # NeMo, VoxCPM, grpcio 1.85.3 ... (results/h200/README.md)
# Seconds per stage; a stage over its limit is stopped and what it wrote so far still comes back.
declare -A LIMIT=([llm]=${LLM_S:-540} [asr]=${ASR_S:-280} [tts]=${TTS_S:-280} [voice]=${VOICE_S:-240}
    [peer]=${PEER_S:-560})
mkdir -p "$OUT" "$RUNS"

# The image's python runs everything: the services through their `.venv/<name>/bin/python` (wrappers, not
# symlinks, so the image's own venv is still found) and the load generator with its Locust workers.
for venv in asr llm tts dev; do
    mkdir -p .venv/$venv/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/$venv/bin/python
    chmod +x .venv/$venv/bin/python
done
install() { # $1 wheel folder, $2 target: once per warm machine
    [ -f "$2/.complete" ] && return 0
    [ -d "$1" ] || { echo "wheels not carried: $1"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" "$1"/*.whl \
        && touch "$2/.complete"
}
# vLLM's GPU sampler imports FlashInfer (not shipped) unless told not to; nothing is fetched from a hub. No vLLM plugins:
# NeMo (in /tmp/svc) registers one, and its import in vLLM's engine core left CUDA unable to start there (session 21,
# results/h200/README.md §4f).
export PYTHONPATH=/tmp/site:/tmp/lg:/tmp/svc:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_PLUGINS= TQDM_DISABLE=1

stage() { # $1 = llm | asr | tts | voice | peer; its outputs are named $1$TAG
    local name=$1${TAG:-}
    install "$LOADGEN_WHEELS" /tmp/lg || return 1
    case $1 in asr | tts | voice) install "$SERVICE_WHEELS" /tmp/svc || return 1 ;; esac
    case $1 in llm | voice | peer) [ -f /tmp/site/.vllm026-complete ] || { echo "vLLM not unpacked"; return 1; } ;; esac
    rm -rf "${RUNS:?}/$name"
    echo "== $name $(date -u +%T), limit ${LIMIT[$1]} s, LOADGEN_ASR_ARGS=${LOADGEN_ASR_ARGS:-}" | tee -a "$OUT/stages.txt"
    timeout -k 20 "${LIMIT[$1]}" python3 -m loadgen run --device cuda --only "$1" --folder "$RUNS/$name" \
        >"$OUT/$name.log" 2>&1
    echo "== $name exit $? $(date -u +%T)" | tee -a "$OUT/stages.txt"
    grep -v "^\[NeMo\|Warning\|warn(" "$OUT/$name.log" | tail -40
    tar -C "$RUNS" --exclude=requests.jsonl -czf "$OUT/$name.tar.gz" "$name"
}

for step in "$@"; do
    case $step in
    unpack) ;; # its number follows
    [0-9]) VLLM_PARTS_DIR=../p$step bash results/h200/llm.sh unpack "$step" 2>&1 | tee -a "$OUT/stages.txt" ;;
    env)
        install "$LOADGEN_WHEELS" /tmp/lg
        {
            date -u
            timeout -k 5 30 nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,power.limit,driver_version \
                --format=csv
            nproc
            timeout 120 python3 -c 'import torch, grpc, google.protobuf as p, locust, gevent, transformers as t
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "grpcio", grpc.__version__,
      "protobuf", p.__version__, "locust", locust.__version__, "gevent", gevent.__version__, "transformers", t.__version__)
try:
    import vllm; print("vllm", vllm.__version__)
except Exception as error: print("vllm:", error)'
        } >"$OUT/env.txt" 2>&1
        cat "$OUT/env.txt"
        ;;
    llm | asr | tts | voice | peer) stage "$step" ;;
    *) echo "unknown step $step" ;;
    esac
done
