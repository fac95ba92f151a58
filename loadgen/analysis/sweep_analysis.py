"""`analyse`: one sweep's facts and levels in, a verdict per level, the knee and predicted-vs-measured out."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import loadgen.analysis.regimes as regimes
from loadgen.analysis.predict import Prediction, crossover_batch, predict_level, realtime_streams
from loadgen.analysis.recorded import workload_hints
from loadgen.analysis.table import predictions_table
from loadgen.analysis.verdicts import LevelVerdict, SweepAnalysis
from loadgen.analysis.work import STEP_MODELS, StepWork, step_work
from loadgen.results import LevelResult, ServiceFacts


def _utilisation(level: LevelResult, facts: ServiceFacts, predicted: Prediction | None) -> tuple[float, float, str]:
    if level.server.read_bytes_per_s or level.server.flops_per_s:
        return (*regimes.utilisations(level, facts), "counters")
    if predicted is None:
        return 0.0, 0.0, "none"
    # No counters: the work the model says each step did, at the step rate the throughput implies.
    share = predicted.ratio / predicted.step_time_s if predicted.step_time_s else 0.0
    return share * predicted.bytes_time_s, share * predicted.flops_time_s, "estimated"


def _crossover_sentence(
    crossover: float | None,
    work: StepWork | None,
    knee: LevelVerdict | None,
    levels: Sequence[LevelVerdict],
    no_model: str = "",
) -> str:
    if work is None:
        return f"No roofline prediction for this target: {no_model}."
    if crossover is None:
        return _no_crossover(work)
    where = f"The step is predicted to turn compute-bound at a batch of ≈{crossover:.0f}"
    if work.max_batch and crossover > work.max_batch:
        where += f", beyond the admission limit of {work.max_batch}, so it never does in this configuration"
    if knee is None:
        return _crossover_without_knee(where, crossover, work, levels)
    return _crossover_against_knee(where, crossover, work, knee)


def _no_crossover(work: StepWork) -> str:
    if not work.batched:
        return (
            "No crossover: requests are not batched (one per worker), so every stream re-reads the weights for "
            "each step and concurrency never raises the arithmetic intensity; throughput is capped by the "
            "device (or the workers) from the start."
        )
    return (
        "No crossover: each added stream brings more bytes than the ridge can turn into compute (KV/cache "
        "reads grow as fast as FLOPs), so the step stays bandwidth-bound at any batch."
    )


def _crossover_without_knee(where: str, crossover: float, work: StepWork, levels: Sequence[LevelVerdict]) -> str:
    """A predicted crossover but no measured knee: why the sweep did not show it."""
    highest = levels[-1].concurrency
    if crossover > highest:
        return f"{where}; no knee was measured up to C={highest}, consistent with the prediction."
    past = [v for v in levels if v.concurrency >= crossover]
    if all(v.regime == "overhead-bound" for v in past):
        busy = max(max(v.bandwidth_utilisation, v.flop_utilisation) for v in past)
        return (
            f"{where}, but every level from there on stayed overhead-bound (the device at most {busy:.1%} "
            "busy): per-step overhead, not the device, sets the pace, so the crossover cannot show."
        )
    if work.paced:
        return (
            f"{where}; paced streams only offer real time, so throughput follows the streams offered until "
            f"they stop keeping up, which they still did at C={highest}."
        )
    return (
        f"{where}, yet throughput kept scaling up to C={highest}: the step was further from its roofline than "
        "the model says (small-batch kernels run below the probe's peak), so the compute roof came later."
    )


def _crossover_against_knee(where: str, crossover: float, work: StepWork, knee: LevelVerdict) -> str:
    """A predicted crossover and a measured knee: do they agree, and if not, why."""
    ratio = knee.concurrency / crossover
    if 0.5 <= ratio <= 2:
        return f"{where}; the measured knee at C={knee.concurrency} agrees within a factor of two."
    if ratio > 2:
        return (
            f"{where}, but the knee comes later, at C={knee.concurrency}: small-batch matmuls run below the "
            "probe's peak, so the effective ridge is higher than the measured one."
        )
    why = {
        "overhead-bound": "per-step overhead (launches, Python scheduling, gRPC) grows with the batch and keeps the "
        "device from its roofline",
        "bandwidth-bound": "the step stays bandwidth-bound: KV-cache and attention reads grow with the batch",
        "compute-bound": "compute saturates early: FLOPs beyond 2·params (attention, sampling, interleaved prefill) "
        "or an effective peak below the probe's matmul",
        "queueing": "requests queue (admission limit or scheduler) before the device is full",
    }[knee.regime]
    if work.max_batch and knee.concurrency >= work.max_batch:
        why = f"the admission limit of {work.max_batch} streams caps the batch"
    return f"{where}, but the knee comes earlier, at C={knee.concurrency}: {why}."


def _roofline(facts: ServiceFacts, verdicts: Sequence[LevelVerdict]) -> dict:
    """Data for the roofline plot: the ceilings as a line, the predictions and the measurements as points."""
    bandwidth, peak, ridge = (
        facts.memory_bandwidth_bytes_per_s,
        facts.peak_flops_per_s,
        facts.ridge_flops_per_byte,
    )
    predicted = [v for v in verdicts if v.predicted]
    intensities = [v.arithmetic_intensity for v in verdicts] + [v.predicted.intensity for v in predicted]
    known = [x for x in intensities if x > 0] or [1.0]
    low = min(min(known), ridge or 1.0) / 4
    high = max(max(known), ridge or 1.0) * 4
    xs = [low * (high / low) ** (i / 63) for i in range(64)]
    return {
        "ridge_flops_per_byte": ridge,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "peak_flops_per_s": peak,
        "ceiling": {"intensity": xs, "flops_per_s": [min(peak, x * bandwidth) for x in xs]},
        "predicted": {
            "concurrency": [v.concurrency for v in predicted],
            "intensity": [v.predicted.intensity for v in predicted],
            "flops_per_s": [v.predicted.attainable_flops_per_s for v in predicted],
        },
        "measured": {
            "concurrency": [v.concurrency for v in verdicts],
            "intensity": [v.arithmetic_intensity for v in verdicts],
            "flops_per_s": [v.flop_utilisation * peak for v in verdicts],
            "regime": [v.regime for v in verdicts],
            "artefact": [bool(v.artefact) for v in verdicts],
        },
    }


def analyse(
    facts: ServiceFacts, levels: list[LevelResult], target: str, workload: Mapping[str, float] | Any = None
) -> SweepAnalysis:
    """Verdicts, knee and predictions for one target's sweep.

    `workload`: the sweep's `Workload` (or a mapping of means: `prompt_tokens`, `output_tokens`, `chunk_ms`,
    `inference_timesteps`). It gives the LLM's KV-cache and prefill terms (without it: the weights-only bound),
    the ASR chunk the streams used and the TTS diffusion steps.
    """
    if not levels:
        raise ValueError("analyse needs at least one level")
    if dataclasses.is_dataclass(workload):
        workload = workload_hints(dataclasses.asdict(workload))
    elif workload is not None:
        workload = workload_hints(workload)
    levels = sorted(levels, key=lambda level: level.concurrency)
    work, no_model = _step_model(facts, levels, target, workload)
    prompt_tokens = (workload or {}).get("prompt_tokens") if work and work.unit == "tokens" else None
    verdicts = [
        _level_verdict(level, levels[index - 1] if index else None, facts, target, work, prompt_tokens)
        for index, level in enumerate(levels)
    ]
    knee_index = regimes.find_knee(levels)
    knee = verdicts[knee_index] if knee_index is not None else None
    crossover = crossover_batch(work, facts) if work else None
    realtime_limit = regimes.realtime_limit(levels)
    predicted_realtime = realtime_streams(work, facts) if work else None
    if predicted_realtime is not None and work.max_batch:
        predicted_realtime = min(predicted_realtime, work.max_batch)
    if knee:
        knee_sentence = f"Knee at C={knee.concurrency} ({knee.regime}): doubling concurrency stops paying there."
    else:
        knee_sentence = f"No knee up to C={levels[-1].concurrency}: throughput still scales with concurrency."
    analysis = SweepAnalysis(
        target=target,
        device=facts.device_name or facts.device,
        memory_bandwidth_bytes_per_s=facts.memory_bandwidth_bytes_per_s,
        peak_flops_per_s=facts.peak_flops_per_s,
        ridge_flops_per_byte=facts.ridge_flops_per_byte,
        work=work,
        levels=verdicts,
        knee_index=knee_index,
        knee_concurrency=knee.concurrency if knee else None,
        knee_regime=knee.regime if knee else None,
        knee_sentence=knee_sentence,
        crossover_concurrency=None if crossover is None or math.isinf(crossover) else crossover,
        crossover_sentence=_crossover_sentence(crossover, work, knee, verdicts, no_model),
        realtime_limit=realtime_limit,
        predicted_realtime_streams=predicted_realtime,
        rules=list(regimes.RULES),
        predictions_table=[],
        roofline=_roofline(facts, verdicts),
        summary=_summary(target, knee_sentence, realtime_limit, verdicts),
    )
    # The table reads the analysis (verdicts, knee, crossover): it is the last thing made from it.
    return (
        dataclasses.replace(analysis, predictions_table=predictions_table(analysis, facts, levels))
        if work
        else analysis
    )


def _step_model(
    facts: ServiceFacts, levels: list[LevelResult], target: str, workload: Mapping[str, float] | None
) -> tuple[StepWork | None, str]:
    """The model of one engine step's work for `target`, or None and why there is none."""
    if facts.remote:
        return None, "the engine is remote, its weights, shape and device unknown here"
    if target not in STEP_MODELS:
        return None, "it spans several services: see each service's own sweep"
    try:
        return step_work(target, facts, levels, workload), ""
    except ValueError as missing:  # e.g. a peer server with no GetInfo: verdicts from latency alone
        return None, str(missing)


def _level_verdict(
    level: LevelResult,
    previous: LevelResult | None,
    facts: ServiceFacts,
    target: str,
    work: StepWork | None,
    prompt_tokens: float | None,
) -> LevelVerdict:
    """One level's regime, with its reasons, utilisation and prediction."""
    predicted = predict_level(work, facts, level, prompt_tokens, target) if work else None
    bandwidth, flops, source = _utilisation(level, facts, predicted)
    regime, reasons = regimes.label(level, previous, facts, target, (bandwidth, flops), measured=source != "none")
    if source == "estimated":
        reasons.append("utilisation estimated from throughput × the model's work per step (no counters)")
    if level.realtime_ok is not None:
        reasons.append("kept real time" if level.realtime_ok else "fell behind real time (RTF ≥ 1 or underruns)")
    return LevelVerdict(
        concurrency=level.concurrency,
        regime=regime,
        reasons=reasons,
        artefact=regimes.artefact(level, facts, (bandwidth, flops), predicted.ratio if predicted else 0.0),
        bandwidth_utilisation=bandwidth,
        flop_utilisation=flops,
        arithmetic_intensity=flops / bandwidth * facts.ridge_flops_per_byte if bandwidth else 0.0,
        utilisation_source=source,
        predicted=predicted,
        realtime_ok=level.realtime_ok,
    )


def _summary(target: str, knee_sentence: str, realtime_limit: int | None, verdicts: list[LevelVerdict]) -> str:
    summary = f"{target}: {knee_sentence}"
    if realtime_limit:
        summary += f" Real-time up to C={realtime_limit}."
    elif realtime_limit == 0:
        summary += " Not real-time at any level."
    artefacts = [v.concurrency for v in verdicts if v.artefact]
    if artefacts:
        summary += f" Artefacts at C={', '.join(map(str, artefacts))}."
    return summary
