"""The predicted-vs-measured table: component | what determines its time | predicted | measured | agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadgen.analysis.formats import rate, seconds, si
from loadgen.analysis.predict import realtime_streams
from loadgen.analysis.regimes import ARTEFACT_CEILING
from loadgen.analysis.verdicts import LevelVerdict, SweepAnalysis
from loadgen.analysis.work import StepWork
from loadgen.results import LevelResult, ServiceFacts


def _row(component: str, what: str, predicted: str, measured: str, agreement: str) -> dict[str, str]:
    return {"component": component, "what": what, "predicted": predicted, "measured": measured, "agreement": agreement}


def _agreement(ratio: float) -> str:
    """Measured as a share of a bound; over the bound is an artefact, not a success."""
    if ratio <= 0:
        return "—"
    text = f"{ratio:.0%} of the bound"
    return text + " (above the bound: artefact)" if ratio > ARTEFACT_CEILING else text


def _step_row(analysis: SweepAnalysis, verdict: LevelVerdict, label: str) -> dict[str, str]:
    p, work = verdict.predicted, analysis.work
    if p.bound == "bandwidth":
        bandwidth = si(analysis.memory_bandwidth_bytes_per_s, "B/s")
        what = f"bytes ÷ bandwidth: {si(p.read_bytes_per_step, 'B')} ÷ {bandwidth}"
    else:
        what = f"FLOPs ÷ peak: {si(p.flops_per_step, 'FLOP')} ÷ {si(analysis.peak_flops_per_s, 'FLOP/s')}"
    streams = f"batch {p.batch}" if work.batched else f"{p.batch} side by side"
    if p.ratio_basis == "step time":
        return _row(
            f"{label}, C={verdict.concurrency} ({streams})",
            what,
            f"{seconds(p.step_time_s)} per step ({rate(p.throughput, work.unit)} offered)",
            f"{seconds(p.measured_step_s)} chunk latency p50 ({rate(p.measured_throughput, work.unit)})",
            _agreement(p.ratio),
        )
    return _row(
        f"{label}, C={verdict.concurrency} ({streams})",
        what,
        f"{rate(p.throughput, work.unit)} ({seconds(p.step_time_s)} per step)",
        rate(p.measured_throughput, work.unit),
        _agreement(p.ratio),
    )


def _latency_p50(level: LevelResult, *names: str) -> float | None:
    for name in names:
        if name in level.latency and level.latency[name].count:
            return level.latency[name].p50
    return None


def _time_row(component: str, what: str, predicted: float | None, measured: float | None) -> dict[str, str]:
    """A time bound (predicted ≤ measured when the model is right): agreement = predicted ÷ measured."""
    agreement = _agreement(predicted / measured) if predicted and measured else "—"
    return _row(component, what, seconds(predicted), seconds(measured), agreement)


def predictions_table(
    analysis: SweepAnalysis, facts: ServiceFacts, levels: Sequence[LevelResult]
) -> list[dict[str, str]]:
    verdicts, work = analysis.levels, analysis.work
    label = {"tokens": "decode"}.get(work.unit, f"{analysis.target} step")
    picks = [0, analysis.knee_index, len(verdicts) - 1]
    rows = []
    for index in dict.fromkeys(i for i in picks if i is not None):
        tag = " (knee)" if index == analysis.knee_index else ""
        rows.append(_step_row(analysis, verdicts[index], label + tag))
    first, first_level = verdicts[0], levels[0]
    if work.unit == "tokens" and first.predicted.first_latency_s:
        rows.append(
            _time_row(
                f"prefill (TTFT p50), C={first.concurrency}",
                "2·params·prompt tokens ÷ peak (compute-bound)",
                first.predicted.first_latency_s,
                _latency_p50(first_level, "ttft_s"),
            )
        )
    if analysis.target == "asr":
        chunk_ms = work.units_per_stream_step * 1000
        rows.insert(0, _row("chunk", "(right context + 1) × 80 ms encoder frames", f"{chunk_ms:.0f} ms", "—", "—"))
    if analysis.target == "tts":
        rows += _tts_rows(first, first_level, work)
    if analysis.predicted_realtime_streams is not None:
        rows.append(_realtime_row(analysis, facts))
    if work.batched:
        rows.append(_crossover_row(analysis, facts))
    return rows


def _tts_rows(first: LevelVerdict, first_level: LevelResult, work: StepWork) -> list[dict[str, str]]:
    """The real-time factor and first audio at the lowest level, from one patch step."""
    patch = work.units_per_stream_step
    measured_rtf = 1 / first_level.per_request_speed if first_level.per_request_speed else None
    return [
        _row(
            f"real-time factor, C={first.concurrency}",
            f"time per patch ÷ {patch * 1000:.0f} ms (patches one after another)",
            f"{first.predicted.step_time_s / patch:.3g}",
            f"{measured_rtf:.3g}" if measured_rtf else "—",
            _agreement(first.predicted.step_time_s / patch / measured_rtf) if measured_rtf else "—",
        ),
        _time_row(
            f"first audio p50, C={first.concurrency}",
            "one patch step (text prefill left out)",
            first.predicted.step_time_s,
            _latency_p50(first_level, "first_audio_s"),
        ),
    ]


def _realtime_row(analysis: SweepAnalysis, facts: ServiceFacts) -> dict[str, str]:
    work, verdicts = analysis.work, analysis.levels
    measured = analysis.realtime_limit
    reached = measured is not None and any(v.realtime_ok is False for v in verdicts)
    measured_text = "—" if measured is None else (str(measured) if reached else f"≥ {measured} (limit not reached)")
    predicted = analysis.predicted_realtime_streams
    device = realtime_streams(work, facts)
    capped = f" (the limit of {work.max_batch}; the device allows {device})" if device != predicted else ""
    return _row(
        "real-time streams",
        "most streams whose step fits in the audio it produces (RTF ≤ 1)",
        f"{predicted}{capped}",
        measured_text,
        _agreement(measured / predicted) if reached and predicted else "—",
    )


def _crossover_row(analysis: SweepAnalysis, facts: ServiceFacts) -> dict[str, str]:
    """The predicted crossover batch against where the counters' intensity reaches the ridge (and the knee)."""
    crossover, knee, verdicts = analysis.crossover_concurrency, analysis.knee_concurrency, analysis.levels
    knee_text = f"knee at C={knee}" if knee else f"no knee up to C={verdicts[-1].concurrency}"
    measured = measured_crossover(verdicts, facts.ridge_flops_per_byte)
    if measured is not None:
        measured_text = f"counters' intensity reaches the ridge at C ≈ {measured:.0f}; {knee_text}"
        agreement = f"measured ÷ predicted = {measured / crossover:.2g}" if crossover else "—"
    else:
        measured_text = knee_text + "; counters' intensity stays below the ridge"
        agreement = f"knee ÷ crossover = {knee / crossover:.2g}" if knee and crossover else "—"
    return _row(
        "crossover to compute-bound",
        f"ridge {facts.ridge_flops_per_byte:.3g} FLOP/B × bytes per step ÷ FLOPs per stream",
        f"batch ≈ {crossover:.0f}" if crossover else "never",
        measured_text,
        agreement,
    )


def measured_crossover(verdicts: Sequence[LevelVerdict], ridge: float) -> float | None:
    """The concurrency at which the levels' measured arithmetic intensity (the service's work counters: FLOPs ÷
    bytes, prefills included) first reaches the ridge, interpolated on log2(C) between the levels either side;
    None when no level's counters reach it (or a sweep has none)."""
    counted = [v for v in verdicts if v.utilisation_source == "counters" and v.arithmetic_intensity > 0]
    if not ridge or not counted or counted[-1].arithmetic_intensity < ridge:
        return None
    if counted[0].arithmetic_intensity >= ridge:
        return float(counted[0].concurrency)
    for low, high in zip(counted, counted[1:], strict=False):
        if low.arithmetic_intensity < ridge <= high.arithmetic_intensity:
            share = math.log(ridge / low.arithmetic_intensity) / math.log(
                high.arithmetic_intensity / low.arithmetic_intensity
            )
            return 2 ** (math.log2(low.concurrency) + share * math.log2(high.concurrency / low.concurrency))
    return None
