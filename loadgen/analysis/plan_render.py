"""Markdown for the capacity plan: the report section and what `python -m loadgen plan` prints."""

from __future__ import annotations

from loadgen.analysis.formats import markdown_table
from loadgen.analysis.plan_model import CapacityPlan


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.{digits}g}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def render_plan(plan: CapacityPlan) -> str:
    lines = _demand(plan) + _services_table(plan) + _verdict(plan)
    if plan.variants:
        lines += _measured_variants(plan)
    if plan.predicted_variants:
        lines += _predicted_variants(plan)
    lines += ["### Assumptions", "", *[f"- {a}" for a in plan.assumptions], ""]
    if plan.warnings or plan.missing:
        lines += ["### Warnings and what is missing", "", *[f"- {w}" for w in plan.warnings + plan.missing], ""]
    return "\n".join(lines)


def _demand(plan: CapacityPlan) -> list[str]:
    """The heading and the sessions and objectives the plan answers."""
    s, o = plan.sessions, plan.objectives
    return [
        "## Capacity plan",
        "",
        f"For **{s.sessions} concurrent voice sessions**: the user speaks {s.speaking_share:.0%} of the time, the "
        f"agent {s.listening_share:.0%}, at {s.tokens_per_audio_s:g} LLM tokens per second of reply. Objectives "
        f"(p95): voice-to-voice {o.voice_to_voice_p95_s:g} s, ASR final {o.asr_final_p95_s:g} s, LLM TTFT "
        f"{o.llm_ttft_p95_s:g} s, TTS first audio {o.tts_first_audio_p95_s:g} s"
        + (", no playback underruns." if o.no_underruns else "; underruns allowed."),
        "",
    ]


def _services_table(plan: CapacityPlan) -> list[str]:
    """One row per service: demand, operating point, capacity and replicas."""
    rows = [
        [
            p.target,
            p.variant,
            f"{_number(p.demand)} {p.unit}",
            f"C={p.operating_concurrency}" if p.operating_concurrency is not None else "none",
            f"{_number(p.capacity_per_replica)} {p.unit}" if p.capacity_per_replica else "—",
            f"**{p.replicas}**" if p.replicas else "—",
            f"{p.headroom:.0%}" if p.headroom is not None else "—",
            _seconds(p.latency_p95_s),
            p.limited_by,
        ]
        for p in plan.services
    ]
    header = ["service", "sweep", "demand", "operating point per replica", "capacity per replica", "replicas"]
    header += ["headroom", "objective latency p95 there", "limited by"]
    return [*markdown_table(header, rows), ""]


def _verdict(plan: CapacityPlan) -> list[str]:
    """The bottleneck, voice-to-voice against its objective, and whether every objective is met."""
    objective = plan.objectives.voice_to_voice_p95_s
    lines = []
    if plan.bottleneck:
        lines.append(f"**Bottleneck: {plan.bottleneck}** — it needs the most replicas for its share of the work.")
    if plan.voice_to_voice_p95_s is not None:
        verdict = "meets" if plan.voice_to_voice_p95_s <= objective else "MISSES"
        lines.append(
            f"Voice-to-voice p95 ≤ {plan.voice_to_voice_p95_s:.3f} s (sum of the stages' p95s), which {verdict} the "
            f"{objective:g} s objective."
        )
    return lines + [
        f"All objectives met: {'yes' if plan.meets_objectives else 'NO'}.",
        f"Cross-check: {plan.voice_measured}.",
        "",
    ]


def _measured_variants(plan: CapacityPlan) -> list[str]:
    """The plan again for each measured ASR chunk size and TTS step count."""
    rows = [
        [
            v.service,
            v.variant,
            f"C={v.operating_concurrency}" if v.operating_concurrency is not None else "none",
            f"{_number(v.capacity_per_replica)} {v.unit}" if v.capacity_per_replica else "—",
            str(v.replicas or "—"),
            str(v.total_replicas),
            v.bottleneck or "—",
            _seconds(v.voice_to_voice_p95_s),
            "yes" if v.meets_objectives else "no",
        ]
        for v in plan.variants
    ]
    header = ["service", "sweep", "operating point", "capacity per replica", "replicas", "all replicas", "bottleneck"]
    header += ["voice-to-voice p95", "objectives met"]
    title = "### How the answer changes with the ASR chunk size and the TTS diffusion steps (measured)"
    return [title, "", *markdown_table(header, rows), ""]


def _predicted_variants(plan: CapacityPlan) -> list[str]:
    """Settings that were not measured: the roofline bound and the estimate corrected by the measured sweep."""
    lines = [
        "### Predicted for other settings (not measured)",
        "",
        "Bound: the roofline on the measured ceilings (capped by the admission limit). Estimate: corrected by "
        "what the measured sweep showed the roofline leaves out (ASR: its overhead per step and per stream; "
        "TTS: its efficiency against the roofline).",
        "",
    ]
    rows = [
        [
            v.service,
            v.setting,
            f"{_number(v.predicted_capacity_per_replica)} {v.unit}".strip(),
            _number(v.estimated_capacity_per_replica),
            v.estimate_basis,
            f"{v.replicas_at_bound or '—'} / {v.replicas_at_estimate or '—'}",
        ]
        for v in plan.predicted_variants
    ]
    header = ["service", "setting", "bound per replica", "estimate per replica", "estimated from"]
    lines += markdown_table([*header, "replicas (bound / estimate)"], rows)
    notes = {v.note for v in plan.predicted_variants if v.setting == "—"}
    return [*lines, *(f"- {note}" for note in sorted(notes)), ""]
