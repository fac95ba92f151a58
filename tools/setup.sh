#!/usr/bin/env bash
# `make setup`: the dev venv first (it generates protos), then the service venvs in parallel
# (pip is mostly waiting on downloads and unpacking; three at once take little longer than the largest).
# DEVICE=cuda (`make setup DEVICE=cuda`): the services from their requirements-cuda.txt, the engines' CUDA builds.
set -uo pipefail
cd "$(dirname "$0")/.."
services=("$@")
device=${DEVICE:-cpu}
case $device in
cpu) variant="" ;;
cuda) variant="-cuda" ;;
*) echo "DEVICE=$device: expected cpu or cuda" >&2; exit 2 ;;
esac
tools/make_venv.sh dev requirements/dev.txt || exit 1
mkdir -p .venv/logs
for service in "${services[@]}"; do
    tools/make_venv.sh "$service" "services/$service/requirements$variant.txt" >".venv/logs/$service.log" 2>&1 &
    eval "pid_$service=$!"
done
failed=0
for service in "${services[@]}"; do
    pid_var="pid_$service"
    wait "${!pid_var}" || failed=1
    cat ".venv/logs/$service.log"
done
exit $failed
