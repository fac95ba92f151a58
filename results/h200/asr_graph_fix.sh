#!/usr/bin/env bash
# Issue 17, the graph crash of the H200 main job: bisect the capture set-up, run the GPU tests, then the service
# with graphs vs eager at a few levels. One device call, from the stage folder (carry ".stage/asrgraph", ".whl",
# "voiceagent/v1"): `cd .stage/asrgraph && WHL=../../.whl bash results/h200/asr_graph_fix.sh`. Outputs in $OUT:
#   env.txt, asr_graph_bisect.txt (results/h200/asr_graph_bisect.py, one process per variant, side by side),
#   asr_cuda_graph_tests.txt (tests/asr/test_cuda_graphs.py, at the same time), asr_graph_levels.txt
#   (results/h200/asr_graph_levels.py; with --graph-first-steps false if the current code's variant failed).
set -u
OUT=${OUT:-/tmp/h200-out}
mkdir -p "$OUT" /tmp/bisect
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/svc:$PWD
started=$(date +%s)
stamp() { echo "== $1 at $(($(date +%s) - started)) s" | tee -a "$OUT/env.txt"; }
quiet() { grep --line-buffered -v "^\[NeMo\|^ *Loss\|^ *Cuda\|^ *Reason\|OneLogger\|exporters\|telemetry"; }
if [ ! -d /tmp/svc/nemo ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/svc "${WHL:-.whl}"/*.whl \
        2>&1 | tail -3
fi
mkdir -p .venv/asr/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >.venv/asr/bin/python
chmod +x .venv/asr/bin/python
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
  python3 -c 'import torch; print("torch", torch.__version__)'; } >>"$OUT/env.txt" 2>&1
stamp installed

for variant in eager padded before before-steady before-first fixed; do
    timeout -k 5 "${BISECT_S:-120}" python3 -m results.h200.asr_graph_bisect --variant "$variant" \
        >"/tmp/bisect/$variant.txt" 2>&1 &
done
timeout -k 5 "${TESTS_S:-130}" python3 -m pytest tests/asr/test_cuda_graphs.py -v -s -rs -p no:cacheprovider 2>&1 \
    | quiet >"$OUT/asr_cuda_graph_tests.txt" &
wait
stamp "bisect and tests done"
{
    grep -h "^RESULT" /tmp/bisect/*.txt
    for f in /tmp/bisect/*.txt; do echo "--- $f (tail)"; quiet <"$f" | tail -25; done
} >"$OUT/asr_graph_bisect.txt"
grep -h "^RESULT" /tmp/bisect/*.txt

GRAPH_ARGS=""
grep -q "^RESULT fixed ok" /tmp/bisect/fixed.txt || GRAPH_ARGS="--graph-first-steps false"
left=$((${END_S:-255} - $(date +%s) + started))
[ "$left" -gt 20 ] || left=20
echo "levels with graph args: '$GRAPH_ARGS', $left s" | tee -a "$OUT/env.txt"
timeout -k 5 "$left" python3 -m results.h200.asr_graph_levels --levels "${LEVELS:-1,64,512}" \
    --graph-args "$GRAPH_ARGS" 2>&1 | quiet >"$OUT/asr_graph_levels.txt"
grep "^LEVEL\|SERVING" "$OUT/asr_graph_levels.txt"
stamp done
