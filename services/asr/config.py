"""ASR service configuration: one frozen dataclass, from `--flags`, `ASR_*` variables and defaults.

Presets are model configs kept in services/asr/presets/ (synthetic weights, real architecture):
`tiny` (tests), `fastconformer-100m` (CPU default) and `nemotron-0.6b` (the Nemotron speech streaming
0.6B shape, for GPUs). `--model-path x.nemo` serves a real checkpoint instead.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from voiceagent.serving.config import ServingConfig, require

PRESETS = Path(__file__).resolve().parent / "presets"
BACKENDS = ("cache-aware", "buffered")
DTYPES = ("float32", "bfloat16")
STEP_POLICIES = ("ready", "clocked")
OVERLAP_STEPS = ("auto", "on", "off")
LANGUAGE_SUBTAG = re.compile(r"[a-z]{2,3}")  # BCP-47's primary language subtag (ISO 639)
# A BCP-47 tag as clients send it: a primary subtag and optional subtags (en-US, zh-Hant-TW); at most 35 characters.
LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8}){0,4}")


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS.glob("*.yaml"))


@dataclasses.dataclass(frozen=True)
class AsrConfig(ServingConfig):
    port: int = dataclasses.field(default=50051, metadata={"help": "gRPC port (0 = any free port)"})
    metrics_port: int = dataclasses.field(default=9091, metadata={"help": "Prometheus /metrics port (0 = any)"})
    preset: str = dataclasses.field(
        default="fastconformer-100m", metadata={"help": "model config in services/asr/presets/ (synthetic weights)"}
    )
    model_path: str = dataclasses.field(default="", metadata={"help": "a .nemo checkpoint; overrides the preset"})
    backend: str = dataclasses.field(
        default="cache-aware", metadata={"help": "cache-aware (streaming caches) or buffered (re-encoded window)"}
    )
    max_streams: int = dataclasses.field(default=64, metadata={"help": "concurrent streams (cache slots)"})
    max_batch_streams: int = dataclasses.field(default=64, metadata={"help": "streams per batched encoder step"})
    step_policy: str = dataclasses.field(
        default="ready",
        metadata={
            "help": "when a chunk size's streams step: 'ready' (as soon as some have a whole chunk, after up to "
            "--batch-wait-fraction of a chunk for others) or 'clocked' (once per chunk period, every ready stream "
            "in one batch, phase-aligned; streams fed faster than real time catch up at once)"
        },
    )
    batch_wait_fraction: float = dataclasses.field(
        default=0.25,
        metadata={"help": "wait up to this fraction of a chunk for more streams to batch (0 = step at once)"},
    )
    join_window_ms: float = dataclasses.field(
        default=20.0,
        metadata={
            "help": "a new stream's first step waits until no stream has joined for this long (at most one chunk), "
            "so streams that start together step together (0 = step at once)"
        },
    )
    max_offline_requests: int = dataclasses.field(
        default=4,
        metadata={
            "help": "Recognize calls the service holds at once, running or waiting for the engine (each keeps its "
            "clip); more get RESOURCE_EXHAUSTED"
        },
    )
    stream_idle_timeout_s: float = dataclasses.field(
        default=30.0,
        metadata={
            "help": "a stream that sends no message for this long ends OUT_OF_RANGE, giving back its slot (clients "
            "send audio in real time, silence included; 0 = wait for ever)"
        },
    )
    languages: str = dataclasses.field(
        default="en",
        metadata={
            "help": "the languages the model transcribes, comma-separated primary subtags (every preset is "
            "English); a config.language_code whose primary subtag is not one of them is INVALID_ARGUMENT "
            "(en-US and en-GB count as en; empty is the model's default)"
        },
    )
    max_stream_backlog_s: float = dataclasses.field(
        default=10.0,
        metadata={
            "help": "audio a stream may have sent and not yet had processed, in seconds: past it the service reads "
            "the stream's next message only as the engine catches up (gRPC flow control then holds the client "
            "back); one message longer than this is INVALID_ARGUMENT"
        },
    )
    max_offline_audio_s: float = dataclasses.field(
        default=120.0, metadata={"help": "longest clip one Recognize call may carry; longer is INVALID_ARGUMENT"}
    )
    offline_pass_s: float = dataclasses.field(
        default=4.0,
        metadata={
            "help": "Recognize clips up to this long run as one offline encoder pass; longer ones are stepped "
            "chunk by chunk between the live streams' steps (live steps first), so they never stall them"
        },
    )
    offline_slice_ms: float = dataclasses.field(
        default=50.0,
        metadata={"help": "engine time a long Recognize may take before queued live steps run (one slice)"},
    )
    buffered_window_ms: int = dataclasses.field(
        default=4000, metadata={"help": "audio the buffered backend re-encodes per chunk"}
    )
    dtype: str = dataclasses.field(
        default="float32",
        metadata={"help": "dtype of the encoder, decoder and caches: float32 or bfloat16 (for GPUs)"},
    )
    threads: int = dataclasses.field(default=0, metadata={"help": "torch CPU threads (0 = torch's default)"})
    engine_process: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "run the model in its own process beside the gRPC server, so that the batched step does not "
            "share an interpreter lock with gRPC (false: one process, steps in a worker thread)"
        },
    )
    frontends: int = dataclasses.field(
        default=1,
        metadata={
            "help": "gRPC front-end processes on one engine process, sharing the port (SO_REUSEPORT); together "
            "they admit --max-streams (one counter for the pod) (1 = one gRPC process)"
        },
    )
    overlap_steps: str = dataclasses.field(
        default="auto",
        metadata={
            "help": "launch a chunk size's next step before reading the last one back, so that the host prepares "
            "one step and reads the other back while the device runs (auto = on a CUDA device; on the CPU a "
            "step is done when launched, and overlapping would only delay its results): auto, on or off"
        },
    )
    fused_encoder: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "run the encoder's self-attention and convolution modules in fewer, larger kernels (no per-row "
            "copy of the positional projection, keys and values; pointwise convolutions as GEMMs); the same "
            "results to float rounding (engine/fused_encoder.py; off until measured on a GPU)"
        },
    )
    cuda_graphs: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "on a CUDA device, capture each chunk size's first and steady cache-aware steps (encoder + "
            "greedy decoding) as CUDA graphs, one per batch-size bucket 1, 2, 4, ... 64, 128, ... "
            "--max-batch-streams, at start-up (ignored on the CPU)"
        },
    )
    padded_steps: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "run steady steps on padded batch-size buckets in static buffers, eagerly: the CPU twin of "
            "--cuda-graphs (implied by it on a CUDA device)"
        },
    )
    graph_first_steps: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "give a stream's first step (its first chunk, from empty caches) and 80 ms's second step (a "
            "1-frame history) padded steps / graphs too (false: they run eagerly, as a short last chunk does)"
        },
    )
    features_in_step: bool = dataclasses.field(
        default=False,
        metadata={
            "help": "padded steps / CUDA graphs take each stream's audio and compute its mel frames themselves "
            "(false: the mel front end runs before the step, a few dozen eager launches per step on a GPU; off "
            "until measured on a GPU)"
        },
    )
    graph_chunks: str = dataclasses.field(
        default="",
        metadata={"help": "comma-separated chunk sizes (ms) to give padded steps / graphs (empty: all)"},
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the synthetic weights"})
    record_encoder_dir: str = dataclasses.field(
        default="", metadata={"help": "debug: write each stream's encoder output and tokens here (.npz)"}
    )

    @property
    def language_set(self) -> frozenset[str]:
        return frozenset(code.strip().lower() for code in self.languages.split(",") if code.strip())

    @property
    def overlapped(self) -> bool:
        """Whether steps overlap (--overlap-steps: auto is on for a CUDA device)."""
        if self.overlap_steps == "auto":
            return str(self.device).startswith("cuda")
        return self.overlap_steps == "on"

    @property
    def graph_chunk_ms(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.graph_chunks.split(",")) if self.graph_chunks else ()

    @property
    def preset_file(self) -> Path:
        return PRESETS / f"{self.preset}.yaml"

    def validate(self) -> None:
        super().validate()
        if not self.model_path:
            names = preset_names()
            require(self.preset in names, "preset", f"must be one of {names}, got {self.preset!r}")
        else:
            require(Path(self.model_path).is_file(), "model_path", f"no such file: {self.model_path!r}")
        require(self.backend in BACKENDS, "backend", f"must be one of {list(BACKENDS)}, got {self.backend!r}")
        require(self.max_streams >= 1, "max_streams", f"must be >= 1, got {self.max_streams}")
        require(self.max_batch_streams >= 1, "max_batch_streams", f"must be >= 1, got {self.max_batch_streams}")
        require(
            0 <= self.batch_wait_fraction <= 1, "batch_wait_fraction", f"must be 0..1, got {self.batch_wait_fraction}"
        )
        require(
            self.step_policy in STEP_POLICIES,
            "step_policy",
            f"must be one of {list(STEP_POLICIES)}, got {self.step_policy!r}",
        )
        require(1 <= self.frontends <= 64, "frontends", f"must be 1..64, got {self.frontends}")
        require(
            self.frontends == 1 or (self.engine_process and self.max_streams >= self.frontends),
            "frontends",
            "several front ends need --engine-process true and at least one stream slot each",
        )
        require(self.join_window_ms >= 0, "join_window_ms", f"must be >= 0, got {self.join_window_ms}")
        require(
            self.max_offline_requests >= 1, "max_offline_requests", f"must be >= 1, got {self.max_offline_requests}"
        )
        require(
            self.stream_idle_timeout_s >= 0, "stream_idle_timeout_s", f"must be >= 0, got {self.stream_idle_timeout_s}"
        )
        require(
            bool(self.language_set) and all(LANGUAGE_SUBTAG.fullmatch(code) for code in self.language_set),
            "languages",
            f"must be comma-separated language subtags such as en,de, got {self.languages!r}",
        )
        require(  # more than the longest chunk (1.12 s) and its first step's lead, or a stream could wait for ever
            self.max_stream_backlog_s >= 2, "max_stream_backlog_s", f"must be >= 2, got {self.max_stream_backlog_s}"
        )
        require(self.max_offline_audio_s > 0, "max_offline_audio_s", f"must be > 0, got {self.max_offline_audio_s}")
        require(self.offline_pass_s >= 0, "offline_pass_s", f"must be >= 0, got {self.offline_pass_s}")
        require(self.offline_slice_ms > 0, "offline_slice_ms", f"must be > 0, got {self.offline_slice_ms}")
        require(self.buffered_window_ms >= 80, "buffered_window_ms", f"must be >= 80, got {self.buffered_window_ms}")
        require(self.dtype in DTYPES, "dtype", f"must be one of {list(DTYPES)}, got {self.dtype!r}")
        require(
            all(part.strip().isdigit() for part in self.graph_chunks.split(",")) if self.graph_chunks else True,
            "graph_chunks",
            f"must be comma-separated chunk sizes in ms, got {self.graph_chunks!r}",
        )
        require(self.threads >= 0, "threads", f"must be >= 0, got {self.threads}")
        require(
            self.overlap_steps in OVERLAP_STEPS,
            "overlap_steps",
            f"must be one of {list(OVERLAP_STEPS)}, got {self.overlap_steps!r}",
        )
