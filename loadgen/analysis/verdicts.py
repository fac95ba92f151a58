"""A sweep's analysis as data: a verdict per level (regime, utilisations, prediction, artefact) and the sweep's
knee, crossover and predicted-vs-measured table. Built by sweep_analysis.analyse, read by the table, the report
and the plots."""

from __future__ import annotations

import dataclasses

from loadgen.analysis.predict import Prediction
from loadgen.analysis.work import StepWork


@dataclasses.dataclass
class LevelVerdict:
    concurrency: int
    regime: str  # "overhead-bound" | "bandwidth-bound" | "compute-bound" | "queueing" | "unknown" (nothing measured)
    # | "remote: not classified" (an engine on another server)
    reasons: list[str]
    artefact: str  # "" when the level's figures are physically possible
    bandwidth_utilisation: float
    flop_utilisation: float
    arithmetic_intensity: float
    utilisation_source: str  # "counters" (the service's work counters), "estimated" (from throughput) or "none"
    predicted: Prediction | None  # None where there is no step model (the voice turn spans three services)
    realtime_ok: bool | None = None


@dataclasses.dataclass
class SweepAnalysis:
    target: str
    device: str
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    ridge_flops_per_byte: float
    work: StepWork | None
    levels: list[LevelVerdict]
    knee_index: int | None
    knee_concurrency: int | None
    knee_regime: str | None
    knee_sentence: str
    crossover_concurrency: float | None
    crossover_sentence: str
    realtime_limit: int | None  # ASR/TTS: highest concurrency that kept real time (measured)
    predicted_realtime_streams: int | None
    rules: list[str]
    predictions_table: list[dict[str, str]]
    roofline: dict
    summary: str

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for verdict, level in zip(self.levels, data["levels"], strict=True):
            if verdict.predicted:
                level["predicted"]["intensity"] = verdict.predicted.intensity
        return data
