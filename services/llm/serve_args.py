"""`python -m services.llm.serve_args PRESET`: the `vllm serve` flags that reproduce this service's engine for a
preset (same staged model directory, synthetic weights, dtype, lengths, batch and KV cache), one JSON list on
stdout. The load generator's side by side starts its peer with them, so both sides run the same engine."""

from __future__ import annotations

import dataclasses
import json
import sys

from services.llm.backends.vllm import engine_args, stage_model_dir
from services.llm.config import LlmConfig

# Engine arguments that decide speed, as `vllm serve` flags.
FLAGS = ("served_model_name", "tokenizer", "load_format", "dtype", "max_model_len", "max_num_seqs", "seed",
         "kv_cache_memory_bytes")  # fmt: skip


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
    return flags


if __name__ == "__main__":
    print(json.dumps(serve_args(LlmConfig(preset=sys.argv[1]))))
