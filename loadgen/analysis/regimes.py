"""Regime labels, the knee and measurement artefacts: the rules, each written once, in code and in words.

The words in `RULES` go into every report verbatim, so a reader can check each verdict by hand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadgen.analysis.formats import share
from loadgen.results import LevelResult, ServiceFacts

BOUND_FRACTION = 0.5  # a resource at ≥ 50% of its measured ceiling is what bounds the step
FLAT_SCALING = 0.1  # throughput gained < 10% of the ideal (proportional) gain: flat
QUEUE_LATENCY_GROWTH = 0.5  # latency grew by ≥ half the concurrency growth: requests are waiting
KNEE_SCALING = 0.25  # past the knee no later level gains ≥ 25% of the ideal proportional gain
ARTEFACT_CEILING = 1.0  # above a measured ceiling cannot be real ...
PROBE_NOISE = 1.10  # ... though up to 10% above it is most likely noise of the ceiling probe
CACHE_RESIDENT_BYTES = 64 << 20  # CPU weights this small can live in the last-level cache
REMOTE = "remote: not classified"

# Latencies whose growth shows queueing, most telling first, per target (the first one a level has is used).
QUEUE_LATENCIES = {
    "llm": ("ttft_s", "latency_s", "e2e_s"),
    "openai": ("ttft_s", "latency_s", "e2e_s"),
    "asr": ("final_latency_s", "chunk_latency_s", "latency_s"),
    "tts": ("first_audio_s", "latency_s"),
}

RULES = [
    "Utilisation: bandwidth utilisation = achieved read bytes/s ÷ measured read bandwidth; FLOP utilisation = "
    "achieved FLOP/s ÷ measured matmul peak. Achieved figures are the service's model-derived work counters "
    "(bytes and FLOPs each engine step must move and compute, from the model shape) divided by the level's duration.",
    "Arithmetic intensity = achieved FLOP/s ÷ achieved bytes/s; ridge = peak ÷ bandwidth. Below the ridge the "
    "binding resource is memory bandwidth, above it compute; the roofline utilisation is the larger of the two "
    "utilisations.",
    "queueing: the level reported errors (admission refused, deadline), or, against the previous level, throughput "
    f"gained < {FLAT_SCALING:.0%} of the proportional gain while the queue-sensitive latency p50 (LLM TTFT, ASR "
    f"final latency, TTS first audio) grew by ≥ {QUEUE_LATENCY_GROWTH:.0%} of the concurrency growth (Little's law: "
    "at a fixed throughput, latency grows with concurrency). For ASR, whose audio arrives in real time, also a "
    "level that fell behind real time when the level before it kept up.",
    f"compute-bound: not queueing, roofline utilisation ≥ {BOUND_FRACTION:.0%} and intensity ≥ ridge.",
    f"bandwidth-bound: not queueing, roofline utilisation ≥ {BOUND_FRACTION:.0%} and intensity < ridge.",
    f"overhead-bound: not queueing, both utilisations < {BOUND_FRACTION:.0%}: the device idles more than half of "
    "each step, so launch, Python, scheduling or gRPC overhead sets the pace.",
    "unknown: not queueing, and the target reported no work counters and has no step model or ceilings (a peer "
    "server): nothing says how busy the device was.",
    f"{REMOTE}: the service relays to an engine on another server (GetInfo device 'remote'), whose device, weights "
    "and ceilings it cannot know: no regime is claimed; throughput, latencies and the knee are still measured.",
    f"Knee: the first level after which no higher level gains ≥ {KNEE_SCALING:.0%} of the proportional throughput "
    "gain (T_j < T_k·(1 + 0.25·(C_j/C_k − 1)) for every j > k): where doubling concurrency stops paying.",
    "Artefact: a level whose achieved bytes/s or FLOP/s exceeds the measured ceiling, or whose measured throughput "
    "exceeds the roofline prediction; the likely cause is named (up to 10% over: most likely noise of the ceiling "
    "probe) and the level's verdict is not to be trusted.",
    "Real time (ASR, TTS): a level is real-time when every stream kept up (per-stream real-time factor < 1, no "
    "playback underruns); the real-time limit is the highest concurrency up to which every level was real-time.",
]


def utilisations(level: LevelResult, facts: ServiceFacts) -> tuple[float, float]:
    ceiling_bandwidth, peak = facts.memory_bandwidth_bytes_per_s, facts.peak_flops_per_s
    bandwidth = level.server.read_bytes_per_s / ceiling_bandwidth if ceiling_bandwidth else 0.0
    flops = level.server.flops_per_s / peak if peak else 0.0
    return bandwidth, flops


def queue_latency(level: LevelResult, target: str) -> tuple[str, float] | None:
    for name in QUEUE_LATENCIES.get(target, ()) + tuple(level.latency):
        if name in level.latency and level.latency[name].count:
            return name, level.latency[name].p50
    return None


def scaling_efficiency(low: LevelResult, high: LevelResult) -> float:
    """Throughput gained from `low` to `high` as a share of the proportional gain (1 = linear scaling)."""
    growth = high.concurrency / low.concurrency - 1
    if growth <= 0 or low.throughput <= 0:
        return 0.0
    return (high.throughput / low.throughput - 1) / growth


def queueing_reason(level: LevelResult, previous: LevelResult | None, target: str) -> str:
    """Why the level is queueing, or "" if it is not."""
    if level.errors:
        return f"{level.errors} of {level.requests + level.errors} requests failed (admission or deadline)"
    if previous is None:
        return ""
    if target == "asr" and level.realtime_ok is False and previous.realtime_ok:
        # Paced audio keeps arriving: once steps fall behind, chunks wait, whatever the throughput says.
        return f"fell behind real time while C={previous.concurrency} kept up: chunks wait for the engine"
    efficiency = scaling_efficiency(previous, level)
    now, before = queue_latency(level, target), queue_latency(previous, target)
    if efficiency >= FLAT_SCALING or not now or not before or before[1] <= 0:
        return ""
    growth = level.concurrency / previous.concurrency - 1
    latency_growth = now[1] / before[1] - 1
    if latency_growth < QUEUE_LATENCY_GROWTH * growth:
        return ""
    return (
        f"throughput flat ({efficiency:.0%} of proportional gain from C={previous.concurrency}) while {now[0]} p50 "
        f"grew {now[1] / before[1]:.1f}× for {level.concurrency / previous.concurrency:.1f}× the concurrency"
    )


def label(
    level: LevelResult,
    previous: LevelResult | None,
    facts: ServiceFacts,
    target: str,
    utilisation: tuple[float, float],
    measured: bool = True,
) -> tuple[str, list[str]]:
    """The level's regime and the reasons, in words, with the numbers that decided it.

    `measured` is False when neither work counters nor a step model exist: only queueing can be told then.
    """
    if facts.remote:
        queueing = queueing_reason(level, previous, target)
        return REMOTE, [
            "the engine is remote: its device, weights and ceilings are unknown here",
            *([f"latency suggests queueing: {queueing}"] if queueing else []),
        ]
    bandwidth, flops = utilisation
    ridge = facts.ridge_flops_per_byte
    # = achieved FLOP/s ÷ achieved bytes/s; FLOPs with no bytes counted sit far right of the ridge.
    intensity = flops / bandwidth * ridge if bandwidth else (math.inf if flops else 0.0)
    reasons = [
        f"bandwidth {share(bandwidth)} and FLOPs {share(flops)} of the measured ceilings; intensity "
        f"{intensity:.1f} FLOP/byte vs ridge {ridge:.1f}"
    ]
    queueing = queueing_reason(level, previous, target)
    if queueing:
        return "queueing", [queueing, *reasons] if measured else [queueing]
    if not measured or not (facts.memory_bandwidth_bytes_per_s and facts.peak_flops_per_s):
        return "unknown", ["no work counters, step model or ceilings: only queueing can be judged"]
    roof = max(bandwidth, flops)
    if roof < BOUND_FRACTION:
        reasons.append(
            f"device busy at most {share(roof)} of the time: per-step overhead (launches, Python, scheduling, gRPC) "
            "sets the pace"
        )
        return "overhead-bound", reasons
    if ridge and intensity >= ridge:
        reasons.append(f"intensity above the ridge and {flops:.0%} of peak FLOP/s")
        return "compute-bound", reasons
    reasons.append(f"intensity below the ridge and {bandwidth:.0%} of read bandwidth")
    return "bandwidth-bound", reasons


def artefact(level: LevelResult, facts: ServiceFacts, utilisation: tuple[float, float], ratio: float) -> str:
    """Why a level's figures cannot be real, with the likely cause, or "" when they can be."""
    bandwidth, flops = utilisation
    noise = "within 10% of it: most likely run-to-run noise of the ceiling probe or of the counters' window"
    if bandwidth > ARTEFACT_CEILING:
        if bandwidth <= PROBE_NOISE:
            cause = noise
        elif facts.device.startswith("cpu") and facts.weight_bytes and facts.weight_bytes <= CACHE_RESIDENT_BYTES:
            cause = (
                f"the weights ({facts.weight_bytes / 2**20:.0f} MiB) fit in the CPU caches, so steps read them from "
                "cache, faster than the DRAM bandwidth the probe measured"
            )
        else:
            cause = (
                "the counters count bytes the step did not move from memory (cache hits, prefix-cached or padded "
                "tokens), or the bandwidth probe was slowed by other work on the machine"
            )
        return f"achieved read bandwidth is {bandwidth:.0%} of the measured ceiling: {cause}"
    if flops > ARTEFACT_CEILING:
        cause = (
            noise
            if flops <= PROBE_NOISE
            else (
                "the counters count FLOPs that did not run (padded, cached or skipped tokens), or the peak probe (one "
                "square matmul size) under-measured the device"
            )
        )
        return f"achieved FLOP/s is {flops:.0%} of the measured peak: {cause}"
    if ratio > ARTEFACT_CEILING:
        cause = (
            noise
            if ratio <= PROBE_NOISE
            else (
                "the model's bytes per step are overstated (e.g. weights served from cache, tied embeddings counted "
                "twice) or the ceilings were under-measured"
            )
        )
        return f"measured throughput is {ratio:.0%} of the roofline bound: {cause}"
    return ""


def find_knee(levels: Sequence[LevelResult]) -> int | None:
    """Index of the knee: the first level after which no higher level pays (see RULES); None if all pay."""
    for index, knee in enumerate(levels[:-1]):
        if knee.throughput <= 0:
            continue
        later = levels[index + 1 :]
        if all(
            lv.throughput < knee.throughput * (1 + KNEE_SCALING * (lv.concurrency / knee.concurrency - 1))
            for lv in later
        ):
            return index
    return None


def realtime_limit(levels: Sequence[LevelResult]) -> int | None:
    """Highest concurrency up to which every level kept real time; None if no level says, 0 if none kept it."""
    if all(level.realtime_ok is None for level in levels):
        return None
    limit = 0
    for level in levels:
        if level.realtime_ok is False:
            break
        if level.realtime_ok:
            limit = level.concurrency
    return limit
