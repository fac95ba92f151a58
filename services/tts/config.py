"""TTS service settings (`TTS_<FIELD>` / `--field`) and the named model presets kept in presets/.

A preset is a VoxCPM2 `config.json` (the checkpoint format) built with synthetic weights; `checkpoint` points
at a real VoxCPM checkpoint directory instead and wins over `preset`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from voiceagent.serving.config import ServingConfig, require

PRESETS = Path(__file__).resolve().parent / "presets"

NATIVE_SAMPLE_RATE_HZ = 48_000
OUTPUT_SAMPLE_RATES_HZ = (16_000, 24_000, 48_000)
# Bounds a request may ask for: fewer than 1 diffusion step is no sampling, more than 50 buys nothing audible
# on VoxCPM2 (trained with 10) and only burns compute; cfg outside [0, 10] produces clipped garbage.
TIMESTEPS_RANGE = (1, 50)
BACKENDS = ("batched", "pool")
VAE_DTYPES = ("float32", "bfloat16")
SOLVER_ATTENTIONS = ("default", "math", "flash", "efficient", "cudnn")
# Parts of the batched step --compile may compile (BatchedVoxCPM.compile), and those it compiles unless told. Not
# "lms": traced whole, the LMs' in-place K/V cache writes became a copy of the whole cache per layer (131 ms steps at
# 128 rows on the H200, against 60; results/h200/README.md §3e); "lm-glue" leaves those writes eager (§3j: -3.4 to
# -3.8 % per step at 176 and 256 rows on an H100).
COMPILE_PARTS = ("solver", "vae", "lm-glue", "lms")
COMPILED_PARTS = ("solver", "vae", "lm-glue")
CFG_RANGE = (0.0, 10.0)


def closed_range(bounds: tuple[float, float]) -> str:
    """How a bound pair reads in an error message: both ends allowed."""
    return f"[{bounds[0]:g}, {bounds[1]:g}]"


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS.glob("*.json"))


def preset_path(name: str) -> Path:
    return PRESETS / f"{name}.json"


@dataclasses.dataclass(frozen=True)
class TtsConfig(ServingConfig):
    """Streaming text-to-speech on VoxCPM2."""

    port: int = dataclasses.field(default=50053, metadata={"help": "gRPC port (0 = any free port)"})
    metrics_port: int = dataclasses.field(default=9093, metadata={"help": "Prometheus /metrics port"})
    preset: str = dataclasses.field(
        default="small", metadata={"help": f"model shape with synthetic weights: {', '.join(preset_names())}"}
    )
    checkpoint: str = dataclasses.field(
        default="", metadata={"help": "VoxCPM checkpoint directory (config.json, tokenizer, safetensors)"}
    )
    weight_seed: int = dataclasses.field(default=0, metadata={"help": "seed of the synthetic weights"})
    backend: str = dataclasses.field(
        default="batched",
        metadata={"help": f"engine: {', '.join(BACKENDS)} (batched: one model, requests share each patch step)"},
    )
    max_batch: int = dataclasses.field(
        default=32, metadata={"help": "batched: requests stepped together (cache slots of the one model)"}
    )
    cache_positions: int = dataclasses.field(
        default=2048, metadata={"help": "batched: K/V cache positions per slot (text tokens + patches of a segment)"}
    )
    frontends: int = dataclasses.field(
        default=1,
        metadata={
            "help": "batched: gRPC front-end processes on one engine process, sharing the port (SO_REUSEPORT); "
            "every patch of every request goes out through one of them, so together they admit max_batch + "
            "max_queue (one counter for the pod) (1 = one gRPC process)"
        },
    )
    cuda_graphs: bool = dataclasses.field(
        default=True, metadata={"help": "batched on CUDA: capture the step per batch-size bucket at start-up"}
    )
    prefill_graphs: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "batched on CUDA: also capture the prefill per (rows, text tokens) bucket at start-up, so a join "
            "costs the host one replay instead of ~1,600 launches (24 graphs, ~7 s on an H200)"
        },
    )
    vae_dtype: str = dataclasses.field(
        default="float32",
        metadata={
            "help": "batched: dtype of the audio VAE's decode: float32 (as VoxCPM2 runs it) or bfloat16 "
            "(bf16 tensor cores and half the bytes on a GPU; the waveform is rounded to bf16's precision)"
        },
    )
    solver_attention: str = dataclasses.field(
        default="default",
        metadata={
            "help": "batched with --compile: attention kernel of the LocDiT solve: default (torch's choice), "
            "math, flash, efficient, cudnn"
        },
    )
    workers: int = dataclasses.field(
        default=1, metadata={"help": "pool: model instances, each serving one request at a time"}
    )
    threads_per_worker: int = dataclasses.field(
        default=1, metadata={"help": "torch intra-op threads per worker process (CPU)"}
    )
    max_queue: int = dataclasses.field(
        default=8, metadata={"help": "requests that may wait for a worker or slot; more get RESOURCE_EXHAUSTED"}
    )
    max_text_chars: int = dataclasses.field(default=2000, metadata={"help": "longest text one request may carry"})
    stream_idle_timeout_s: float = dataclasses.field(
        default=30.0,
        metadata={
            "help": "text-in streaming: a request whose engine has waited this long for its next text ends "
            "OUT_OF_RANGE, giving back its slot (send text as it comes and half-close at the end; 0 = wait for ever)"
        },
    )
    max_text_messages: int = dataclasses.field(
        default=1000, metadata={"help": "text-in streaming: most text messages one request may send"}
    )
    inference_timesteps: int = dataclasses.field(
        default=10, metadata={"help": "default diffusion steps per patch (requests may override)"}
    )
    cfg_value: float = dataclasses.field(default=2.0, metadata={"help": "default classifier-free guidance scale"})
    patches_per_char: float = dataclasses.field(
        default=0.4,
        metadata={
            "help": "speaking rate of synthetic weights (their stop head never fires): 0.4 patches = 64 ms per char"
        },
    )
    max_patches: int = dataclasses.field(default=1500, metadata={"help": "cap on patches per text segment (4 min)"})
    compile: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "CUDA only: torch.compile; pool: VoxCPM's own compiled steps and CUDA graphs; batched: the "
            "LocDiT solve compiled inside the captured step"
        },
    )
    compile_parts: str = dataclasses.field(
        default=",".join(COMPILED_PARTS),
        metadata={
            "help": "batched with --compile: the step's parts compiled, comma-separated: solver (the LocDiT solve), "
            "vae (the audio VAE's decode), lm-glue (each LM layer's norms, projections, RoPE and MLP; the cache "
            "write and attention stay eager) or lms (the LMs whole: their cache writes become copies, slower)"
        },
    )
    phrase_min_chars: int = dataclasses.field(
        default=12, metadata={"help": "text-in streaming: shortest phrase cut at a comma-like boundary"}
    )

    def validate(self) -> None:
        super().validate()
        names = preset_names()
        require(
            bool(self.checkpoint) or self.preset in names,
            "preset",
            f"must be one of {', '.join(names)}, got {self.preset!r}",
        )
        require(
            not self.checkpoint or (Path(self.checkpoint) / "config.json").is_file(),
            "checkpoint",
            f"must be a directory with config.json, got {self.checkpoint!r}",
        )
        require(self.backend in BACKENDS, "backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        require(self.max_batch >= 1, "max_batch", f"must be >= 1, got {self.max_batch}")
        require(1 <= self.frontends <= 64, "frontends", f"must be 1..64, got {self.frontends}")
        require(
            self.frontends == 1 or self.backend == "batched",
            "frontends",
            "several front ends share the batched engine: needs --backend batched",
        )
        require(self.cache_positions >= 64, "cache_positions", f"must be >= 64, got {self.cache_positions}")
        require(
            self.vae_dtype in VAE_DTYPES, "vae_dtype", f"must be one of {', '.join(VAE_DTYPES)}, got {self.vae_dtype!r}"
        )
        require(
            self.solver_attention in SOLVER_ATTENTIONS,
            "solver_attention",
            f"must be one of {', '.join(SOLVER_ATTENTIONS)}, got {self.solver_attention!r}",
        )
        require(self.workers >= 1, "workers", f"must be >= 1, got {self.workers}")
        require(self.threads_per_worker >= 1, "threads_per_worker", f"must be >= 1, got {self.threads_per_worker}")
        require(self.max_queue >= 0, "max_queue", f"must be >= 0, got {self.max_queue}")
        require(
            self.stream_idle_timeout_s >= 0, "stream_idle_timeout_s", f"must be >= 0, got {self.stream_idle_timeout_s}"
        )
        require(self.max_text_messages >= 1, "max_text_messages", f"must be >= 1, got {self.max_text_messages}")
        require(self.max_text_chars >= 1, "max_text_chars", f"must be >= 1, got {self.max_text_chars}")
        low, high = TIMESTEPS_RANGE
        require(
            low <= self.inference_timesteps <= high,
            "inference_timesteps",
            f"must be in {closed_range(TIMESTEPS_RANGE)}, got {self.inference_timesteps}",
        )
        require(
            CFG_RANGE[0] <= self.cfg_value <= CFG_RANGE[1],
            "cfg_value",
            f"must be in {closed_range(CFG_RANGE)}, got {self.cfg_value}",
        )
        require(self.patches_per_char > 0, "patches_per_char", f"must be > 0, got {self.patches_per_char}")
        require(self.max_patches >= 4, "max_patches", f"must be >= 4, got {self.max_patches}")
        require(not self.compile or self.device.startswith("cuda"), "compile", "needs a CUDA device")
        unknown = [part for part in self.compiled_parts if part not in COMPILE_PARTS]
        require(not unknown, "compile_parts", f"no such part: {', '.join(unknown)} (one of {', '.join(COMPILE_PARTS)})")
        require(self.compiled_parts, "compile_parts", "names no part (one or more of " + ", ".join(COMPILE_PARTS) + ")")
        require(
            not {"lms", "lm-glue"} <= set(self.compiled_parts),
            "compile_parts",
            "compile the LMs whole (lms) or their glue (lm-glue), not both",
        )
        require(self.phrase_min_chars >= 1, "phrase_min_chars", f"must be >= 1, got {self.phrase_min_chars}")

    @property
    def compiled_parts(self) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.compile_parts.split(",") if part.strip())

    @property
    def model_source(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint else preset_path(self.preset)

    @property
    def resolved_dtype(self) -> str:
        """The dtype the model computes in: its config.json's (float32 if it names none)."""
        config_file = self.model_source / "config.json" if self.checkpoint else self.model_source
        return json.loads(config_file.read_text()).get("dtype", "float32")
