#!/usr/bin/env bash
# Issue 18 on the lent H200: several gRPC front ends per vLLM engine core (`--frontends`), against engine-direct
# and against `vllm serve --api-server-count 4`. Same vLLM 0.26 bundle and set-up as results/h200/llm.sh: run its `unpack` calls first (back to back),
# then, from the repo root on the device, one stage per call (each under its own `timeout`, output in $OUT):
#   bash results/h200/llm_frontends.sh STAGE...
#     bench-0.6b-fe1  bench-0.6b-fe4  bench-8b-fe1  bench-8b-fe4
#         services/llm/benchmark.py (engine-direct vs the service, alternating rounds) at C = 1 16 64 256,
#         with the service's --frontends 1 or 4 (one client channel per worker, so connections spread)
#     serve-0.6b  serve-8b
#         `vllm serve --api-server-count 4` on the same preset and engine settings (services/llm/serve_args.py),
#         measured by vLLM's own client (`vllm bench serve`, random prompts of 64 tokens, 128 new, ignore_eos)
#         at max concurrency 1 16 64 256: its TTFT and output tokens/s, beside the service's
# BENCH_ARGS: more benchmark flags for both engines, e.g. "--max-num-batched-tokens 2048" (the step budget); ROUNDS:
# alternating rounds per level (default 2; at 256 two rounds of the 8B spread by 40-76 ms, README §4c).
# PIN_ENGINE=N: every vLLM engine core (a process holding the GPU, as nvidia-smi lists them) on host CPUs 0..N-1 and
# every other python3 process (the benchmark, its client processes, the service's front ends) on the rest, re-applied
# every 0.5 s as processes start: does host contention slow the engine core's steps (README §4h)? TAG names the outputs.
# Targets (issue 18): service >= 97 % of engine-direct tokens/s at every concurrency, TTFT p50 added <= 5 ms at 256.
set -u
OUT=${OUT:-/tmp/h200-out}
ROOT=${VLLM_H200_ROOT:-/tmp}
SITE=$ROOT/site
HERE=results/h200
SERVE_WHEELS=${SERVE_WHEELS:-.lg} # uvicorn, prometheus-fastapi-instrumentator, partial-json-parser, watchfiles,
# model-hosting-container-standards, jmespath, supervisor, opentelemetry-api (pip download --only-binary, cp312)
mkdir -p "$OUT"

setup() {
    [ -f "$SITE/.vllm026-complete" ] || { echo "$SITE is not complete: run results/h200/llm.sh unpack first"; return 1; }
    # what `vllm serve` imports beyond the bundle and the image (uvicorn & co.), carried as wheels in $SERVE_WHEELS
    if [ -d "$SERVE_WHEELS" ] && [ ! -f /tmp/serve-site/.complete ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/serve-site \
            "$SERVE_WHEELS"/*.whl && touch /tmp/serve-site/.complete
    fi
    # VLLM_PLUGINS empty: no plugin of another engine's wheels (NeMo registers one) is imported into vLLM (§4f)
    export PYTHONPATH=$SITE:/tmp/serve-site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
        TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_PLUGINS=
    # The benchmark starts the service with .venv/llm/bin/python: the image's python, as in llm.sh.
    mkdir -p .venv/llm/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/llm/bin/python
    chmod +x .venv/llm/bin/python
}

pin() { # $1 engine cores' CPU count: re-pin every 0.5 s until killed (engine cores appear and go with each stage)
    local engine=$1 last seen=" "
    last=$(($(nproc --all) - 1))
    command -v taskset >/dev/null || { echo "no taskset here: nothing pinned"; return 1; }
    while sleep 0.5; do
        local gpu
        gpu=" $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr '\n' ' ') "
        for pid in $(pgrep -x python3); do
            if [[ $gpu == *" $pid "* ]]; then
                taskset -acp "0-$((engine - 1))" "$pid" >/dev/null 2>&1
                [[ $seen == *" $pid "* ]] || { seen+="$pid "; echo "engine core $pid: $(taskset -cp "$pid")"; }
            else
                taskset -acp "$engine-$last" "$pid" >/dev/null 2>&1
            fi
        done
    done
}

bench() { # $1 preset, $2 front ends, $3 time limit (s)
    local preset=$1 frontends=$2 limit=$3 pinner=
    if [ -n "${PIN_ENGINE:-}" ]; then
        pin "$PIN_ENGINE" &
        pinner=$!
        echo "engine cores pinned to CPUs 0-$((PIN_ENGINE - 1)), other python3 processes to the rest"
    fi
    # shellcheck disable=SC2086 # BENCH_ARGS are words
    timeout -k 10 "$limit" python3 -m services.llm.benchmark --preset "$preset" --device cuda \
        --gpu-memory-utilization 0.4 --max-in-flight 256 --concurrency 1 16 64 256 --rounds "${ROUNDS:-2}" \
        --prompt-tokens 64 --max-tokens 128 --frontends "$frontends" ${BENCH_ARGS:-} 2>&1 |
        tee "$OUT/llm_frontends_bench_${preset}_fe$frontends${TAG:-}.txt"
    [ -z "$pinner" ] || kill "$pinner" 2>/dev/null
}

serve() { # $1 preset, $2 time limit (s): vllm serve --api-server-count 4 and vLLM's own load client
    local preset=$1 limit=$2 port=18000
    local log=$OUT/llm_frontends_vllm_serve_$preset.log
    local flags
    # serve_args describes the CPU default's engine: its explicit KV-cache size is dropped, so that on the GPU the
    # cache is what --gpu-memory-utilization leaves, as for the service's engine in the benchmark (0.4 each).
    flags=$(python3 -m services.llm.serve_args "$preset" --device cuda | tail -1 | python3 -c 'import json, sys
flags = json.load(sys.stdin)["flags"]
for name in ("--kv-cache-memory-bytes", "--gpu-memory-utilization", "--max-num-seqs"):  # set below
    if name in flags:
        at = flags.index(name)
        del flags[at : at + 2]
print(" ".join(flags))')
    # shellcheck disable=SC2086 # flags are words
    timeout -k 10 "$limit" python3 -m vllm.entrypoints.cli.main serve $flags --port $port --api-server-count 4 \
        --max-num-seqs 256 --gpu-memory-utilization 0.4 >"$log" 2>&1 &
    local server=$!
    for _ in $(seq 300); do
        python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/v1/models', timeout=2)" \
            2>/dev/null && break
        kill -0 $server 2>/dev/null || { echo "vllm serve exited; tail of $log:"; tail -30 "$log"; return 1; }
        sleep 1
    done
    local model
    model=$(echo "$flags" | sed -n 's/.*--served-model-name \([^ ]*\).*/\1/p')
    local tokenizer
    tokenizer=$(echo "$flags" | sed -n 's/.*--tokenizer \([^ ]*\).*/\1/p')
    [ -n "$tokenizer" ] || tokenizer=$(echo "$flags" | sed -n 's/.*--model \([^ ]*\).*/\1/p') # the staged model folder holds it
    for concurrency in 1 16 64 256; do
        echo "== vllm serve --api-server-count 4, $preset, max concurrency $concurrency"
        timeout -k 5 120 python3 -m vllm.entrypoints.cli.main bench serve --backend vllm \
            --base-url "http://127.0.0.1:$port" --model "$model" --tokenizer "$tokenizer" \
            --dataset-name random --random-input-len 64 --random-output-len 128 --ignore-eos \
            --max-concurrency "$concurrency" --num-prompts $((concurrency * 4 > 64 ? concurrency * 4 : 64)) \
            --percentile-metrics ttft,itl,e2el --metric-percentiles 50,99
    done 2>&1 | tee "$OUT/llm_frontends_vllm_serve_$preset.txt"
    kill $server 2>/dev/null
    wait $server 2>/dev/null
}

setup || exit 1
{ date -u; lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA node|Model name)"; } | tee "$OUT/llm_frontends_env.txt"
for stage in "$@"; do
    echo "== $stage $(date -u +%T)"
    case $stage in
    bench-0.6b-fe1) bench qwen3-0.6b 1 480 ;;
    bench-0.6b-fe4) bench qwen3-0.6b 4 480 ;;
    bench-8b-fe1) bench qwen3-8b 1 540 ;;
    bench-8b-fe4) bench qwen3-8b 4 540 ;;
    serve-0.6b) serve qwen3-0.6b 540 ;;
    serve-8b) serve qwen3-8b 540 ;;
    *) echo "unknown stage $stage" ;;
    esac
done
date -u
