"""Capacity plan: how many replicas of each service a number of concurrent voice sessions needs, from measured sweeps.

For every service the plan picks an operating point per replica: the highest *measured* concurrency level up to
which every level met the service's objectives (no errors, objective latency p95, real time / no underruns). It
never goes past the highest level measured. A session creates demand on each service:

    ASR streams   = sessions × speaking share                       (the user talks; one real-time stream each)
    LLM tokens/s  = sessions × listening share × tokens per second of reply speech
    TTS audio s/s = sessions × listening share                      (the agent talks; audio at real time)

replicas = ⌈demand ÷ capacity per replica⌉; headroom = 1 − demand ÷ (replicas × capacity per replica). The
voice-to-voice p95 is estimated as the sum of the three stages' p95s at their operating points (a sum of p95s
bounds the p95 of the sum from above); while it misses its objective, the stage whose p95 falls most by one level
down is stepped down. The bottleneck is the service that needs the most replicas for its share of the work.

`python -m loadgen plan RESULTS... --sessions N` prints the plan (plan.md and plan.json with --out).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from loadgen.analysis.plan_model import CapacityPlan, MeasuredVariant, Objectives, ServicePlan, Sessions
from loadgen.analysis.plan_render import render_plan
from loadgen.analysis.plan_variants import predicted_variants
from loadgen.analysis.recorded import RecordedSweep, read_sweeps

PLANNED = ("asr", "llm", "tts")
OBJECTIVE_LATENCY = {"asr": "final_latency_s", "llm": "ttft_s", "tts": "first_audio_s"}
VOICE_LATENCY = "voice_to_voice_s"


def _failure(level, target: str, objectives: Objectives) -> str:
    """Why a level cannot be an operating point, or ""."""
    if level.errors:
        return f"{level.errors} failed requests"
    name = OBJECTIVE_LATENCY[target]
    latency = level.latency.get(name)
    if latency and latency.count and latency.p95 > objectives.latency_p95_s(target):
        return f"{name} p95 {latency.p95:.3f} s > {objectives.latency_p95_s(target):.3f} s"
    if level.realtime_ok is False and (target == "asr" or objectives.no_underruns):
        return "fell behind real time" if target == "asr" else "playback underruns"
    return ""


def usable_levels(sweep: RecordedSweep, objectives: Objectives) -> tuple[list[int], str]:
    """Indices of the levels, lowest first, up to which every level met the objectives; why the next one did not."""
    usable = []
    for index, level in enumerate(sweep.levels):
        why = _failure(level, sweep.target, objectives)
        if why:
            return usable, f"C={level.concurrency}: {why}"
        usable.append(index)
    return usable, ""


def _capacity(sweep: RecordedSweep, index: int) -> float:
    level = sweep.levels[index]
    return float(level.concurrency) if sweep.target == "asr" else level.throughput


def _p95(sweep: RecordedSweep, index: int) -> float | None:
    latency = sweep.levels[index].latency.get(OBJECTIVE_LATENCY[sweep.target])
    return latency.p95 if latency and latency.count else None


def _service_plan(sweep: RecordedSweep, sessions: Sessions, index: int | None, limited_by: str) -> ServicePlan:
    demand, unit = sessions.demand(sweep.target)
    capacity = _capacity(sweep, index) if index is not None else None
    replicas = headroom = None
    if capacity:
        replicas = max(1, math.ceil(demand / capacity - 1e-9))
        headroom = 1 - demand / (replicas * capacity)
    return ServicePlan(
        target=sweep.target,
        variant=sweep.variant,
        source=sweep.source,
        demand=demand,
        unit=unit,
        measured_concurrency=[level.concurrency for level in sweep.levels],
        operating_concurrency=sweep.levels[index].concurrency if index is not None else None,
        capacity_per_replica=capacity,
        replicas=replicas,
        headroom=headroom,
        latency_p95_s=_p95(sweep, index) if index is not None else None,
        limited_by=limited_by,
    )


def _limit(sweep: RecordedSweep, best: int, why: str) -> str:
    """Why the operating point is level `best` and not a higher one, in words."""
    top = sweep.levels[-1].concurrency
    if best == len(sweep.levels) - 1:
        return (
            f"end of the measured range: every level up to C={top} met the objectives, so a replica may carry "
            f"more; the plan does not extrapolate past C={top}"
        )
    following = f"C={sweep.levels[best + 1].concurrency}"
    if why.startswith(following):
        return f"the next level fails ({why})"
    return f"most capacity of the levels meeting the objectives ({following} carries less)"


def _solve(
    chosen: dict[str, RecordedSweep], sessions: Sessions, objectives: Objectives
) -> tuple[list[ServicePlan], float | None, bool]:
    """Operating points, the voice-to-voice estimate and whether every objective is met."""
    index: dict[str, int | None] = {}
    limited_by: dict[str, str] = {}
    for target, sweep in chosen.items():
        usable, why = usable_levels(sweep, objectives)  # levels 0 … k
        if not usable:
            index[target], limited_by[target] = None, f"no measured level meets the objectives ({why})"
            continue
        # The usable level with the most capacity: past the knee a higher concurrency can carry less.
        index[target] = max(usable, key=lambda i, sweep=sweep: (_capacity(sweep, i), -i))
        limited_by[target] = _limit(sweep, index[target], why)

    def voice_to_voice() -> float | None:
        parts = [_p95(chosen[t], index[t]) for t in chosen if index[t] is not None]
        complete = len(parts) == len(PLANNED) and all(p is not None for p in parts)
        return sum(parts) if complete else None

    v2v = voice_to_voice()
    while v2v is not None and v2v > objectives.voice_to_voice_p95_s:
        # Step down the stage whose p95 falls most by one level down.
        gains = {
            t: (_p95(chosen[t], index[t]) or 0.0) - (_p95(chosen[t], index[t] - 1) or math.inf)
            for t in chosen
            if index[t]
        }
        if not gains or max(gains.values()) <= 0:
            break
        target = max(gains, key=gains.get)
        index[target] -= 1
        limited_by[target] = "lowered so the stages' p95s add up to the voice-to-voice objective"
        v2v = voice_to_voice()
    plans = [_service_plan(chosen[t], sessions, index[t], limited_by[t]) for t in PLANNED if t in chosen]
    meets = (
        len(plans) == len(PLANNED)
        and all(p.replicas for p in plans)
        and v2v is not None
        and v2v <= objectives.voice_to_voice_p95_s
    )
    return plans, v2v, meets


def _bottleneck(plans: Sequence[ServicePlan]) -> str | None:
    planned = [p for p in plans if p.replicas]
    if not planned:
        return None
    return max(planned, key=lambda p: (p.need, -(p.headroom or 0.0))).target


def _voice_cross_check(sweeps: Sequence[RecordedSweep]) -> str:
    voice = [s for s in sweeps if s.target == "voice"]
    if not voice:
        return "no voice-turn sweep given: the voice-to-voice figure is the sum of the stages' p95s only"
    parts = []
    for level in voice[0].levels:
        latency = level.latency.get(VOICE_LATENCY)
        if latency and latency.count:
            parts.append(f"C={level.concurrency}: {latency.p95:.3f} s")
    return "measured voice-to-voice p95 of the whole turn (all three services on one machine): " + (
        ", ".join(parts) or "none recorded"
    )


ASSUMPTIONS = [
    "Each replica gets a device like the one its sweep ran on, to itself; a sweep measured one service alone, so "
    "services co-located on one device get less than their sweep shows.",
    "Replicas share nothing and load is balanced evenly across them, so capacity adds up replica by replica.",
    "A replica's capacity is that of a measured level; lower loads are assumed no slower (latency rises with load).",
    "Sessions are independent and their speaking and listening overlap at random, so demand is the mean load; "
    "bursts above the mean are what the headroom is for.",
    "LLM capacity in tokens/s was measured with the sweep's prompt and output lengths; other lengths change it "
    "(longer prompts cost prefill time).",
    "ASR capacity counts streams kept real time; TTS and LLM capacity are the throughputs measured at the level.",
]


def plan(
    sweeps: Sequence[RecordedSweep],
    sessions: Sessions,
    objectives: Objectives,
    prefer: dict[str, str] | None = None,
) -> CapacityPlan:
    """The plan over recorded sweeps; `prefer` picks a variant per service (else the first sweep of each)."""
    by_target: dict[str, list[RecordedSweep]] = {}
    for sweep in sweeps:
        if sweep.target in PLANNED or sweep.target == "voice":
            by_target.setdefault(sweep.target, []).append(sweep)
    chosen, warnings = _choose(by_target, prefer or {})
    services, v2v, meets = _solve(chosen, sessions, objectives)
    missing = [
        f"no {t} sweep: run `python -m loadgen sweep --target {t}` and pass its results.json"
        for t in PLANNED
        if t not in chosen
    ]
    warnings += [f"{p.target}: {p.limited_by}" for p in services if p.limited_by.startswith(("end of", "no measured"))]
    if v2v is not None and v2v > objectives.voice_to_voice_p95_s:
        warnings.append(
            f"voice-to-voice p95 estimate {v2v:.3f} s misses the {objectives.voice_to_voice_p95_s:.3f} s objective "
            "even at the lowest measured levels"
        )
    variants, unmeasured = _measured_variants(by_target, chosen, sessions, objectives)
    return CapacityPlan(
        sessions=sessions,
        objectives=objectives,
        services=services,
        bottleneck=_bottleneck(services),
        voice_to_voice_p95_s=v2v,
        meets_objectives=meets,
        voice_measured=_voice_cross_check(sweeps),
        variants=variants,
        predicted_variants=predicted_variants(chosen, sessions),
        assumptions=list(ASSUMPTIONS),
        warnings=warnings,
        missing=missing + unmeasured,
    )


def _choose(
    by_target: dict[str, list[RecordedSweep]], prefer: dict[str, str]
) -> tuple[dict[str, RecordedSweep], list[str]]:
    """The sweep planned for each service (the preferred variant, else the first) and warnings for misses."""
    chosen: dict[str, RecordedSweep] = {}
    warnings = []
    for target in PLANNED:
        options = by_target.get(target, [])
        wanted = prefer.get(target)
        preferred = [s for s in options if wanted in (s.variant, None)]
        if wanted and options and not preferred:
            measured = ", ".join(s.variant for s in options)
            warnings.append(f"{target}: no sweep of {wanted!r} (measured: {measured}); planned with the first")
        if options:
            chosen[target] = (preferred or options)[0]
    return chosen, warnings


def _measured_variants(
    by_target: dict[str, list[RecordedSweep]],
    chosen: dict[str, RecordedSweep],
    sessions: Sessions,
    objectives: Objectives,
) -> tuple[list[MeasuredVariant], list[str]]:
    """The plan solved again with each measured ASR chunk size and TTS step count, and what was not measured."""
    variants, missing = [], []
    for target, label in (("asr", "ASR chunk size"), ("tts", "TTS diffusion steps")):
        options = by_target.get(target, [])
        if len(options) < 2:
            shown = options[0].variant if options else "nothing"
            missing.append(f"{label}: only {shown} measured; sweep other settings to see the effect measured")
        for option in options:
            plans, option_v2v, option_meets = _solve({**chosen, target: option}, sessions, objectives)
            mine = next(p for p in plans if p.target == target)
            variants.append(
                MeasuredVariant(
                    service=target,
                    variant=option.variant,
                    operating_concurrency=mine.operating_concurrency,
                    capacity_per_replica=mine.capacity_per_replica,
                    unit=mine.unit,
                    replicas=mine.replicas,
                    total_replicas=sum(p.replicas or 0 for p in plans),
                    bottleneck=_bottleneck(plans),
                    voice_to_voice_p95_s=option_v2v,
                    meets_objectives=option_meets,
                )
            )
    return variants, missing


def plan_section(
    results: Sequence[str | Path], sessions: int, objectives: Objectives | None = None, **mix: float
) -> str:
    """The capacity-plan report section for the sweeps under `results` (files or run folders), e.g. at the end
    of `make run`: plan_section([run_folder], sessions=100)."""
    return render_plan(plan(read_sweeps(list(results)), Sessions(sessions, **mix), objectives or Objectives()))


def add_plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `plan` command's flags, on `parser` (its own, or a subcommand parser of `python -m loadgen`)."""
    parser.add_argument("results", nargs="+", help="results.json files of sweeps, or run folders holding them")
    parser.add_argument("--sessions", type=int, required=True, help="concurrent voice sessions to plan for")
    parser.add_argument("--speaking-share", type=float, default=0.4, help="share of time the user speaks")
    parser.add_argument("--listening-share", type=float, default=0.4, help="share of time the agent speaks")
    parser.add_argument("--tokens-per-audio-s", type=float, default=3.0, help="LLM tokens per second of reply")
    parser.add_argument("--voice-to-voice-p95", type=float, default=1.5, help="objective, seconds")
    parser.add_argument("--asr-final-p95", type=float, default=0.5, help="objective, seconds")
    parser.add_argument("--llm-ttft-p95", type=float, default=0.5, help="objective, seconds")
    parser.add_argument("--tts-first-audio-p95", type=float, default=0.5, help="objective, seconds")
    parser.add_argument("--allow-underruns", action="store_true", help="do not require TTS levels free of underruns")
    parser.add_argument("--asr-variant", help='ASR sweep to plan with, e.g. "chunk 320 ms" (default: the first)')
    parser.add_argument("--tts-variant", help='TTS sweep to plan with, e.g. "10 diffusion steps" (default: the first)')
    parser.add_argument("--out", type=Path, help="folder to write plan.md and plan.json to")
    return parser


def plan_command(args: argparse.Namespace) -> int:
    """Run the plan for parsed flags: print it, write it with --out; 2 with a message on bad input."""
    try:
        sessions = Sessions(args.sessions, args.speaking_share, args.listening_share, args.tokens_per_audio_s)
        sweeps = read_sweeps(args.results)
        if not sweeps:
            raise ValueError(f"no results.json found in {', '.join(args.results)}")
    except (ValueError, OSError) as bad:
        print(f"python -m loadgen plan: error: {bad}", file=sys.stderr)
        return 2
    objectives = Objectives(
        voice_to_voice_p95_s=args.voice_to_voice_p95,
        asr_final_p95_s=args.asr_final_p95,
        llm_ttft_p95_s=args.llm_ttft_p95,
        tts_first_audio_p95_s=args.tts_first_audio_p95,
        no_underruns=not args.allow_underruns,
    )
    result = plan(sweeps, sessions, objectives, prefer={"asr": args.asr_variant, "tts": args.tts_variant})
    markdown = render_plan(result)
    print(markdown)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.md").write_text(markdown, encoding="utf-8")
        (args.out / "plan.json").write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
        print(f"plan written to {args.out / 'plan.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen plan",
        description="Replicas per service for a number of concurrent voice sessions, from measured sweeps.",
    )
    return plan_command(add_plan_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
