#!/usr/bin/env bash
# `make setup DEVICE=cuda`: our stubs need protobuf >= 7.35.1 (requirements/serving.txt pins 7.36.2); vLLM 0.26's
# nvidia-cutlass-dsl pins protobuf < 7, so the resolution brought 6.x. Put 7.36.2 back, with the gRPC health and
# reflection packages that need it (see requirements-cuda.txt).
set -euo pipefail
python=$1
log=$(mktemp)
if ! "$python" -m pip install -q --no-deps protobuf==7.36.2 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 \
    >"$log" 2>&1; then
    grep -v "is ignored" "$log"
    exit 1
fi
rm -f "$log"
"$python" -c "import google.protobuf, grpc, grpc_health, grpc_reflection, vllm" \
    || { echo "post_install: protobuf/grpc/vllm do not import" >&2; exit 1; }
