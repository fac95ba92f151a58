#!/usr/bin/env bash
# Start the three services on their CPU presets and default ports, wait for SERVING, keep them until Ctrl-C.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p reports/logs
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null; wait; echo "services stopped"; }
trap stop EXIT INT TERM
for service in asr llm tts; do
    .venv/$service/bin/python -u -m services.$service >"reports/logs/$service.log" 2>&1 &
    pids+=($!)
    echo "$service: starting (log: reports/logs/$service.log)"
done
for service in asr llm tts; do
    until grep -q "$service: SERVING" "reports/logs/$service.log"; do
        sleep 1
        if ! kill -0 "${pids[@]}" 2>/dev/null; then echo "a service exited; see reports/logs/"; exit 1; fi
    done
    grep "gRPC listening" "reports/logs/$service.log"
done
echo "all services SERVING; Ctrl-C stops them"
wait
