"""The roofline prediction per concurrency level: the best a step can do on the measured ceilings.

    step time ≥ max(bytes(B) ÷ bandwidth, FLOPs(B) ÷ peak)
    throughput ≤ B × units per stream-step ÷ step time        (tokens/s, audio s/s)
    crossover B* = (ridge·bytes_fixed − flops_fixed) ÷ (flops_per_stream − ridge·bytes_per_stream)

where B = min(concurrency, the admission limit) and ridge = peak ÷ bandwidth. A level's measured throughput over
the predicted one is its efficiency against the roofline; more than 100% means the measurement or the model is
wrong (an artefact), never that the device beat physics.
"""

from __future__ import annotations

import dataclasses
import math

from loadgen.analysis.work import StepWork
from loadgen.results import LevelResult, ServiceFacts


@dataclasses.dataclass
class Prediction:
    batch: int  # streams sharing one step (or, unbatched, running side by side on the device)
    read_bytes_per_step: float
    flops_per_step: float
    bytes_time_s: float  # bytes ÷ measured bandwidth
    flops_time_s: float  # FLOPs ÷ measured peak
    step_time_s: float  # the larger of the two: the roofline bound on one step
    bound: str  # "bandwidth" | "compute": which of the two sets the step time
    throughput: float  # best possible units/s over all streams (tokens/s, audio s/s)
    per_stream_speed: float  # best possible units/s seen by one stream (tokens/s, 1/RTF)
    measured_throughput: float
    ratio: float  # efficiency against the roofline: measured ÷ predicted throughput (paced: see ratio_basis)
    first_latency_s: float | None = None  # predicted TTFT (LLM prefill) where the prompt length is known
    measured_step_s: float | None = None  # p50 of what one stream waits per step: ITL, chunk latency, patch gap
    # Paced streams (ASR) only ever offer real time, so their throughput says nothing about efficiency; their
    # ratio is roofline step time ÷ measured step time instead, when the step was measured.
    ratio_basis: str = "throughput"

    @property
    def intensity(self) -> float:
        return self.flops_per_step / self.read_bytes_per_step if self.read_bytes_per_step else 0.0

    @property
    def attainable_flops_per_s(self) -> float:
        return self.flops_per_step / self.step_time_s if self.step_time_s else 0.0


def step_bound(work: StepWork, facts: ServiceFacts, batch: float) -> tuple[float, float, float]:
    """(bytes time, FLOPs time, step time) of one step serving `batch` streams."""
    bandwidth, peak = facts.memory_bandwidth_bytes_per_s, facts.peak_flops_per_s
    bytes_time = work.read_bytes(batch) / bandwidth if bandwidth else 0.0
    flops_time = work.flops(batch) / peak if peak else 0.0
    return bytes_time, flops_time, max(bytes_time, flops_time)


def active_batch(work: StepWork, concurrency: int) -> int:
    return min(concurrency, work.max_batch) if work.max_batch else concurrency


# Per-stream latency of one step, as the load generator measures it (p50), by target.
STEP_LATENCY = {"llm": "itl_s", "openai": "itl_s", "asr": "chunk_latency_s", "tts": "chunk_gap_s"}


def measured_step(level: LevelResult, target: str) -> float | None:
    latency = level.latency.get(STEP_LATENCY.get(target, ""))
    return latency.p50 if latency and latency.count else None


def predict_level(
    work: StepWork, facts: ServiceFacts, level: LevelResult, prompt_tokens: float | None = None, target: str = ""
) -> Prediction:
    batch = active_batch(work, level.concurrency)
    bytes_time, flops_time, step_time = step_bound(work, facts, batch)
    capacity = batch * work.units_per_stream_step / step_time if step_time else 0.0
    # Paced streams (ASR) offer one audio second per second each: the bound is the smaller of offer and capacity.
    throughput = min(capacity, float(level.concurrency)) if work.paced else capacity
    first_latency = None
    if prompt_tokens and work.prefill_flops_per_token and facts.peak_flops_per_s and facts.memory_bandwidth_bytes_per_s:
        # Prefill computes the whole prompt in one pass: compute-bound for all but tiny prompts.
        prefill_flops = work.prefill_flops_per_token * prompt_tokens
        weights_s = work.bytes_fixed / facts.memory_bandwidth_bytes_per_s
        first_latency = max(weights_s, prefill_flops / facts.peak_flops_per_s)
    step_measured = measured_step(level, target)
    ratio, basis = (level.throughput / throughput if throughput else 0.0), "throughput"
    if work.paced and step_measured:
        ratio, basis = step_time / step_measured, "step time"
    return Prediction(
        batch=batch,
        read_bytes_per_step=work.read_bytes(batch),
        flops_per_step=work.flops(batch),
        bytes_time_s=bytes_time,
        flops_time_s=flops_time,
        step_time_s=step_time,
        bound="compute" if flops_time > bytes_time else "bandwidth",
        throughput=throughput,
        per_stream_speed=work.units_per_stream_step / step_time if step_time else 0.0,
        measured_throughput=level.throughput,
        ratio=ratio,
        first_latency_s=first_latency,
        measured_step_s=step_measured,
        ratio_basis=basis,
    )


def crossover_batch(work: StepWork, facts: ServiceFacts) -> float | None:
    """Streams per step at which FLOPs time overtakes bytes time; None if adding streams never gets there.

    Solves bytes(B)/bandwidth = FLOPs(B)/peak for B. Unbatched work (TTS) never crosses over: each added stream
    brings its own bytes, so the intensity of a step does not change with concurrency.
    """
    ridge = facts.ridge_flops_per_byte
    if not ridge or not work.batched:
        return None
    slope = work.flops_per_stream - ridge * work.bytes_per_stream
    if slope <= 0:  # each added stream is itself below the ridge (e.g. long-context attention)
        return None
    return max(1.0, (ridge * work.bytes_fixed - work.flops_fixed) / slope)


def realtime_streams(
    work: StepWork, facts: ServiceFacts, overhead_s: float = 0.0, overhead_per_stream_s: float = 0.0
) -> int | None:
    """Most streams whose step still fits in the audio one step makes (ASR chunk, TTS patch): RTF ≤ 1.

    Optionally with a measured overhead on top of the roofline time: `overhead_s` per step plus
    `overhead_per_stream_s` per stream per step (launches, Python, per-stream bookkeeping).
    """
    if work.unit != "audio s":
        return None
    budget = work.units_per_stream_step - overhead_s
    if budget <= 0:
        return 0
    if not work.batched:  # B unbatched streams share the device: B × single-stream time ≤ patch
        single = step_bound(work, facts, 1)[2] + overhead_per_stream_s
        return math.floor(budget / single) if single else None
    # overhead + bytes(B)/bw ≤ chunk and overhead + flops(B)/peak ≤ chunk, both linear in B.
    limits = []
    for fixed, per, ceiling in (
        (work.bytes_fixed, work.bytes_per_stream, facts.memory_bandwidth_bytes_per_s),
        (work.flops_fixed, work.flops_per_stream, facts.peak_flops_per_s),
    ):
        if not ceiling:
            return None
        room = budget * ceiling - fixed
        per_stream = per + overhead_per_stream_s * ceiling
        if room < per_stream:
            return 0
        if per_stream > 0:
            limits.append(room / per_stream)
    return math.floor(min(limits)) if limits else None
