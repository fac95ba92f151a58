"""What a sweep measures, as plain dataclasses: the contract between the sweep runner, the analysis and reports.

A sweep of one target produces one `ServiceFacts` (from the service's GetInfo RPC) and one `LevelResult` per
concurrency level; `analysis` turns them into verdicts and predictions. Everything here serialises to JSON
(`dataclasses.asdict`) for results.json.
"""

from __future__ import annotations

import dataclasses
import time

from voiceagent.serving.ceilings import QUIET_CORES


@dataclasses.dataclass
class RequestRecord:
    """One request as a Locust user saw it; one JSONL line in requests.jsonl."""

    target: str  # "asr" | "llm" | "tts" | "voice" | "openai"
    concurrency: int
    started_s: float  # wall clock (time.time()) at send
    ok: bool
    error: str = ""
    latency_s: float = 0.0  # send -> last message
    first_s: float | None = None  # send -> first token / first audio / first partial
    gaps_s: list[float] = dataclasses.field(default_factory=list)  # inter-token, inter-chunk or per-chunk latencies
    units: float = 0.0  # work done: tokens generated (llm), audio seconds produced (tts) or recognised (asr)
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # target-specific: final_latency_s, underruns ...


@dataclasses.dataclass
class Percentiles:
    p50: float
    p90: float
    p95: float
    p99: float
    mean: float
    count: int


@dataclasses.dataclass
class ServerCounters:
    """Deltas of the service's own counters over a level, divided by the level's duration."""

    flops_per_s: float = 0.0  # rate(voiceagent_<svc>_model_flops_total)
    read_bytes_per_s: float = 0.0  # rate(voiceagent_<svc>_model_read_bytes_total)
    steps_per_s: float = 0.0  # rate(voiceagent_<svc>_engine_steps_total)
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. mean batch size, queue time

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved: where this level sits on the roofline's x-axis."""
        return self.flops_per_s / self.read_bytes_per_s if self.read_bytes_per_s else 0.0


@dataclasses.dataclass
class LevelResult:
    """One concurrency level of a sweep."""

    concurrency: int
    duration_s: float
    requests: int
    errors: int
    throughput: float  # units per second over all users (tokens/s, audio s/s)
    throughput_unit: str  # "tokens/s", "audio s/s"
    per_request_speed: float  # units per second seen by one request (tokens/s per stream, 1/RTF)
    latency: dict[str, Percentiles]  # by name: "ttft_s", "itl_s", "first_audio_s", "chunk_latency_s", ...
    server: ServerCounters
    realtime_ok: bool | None = None  # ASR/TTS: every stream kept up with real time (no underruns)
    loadgen_cpu: float = 0.0  # load generator's CPU use over the level, in cores
    stopped_early: str = ""  # why the sweep stopped after this level (errors, objective), if it did
    extra: dict[str, float] = dataclasses.field(default_factory=dict)  # realtime_streams, underruns, error kinds ...


@dataclasses.dataclass
class ServiceFacts:
    """The service's GetInfo answer, flattened: what predictions and verdicts are computed from."""

    service: str
    backend: str
    preset: str
    dtype: str
    device: str
    device_name: str
    parameter_count: int
    weight_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    shape: dict[str, float] = dataclasses.field(default_factory=dict)
    limits: dict[str, float] = dataclasses.field(default_factory=dict)
    # How the ceilings were measured: when, by what probe, and the CPU cores other processes kept busy meanwhile
    # (-1 = unknown). One probe per service; a combined target (the voice turn) keeps each part's.
    ceilings_measured_at_unix_s: float = 0.0
    ceilings_method: str = ""
    ceilings_background_cores: float = -1.0

    @property
    def ceilings_quiet(self) -> bool:
        return self.ceilings_background_cores < QUIET_CORES

    def ceilings_note(self) -> str:
        """When and how the ceilings were measured, in words, flagged when the probe ran under load."""
        if not self.peak_flops_per_s:
            return "not measured"
        when = (
            time.strftime("%H:%M:%S UTC", time.gmtime(self.ceilings_measured_at_unix_s))
            if self.ceilings_measured_at_unix_s
            else "at start-up"
        )
        load = self.ceilings_background_cores
        if load < 0:
            quiet = "background load unknown"
        elif load < QUIET_CORES:
            quiet = f"quiet machine ({load:.2f} CPU cores busy elsewhere)"
        else:
            quiet = (
                f"**MEASURED UNDER LOAD**: {load:.2f} CPU cores busy elsewhere during the probe, so the ceilings "
                "are too low and every utilisation and regime verdict derived from them is inflated"
            )
        return f"{when}, {self.ceilings_method or 'start-up probe'}; {quiet}"

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.peak_flops_per_s / self.memory_bandwidth_bytes_per_s if self.memory_bandwidth_bytes_per_s else 0.0

    @property
    def remote(self) -> bool:
        """The service relays to an engine elsewhere (the LLM's openai backend): its device is not known."""
        return self.device == "remote"

    @classmethod
    def from_info(cls, info) -> ServiceFacts:
        """From a voiceagent.v1.InfoResponse."""
        return cls(
            service=info.service,
            backend=info.model.backend,
            preset=info.model.preset,
            dtype=info.model.dtype,
            device=info.model.device,
            device_name=info.ceilings.device_name,
            parameter_count=info.model.parameter_count,
            weight_bytes=info.model.weight_bytes,
            memory_bandwidth_bytes_per_s=info.ceilings.memory_bandwidth_bytes_per_s,
            peak_flops_per_s=info.ceilings.peak_flops_per_s,
            shape=dict(info.model.shape),
            limits=dict(info.limits),
            ceilings_measured_at_unix_s=info.ceilings.measured_at_unix_s,
            ceilings_method=info.ceilings.method,
            ceilings_background_cores=info.ceilings.background_cores if info.ceilings.method else -1.0,
        )
