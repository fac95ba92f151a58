"""What the ASR chunk sizes and TTS diffusion steps that were not swept would give, predicted.

Two figures per setting, both predictions, never measurements:
- the roofline bound (the step model of `work` on the measured ceilings), capped by the admission limit;
- an estimate from what the measured sweep showed the roofline leaves out. ASR: the measured chunk latency p50
  fitted as a + b·streams over the levels that kept real time (a: overhead per step, b: per stream per step),
  both taken to be independent of the chunk size, so a replica keeps up while a + b·streams ≤ chunk: per-step
  overhead is paid once per chunk, which is what makes small chunks expensive. TTS: the measured efficiency
  (roofline time ÷ measured time per patch), since its overhead grows with the diffusion calls as its work does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from loadgen.analysis.plan_model import PredictedVariant, Sessions
from loadgen.analysis.predict import STEP_LATENCY, realtime_streams, step_bound
from loadgen.analysis.recorded import workload_hints
from loadgen.analysis.work import StepWork, asr_step_work, tts_step_work

if TYPE_CHECKING:
    from loadgen.analysis.recorded import RecordedSweep

ASR_CHUNKS_MS = (80, 160, 320, 560, 1120)  # right context 0, 1, 3, 6, 13 encoder frames
TTS_DIFFUSION_STEPS = (4, 6, 8, 10, 12)


def _replicas(demand: float, capacity: float | None) -> int | None:
    return max(1, math.ceil(demand / capacity - 1e-9)) if capacity else None


def _measured_step(sweep: RecordedSweep, work: StepWork) -> tuple[float, float] | None:
    """(measured, roofline) time of one step at the lowest level, if the sweep measured it."""
    lowest = sweep.levels[0]
    latency = lowest.latency.get(STEP_LATENCY[sweep.target])
    if not latency or not latency.count:
        return None
    batch = min(lowest.concurrency, work.max_batch or lowest.concurrency)
    return latency.p50, step_bound(work, sweep.facts, batch)[2]


def overhead_fit(sweep: RecordedSweep, work: StepWork) -> tuple[float, float] | None:
    """(a, b) of measured step time − roofline step time ≈ a + b·streams, over the levels that kept real time."""
    name = STEP_LATENCY[sweep.target]
    points = []
    for level in sweep.levels:
        latency = level.latency.get(name)
        if level.realtime_ok is not False and latency and latency.count:
            batch = min(level.concurrency, work.max_batch or level.concurrency)
            points.append((batch, latency.p50 - step_bound(work, sweep.facts, batch)[2]))
    if not points:
        return None
    if len({streams for streams, _ in points}) < 2:
        return max(0.0, points[0][1]), 0.0
    slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
    return max(0.0, float(intercept)), max(0.0, float(slope))


def _row(
    target: str, setting: str, bound: float | None, estimate: float | None, unit: str, demand: float, basis: str
) -> PredictedVariant:
    return PredictedVariant(
        service=target,
        setting=setting,
        note="predicted, not measured",
        predicted_capacity_per_replica=bound,
        estimated_capacity_per_replica=estimate,
        unit=unit,
        estimate_basis=basis,
        replicas_at_bound=_replicas(demand, bound),
        replicas_at_estimate=_replicas(demand, estimate),
    )


def _asr_rows(sweep: RecordedSweep, sessions: Sessions) -> list[PredictedVariant]:
    facts, demand = sweep.facts, sessions.demand("asr")[0]
    baseline = asr_step_work(facts, sweep.levels, workload_hints(sweep.workload))
    if baseline.source != "shape":
        return [PredictedVariant("asr", "—", "model size unknown: no prediction per chunk size")]
    fit = overhead_fit(sweep, baseline)
    limit = baseline.max_batch or math.inf
    rows = []
    for chunk in ASR_CHUNKS_MS:
        work = asr_step_work(facts, [], {"chunk_ms": chunk})
        bound = min(realtime_streams(work, facts) or 0, limit)
        estimate = min(realtime_streams(work, facts, *fit) or 0, limit) if fit else None
        basis = f"overhead {fit[0] * 1000:.3g} ms + {fit[1] * 1000:.3g} ms/stream per step, fitted" if fit else "—"
        rows.append(_row("asr", f"chunk {chunk} ms", bound, estimate, "real-time streams", demand, basis))
    return rows


def _tts_rows(sweep: RecordedSweep, sessions: Sessions) -> list[PredictedVariant]:
    facts, demand = sweep.facts, sessions.demand("tts")[0]
    baseline = tts_step_work(facts, [], workload_hints(sweep.workload))
    if baseline.source != "shape" or "step_flops" in facts.shape:
        return [PredictedVariant("tts", "—", "no DiT size in the shape: no prediction per diffusion steps")]
    measured = _measured_step(sweep, baseline)
    efficiency = measured[1] / measured[0] if measured and measured[0] else None
    rows = []
    for steps in TTS_DIFFUSION_STEPS:
        work = tts_step_work(facts, [], {"inference_timesteps": steps})
        step_s = step_bound(work, facts, 1)[2]
        bound = work.units_per_stream_step / step_s if step_s else None
        estimate = bound * efficiency if bound and efficiency else None
        unit = f"audio s/s (RTF ≥ {step_s / work.units_per_stream_step:.3g})"
        basis = f"× {efficiency:.1%} measured efficiency" if efficiency else "—"
        rows.append(_row("tts", f"{steps} diffusion steps", bound, estimate, unit, demand, basis))
    return rows


def predicted_variants(chosen: dict[str, RecordedSweep], sessions: Sessions) -> list[PredictedVariant]:
    rows = []
    if "asr" in chosen:
        rows += _asr_rows(chosen["asr"], sessions)
    if "tts" in chosen:
        rows += _tts_rows(chosen["tts"], sessions)
    return rows
