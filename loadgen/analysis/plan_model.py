"""The capacity plan's data: what goes in (sessions, objectives), what comes out (a plan per service, the plan,
and how the answer changes with the ASR chunk size and TTS diffusion steps, measured and predicted). The plan
is computed in plan.py, the predicted variants in plan_variants.py and rendered in plan_render.py; all three
import these, and none imports another's data."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Objectives:
    voice_to_voice_p95_s: float = 1.5
    asr_final_p95_s: float = 0.5
    llm_ttft_p95_s: float = 0.5
    tts_first_audio_p95_s: float = 0.5
    no_underruns: bool = True

    def latency_p95_s(self, target: str) -> float:
        return {"asr": self.asr_final_p95_s, "llm": self.llm_ttft_p95_s, "tts": self.tts_first_audio_p95_s}[target]


@dataclasses.dataclass(frozen=True)
class Sessions:
    sessions: int
    speaking_share: float = 0.4  # of a session's time the user speaks (an ASR stream is open)
    listening_share: float = 0.4  # of a session's time the agent speaks (TTS audio plays)
    tokens_per_audio_s: float = 3.0  # LLM tokens per second of reply speech (~150 words/min × 1.2 tokens/word)

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions: must be ≥ 1, got {self.sessions}")
        for name in ("speaking_share", "listening_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be within [0, 1], got {getattr(self, name)}")
        if self.speaking_share + self.listening_share > 1:
            raise ValueError("speaking_share + listening_share: must not exceed 1 (one party speaks at a time)")

    def demand(self, target: str) -> tuple[float, str]:
        if target == "asr":
            return self.sessions * self.speaking_share, "streams"
        if target == "llm":
            return self.sessions * self.listening_share * self.tokens_per_audio_s, "tokens/s"
        return self.sessions * self.listening_share, "audio s/s"


@dataclasses.dataclass
class ServicePlan:
    target: str
    variant: str
    source: str
    demand: float
    unit: str
    measured_concurrency: list[int]
    operating_concurrency: int | None  # per replica; None when no measured level met the objectives
    capacity_per_replica: float | None
    replicas: int | None
    headroom: float | None
    latency_p95_s: float | None  # the objective latency's p95 at the operating point
    limited_by: str  # why the operating point is not higher

    @property
    def need(self) -> float:
        """Replicas needed, unrounded: how much of the fleet this service takes."""
        return self.demand / self.capacity_per_replica if self.capacity_per_replica else math.inf


@dataclasses.dataclass
class CapacityPlan:
    sessions: Sessions
    objectives: Objectives
    services: list[ServicePlan]
    bottleneck: str | None
    voice_to_voice_p95_s: float | None
    meets_objectives: bool
    voice_measured: str
    variants: list[MeasuredVariant]
    predicted_variants: list[PredictedVariant]
    assumptions: list[str]
    warnings: list[str]
    missing: list[str]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class MeasuredVariant:
    """The whole plan solved again with one measured sweep of another setting (ASR chunk, TTS diffusion steps)."""

    service: str
    variant: str
    operating_concurrency: int | None
    capacity_per_replica: float | None
    unit: str
    replicas: int | None
    total_replicas: int
    bottleneck: str | None
    voice_to_voice_p95_s: float | None
    meets_objectives: bool


@dataclasses.dataclass
class PredictedVariant:
    """A setting not measured: the roofline bound per replica and the estimate corrected by the measured sweep."""

    service: str
    setting: str  # "—" when no prediction could be made (see note)
    note: str
    predicted_capacity_per_replica: float | None = None
    estimated_capacity_per_replica: float | None = None
    unit: str = ""
    estimate_basis: str = "—"
    replicas_at_bound: int | None = None
    replicas_at_estimate: int | None = None
