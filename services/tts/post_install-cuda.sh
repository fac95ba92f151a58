#!/usr/bin/env bash
# `make setup DEVICE=cuda`: voxcpm without its declared dependencies (gradio, funasr, modelscope, ... serve its web
# demo and training; requirements-cuda.txt lists what inference imports). torchaudio 2.11.0 matches torch 2.11.0
# here, so nothing is removed (compare post_install.sh, the CPU's).
set -euo pipefail
python=$1
log=$(mktemp)
if ! "$python" -m pip install -q --no-deps voxcpm==2.0.3 >"$log" 2>&1; then
    grep -v "is ignored" "$log"
    exit 1
fi
rm -f "$log"
"$python" -c "import voxcpm, torchaudio.functional" || { echo "post_install: voxcpm does not import" >&2; exit 1; }
