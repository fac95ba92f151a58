#!/usr/bin/env bash
# Issue 17 on the lent H200: the ASR step as CUDA graphs. `bash results/h200/asr_graphs.sh STAGE...` from the repo
# root on the device, with carry [".asrwhl", "voiceagent/v1"] and WHL=.asrwhl (the NeMo wheels of ENGINE_NOTES, grpcio,
# py-spy, and pytest with its dependencies for the tests stage: results/h200/README.md v8; rebuilt by
# `python -m results.h200.bundles whl --dest .asrwhl`, "Repeat"). Stages:
#   check  results/h200/asr_graph_check.py: nemotron-0.6b, 320 ms, buckets to 2048: graph vs eager, step times
#   tests  tests/asr/test_cuda_graphs.py (graphs on vs padded eager vs eager; fastconformer-small, bf16)
#   bench  services/asr/benchmark.py at $CHUNKS: NeMo's own loop vs the service with graphs (ONLY=engine,cache-aware,
#          buffered adds the buffered service), 4 client processes
#   table  one row of the table at $CHUNKS: NeMo's loop and the service ($START, $LIMIT), then the buffered
#          service ($BUF_START, $BUF_LIMIT), with $SEARCH (e.g. the paced search of v8)
#   service  the service with graphs alone (no engine-direct), the same search
#   bench-eager  the service with --cuda-graphs false, the same search
#   compare  results/h200/asr_compare.py: this tree against the base tree $BASE (default .base), paced real-time
#            streams (issue 17's capacity: per-chunk latency p95 < the chunk), 8 client processes, interleaved
#            (both services up at once: with graphs to 3,328 rows each took 64-74 GiB, which two do not fit on an
#            H200, session 21; LIMIT=2816 there, or one tree at a time on one machine: BUILDS=base TAG=_base, then
#            BUILDS=here TAG=_here, each search alone, minutes apart)
#   profile  results/h200/asr_profile.py: the steady step at $BATCHES rows, as served and profiled by phase x class
#   split  results/h200/asr_cpu_split.py --paced at $STREAMS, 8 client processes, py-spy of every service process
#          (folded stacks, tarred into $OUT/asr_spy$TAG.tgz: a call brings back at most 8 files)
# SERVICE_ARGS adds service flags (e.g. "--step-policy clocked --frontends 4"). Every stage has its own time limit;
# outputs go to $OUT (a stage's file name ends in $TAG when set). The wheels go to /tmp/svc, not vLLM's /tmp/site: NeMo
# registers a vLLM plugin, and with it beside vLLM the LLM's engine core could not start CUDA (session 21).
set -u
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT"
CHUNKS=${CHUNKS:-320}
SEARCH=${SEARCH:---runs 1 --trials 1 --precision 0.1 --clients 4 --threads 8}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/svc PATH=/tmp/svc/bin:$PATH
if [ ! -d /tmp/svc/nemo ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/svc ${WHL:-.whl}/*.whl || exit 1
fi
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/svc wheels/test/*.whl
mkdir -p .venv/asr/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/asr/bin/python
chmod +x .venv/asr/bin/python
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader; nproc; grep -m1 "model name" /proc/cpuinfo; git log -1 --format=%H 2>/dev/null; } \
    >>"$OUT/env.txt" 2>&1

# The services' logs are kept (launcher: VOICEAGENT_KEEP_LOGS) and each stage's are tarred into $OUT: session 17's
# 2,048-stream probes lost streams with CANCELLED and nothing on the device said why once the machine was gone.
export VOICEAGENT_KEEP_LOGS=1
LOGS=$(python3 -c 'from voiceagent.serving.tempdirs import shared_temp; print(shared_temp())')
keep_logs() { # $1 = stage
    local logs
    logs=$(cd "$LOGS" && ls asr-*.log 2>/dev/null)
    [ -n "$logs" ] || return 0
    (cd "$LOGS" && tar -czf "$OUT/logs_$1${TAG:-}.tgz" $logs && rm -f $logs)
}
for stage in "$@"; do
    echo "== $stage $(date -u +%T)" | tee -a "$OUT/stages.txt"
    case $stage in
    check)
        timeout -k 5 "${CHECK_S:-170}" python3 -m results.h200.asr_graph_check --preset nemotron-0.6b --chunk-ms 320 \
            --max-streams 2048 2>&1 | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_graph_check.txt"
        ;;
    tests)
        timeout -k 5 "${TESTS_S:-330}" python3 -m pytest tests/asr/test_cuda_graphs.py -v -s -rs -p no:cacheprovider 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_cuda_graph_tests.txt"
        ;;
    bench)
        timeout -k 5 "${BENCH_S:-330}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype bfloat16 --only "${ONLY:-engine,cache-aware}" --chunks "$CHUNKS" --max-streams "${LIMIT:-4096}" \
            --start-streams "${START:-1024}" $SEARCH --service-args "--graph-chunks $CHUNKS ${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_graphs_bench_${CHUNKS//,/-}${TAG:-}.txt"
        ;;
    table)  # one row of issue 17's table at $CHUNKS: NeMo's loop and the service interleaved, then buffered alone
        # (a buffered probe far past its capacity would run for minutes: it searches from its own $BUF_START)
        timeout -k 5 "${TABLE_S:-200}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype bfloat16 --only engine,cache-aware --chunks "$CHUNKS" --max-streams "${LIMIT:-3328}" \
            --start-streams "${START:-1024}" $SEARCH --service-args "--graph-chunks $CHUNKS ${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_table_$CHUNKS${TAG:-}.txt"
        timeout -k 5 "${BUF_S:-120}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype bfloat16 --only buffered --chunks "$CHUNKS" --max-streams "${BUF_LIMIT:-1024}" \
            --start-streams "${BUF_START:-128}" $SEARCH --service-args "${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee -a "$OUT/asr_table_$CHUNKS${TAG:-}.txt"
        ;;
    service)
        timeout -k 5 "${BENCH_S:-330}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype bfloat16 --only cache-aware --chunks "$CHUNKS" --max-streams "${LIMIT:-4096}" \
            --start-streams "${START:-512}" $SEARCH --service-args "--graph-chunks $CHUNKS ${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_graphs_service_$CHUNKS${TAG:-}.txt"
        ;;
    bench-eager)
        timeout -k 5 "${BENCH_S:-330}" python3 -m services.asr.benchmark --preset nemotron-0.6b --device cuda \
            --dtype bfloat16 --only cache-aware --chunks "$CHUNKS" --max-streams "${LIMIT:-4096}" \
            --start-streams "${START:-512}" $SEARCH --service-args "--cuda-graphs false ${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_eager_bench_$CHUNKS${TAG:-}.txt"
        ;;
    compare)
        timeout -k 5 "${COMPARE_S:-300}" python3 -m results.h200.asr_compare --base "${BASE:-.base}" --chunks "$CHUNKS" --builds "${BUILDS:-base,here}" \
            --max-streams "${LIMIT:-3072}" --start-streams "${START:-1024}" --service-args "${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_compare_$CHUNKS${TAG:-}.txt"
        ;;
    profile)
        timeout -k 5 "${PROFILE_S:-150}" python3 -m results.h200.asr_profile --chunk-ms "$CHUNKS" \
            --batch "${BATCHES:-1024,2048}" 2>&1 | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" \
            | tee "$OUT/asr_profile_$CHUNKS${TAG:-}.txt"
        ;;
    split)
        timeout -k 5 "${SPLIT_S:-170}" python3 -m results.h200.asr_cpu_split --chunk-ms "$CHUNKS" --streams \
            "${STREAMS:-1024}" --clients 8 --paced --clip-s 6.4 --py-spy /tmp/asr_spy \
            --service-args "--graph-chunks $CHUNKS ${SERVICE_ARGS:-}" 2>&1 \
            | grep -av "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason" | tee "$OUT/asr_split_$CHUNKS${TAG:-}.txt"
        tar -C /tmp -czf "$OUT/asr_spy_$CHUNKS${TAG:-}.tgz" asr_spy && rm -rf /tmp/asr_spy
        ;;
    esac
    keep_logs "$stage"
done
echo "== done $(date -u +%T)" | tee -a "$OUT/stages.txt"
