"""What the main job runs on each device: the services' presets and flags, the sweeps and the workload.

`cpu` is the 2-core default (`make run`); `cuda` is one GPU (`make run DEVICE=cuda`): the published shapes with
synthetic weights — LLM qwen3-8b on vLLM, ASR nemotron-0.6b in bfloat16 with its first and steady 320 ms steps
as CUDA graphs, TTS voxcpm2 on the batched engine with its step compiled and captured as CUDA graphs — sharing the
GPU's memory, and sweeps wide enough to cross each ridge, with Locust workers so that the load generator is
never what limits a level.
"""

from __future__ import annotations

import dataclasses
import os
import shlex

from loadgen.sweep import SweepPlan
from loadgen.workload import Lengths, Workload

DEVICES = ("cpu", "cuda")
SERVICES = ("asr", "llm", "tts")
TARGETS = ("asr", "llm", "tts", "voice")
# The services a target needs up; "peer" is the LLM side by side with `vllm serve`.
NEEDS = {"asr": ("asr",), "llm": ("llm",), "tts": ("tts",), "voice": SERVICES, "peer": ("llm",)}

# "" = the service's default preset. On a CPU the ASR runs the 14M FastConformer: the 100M default keeps no
# stream real time on 2 cores, so its sweep would show nothing but queueing (`--presets asr=fastconformer-100m`).
PRESETS = {
    "cpu": {"asr": "fastconformer-small", "llm": "", "tts": ""},
    "cuda": {"asr": "nemotron-0.6b", "llm": "qwen3-8b", "tts": "voxcpm2"},
}

# The ASR chunk the GPU sweep streams (and the one chunk whose steady step is captured as CUDA graphs).
CUDA_ASR_CHUNK_MS = 320
# The GPU's memory, shared by the three services on one device: vLLM takes a fixed share (weights, activations,
# and all the rest as KV cache); ASR (~0.6B weights, caches of 1,024 stream slots, graphs per batch bucket)
# and TTS (~2B weights, 256 cache slots of 512 positions, graphs per bucket) allocate what they need beside it.
# The side by side runs our LLM and `vllm serve` with this share each, the ASR and TTS stopped.
CUDA_LLM_MEMORY_SHARE = 0.45
CUDA_LLM_MAX_IN_FLIGHT = 512
CUDA_ASR_MAX_STREAMS = 1024
CUDA_TTS_MAX_BATCH = 256
# The batched TTS step as measured fastest on the H200 (results/h200/README.md §3e: 104 -> 55 ms at 128 rows): the
# LocDiT solve and the VAE compiled inside the captured step, flash attention in the solve, the VAE in bf16.
CUDA_TTS_STEP = ["--compile", "true", "--solver-attention", "flash", "--vae-dtype", "bfloat16"]
# gRPC front-end processes per engine for the LLM and ASR (`--frontends`): one asyncio process was their limit on the
# H200 (results/h200/README.md: qwen3-0.6b 77 % -> 102 % of engine-direct at 64, §4b; ASR 704 -> 960 streams, §2 v5).
CUDA_FRONTENDS = 4

SERVICE_ARGS = {
    "cpu": {"asr": [], "llm": [], "tts": []},
    "cuda": {
        "asr": ["--device", "cuda", "--dtype", "bfloat16", "--max-streams", str(CUDA_ASR_MAX_STREAMS),
                "--max-batch-streams", str(CUDA_ASR_MAX_STREAMS), "--graph-chunks", str(CUDA_ASR_CHUNK_MS),
                "--frontends", str(CUDA_FRONTENDS)],
        "llm": ["--device", "cuda", "--dtype", "bfloat16", "--max-in-flight", str(CUDA_LLM_MAX_IN_FLIGHT),
                "--gpu-memory-utilization", str(CUDA_LLM_MEMORY_SHARE), "--frontends", str(CUDA_FRONTENDS)],
        "tts": ["--device", "cuda", "--backend", "batched", "--max-batch", str(CUDA_TTS_MAX_BATCH),
                "--cache-positions", "512", "--max-queue", str(CUDA_TTS_MAX_BATCH), *CUDA_TTS_STEP],
    },
}  # fmt: skip

# Locust worker processes per sweep on a GPU host: each Python process makes about one core of load, and a
# GPU level streams thousands of messages a second (tokens, audio pieces).
CUDA_WORKERS = {"asr": 8, "llm": 8, "tts": 4, "voice": 4}


def doubling(top: int) -> list[int]:
    return [2**power for power in range(top.bit_length()) if 2**power <= top]


def plans(quick: bool, device: str = "cpu") -> list[SweepPlan]:
    """The sweeps of a run. CPU: sized for a 2-core machine, the whole job under 15 minutes. CUDA: each sweep
    crosses its ridge — the LLM 1 … 512 (the H200's decode crossover is at a batch of ~190), ASR until streams
    fall behind real time, TTS 1 … 256 (past the batch where its step turns from fixed cost to per-row work)."""
    if quick:
        workers = CUDA_WORKERS if device == "cuda" else {}
        return [SweepPlan(target, [1, 2], duration_s=4.0, warmup_s=1.0, workers=workers.get(target, 0))
                for target in TARGETS]  # fmt: skip
    if device == "cuda":
        return [
            SweepPlan("llm", doubling(CUDA_LLM_MAX_IN_FLIGHT), duration_s=10.0, warmup_s=3.0, objective_s=10.0,
                      workers=CUDA_WORKERS["llm"]),
            SweepPlan("asr", [1, 16, 64, 128, 256, 384, 512, 768, 1024], duration_s=8.0, warmup_s=3.0,
                      stop_past_realtime=True, workers=CUDA_WORKERS["asr"]),
            SweepPlan("tts", doubling(CUDA_TTS_MAX_BATCH), duration_s=10.0, warmup_s=3.0, objective_s=10.0,
                      workers=CUDA_WORKERS["tts"]),
            SweepPlan("voice", [1, 4, 16], duration_s=10.0, warmup_s=3.0, workers=CUDA_WORKERS["voice"]),
        ]  # fmt: skip
    # Each sweep reaches past its knee: the LLM to C=64, past the CPU's decode crossover (batch ≈ ridge ≈ 10-30);
    # ASR until streams fall behind real time; TTS past the batch its engine can share a step with.
    return [
        SweepPlan("asr", [1, 2, 4, 8, 16, 32], duration_s=10.0, warmup_s=3.0),
        SweepPlan("llm", [1, 2, 4, 8, 16, 32, 64], duration_s=8.0, warmup_s=2.0),
        SweepPlan("tts", [1, 2, 4, 8, 16], duration_s=12.0, warmup_s=2.0),
        SweepPlan("voice", [1, 2, 4], duration_s=15.0, warmup_s=3.0),
    ]


def workload(quick: bool, device: str = "cpu") -> Workload:
    if quick:  # short requests so a smoke run's levels each hold a few
        return Workload(utterance_s=Lengths("2"), output_tokens=Lengths("16"), prompt_tokens=Lengths("32"),
                        text_words=Lengths("4-8"), reply_tokens=Lengths("12"),
                        chunk_ms=CUDA_ASR_CHUNK_MS if device == "cuda" else Workload.chunk_ms)  # fmt: skip
    if device == "cuda":  # decode-dominated LLM requests; the ASR chunk its graphs were captured for
        return Workload(output_tokens=Lengths("128"), chunk_ms=CUDA_ASR_CHUNK_MS)
    return Workload()


def service_args(device: str, name: str, preset: str) -> list[str]:
    """The service's flags: preset, the device's settings, then LOADGEN_<NAME>_ARGS (e.g. LOADGEN_ASR_ARGS=
    "--cuda-graphs false"), which win over the settings before them."""
    extra = shlex.split(os.environ.get(f"LOADGEN_{name.upper()}_ARGS", ""))
    return (["--preset", preset] if preset else []) + SERVICE_ARGS[device][name] + extra


def services_for(targets: list[str]) -> list[str]:
    """The services the chosen targets (and "peer") need, in start order."""
    needed = {service for target in targets for service in NEEDS[target]}
    return [name for name in SERVICES if name in needed]


def chosen_plans(quick: bool, device: str, targets: list[str]) -> list[SweepPlan]:
    return [dataclasses.replace(plan) for plan in plans(quick, device) if plan.target in targets]
