"""Markdown for the report: the predicted-vs-measured section and the verdict section of one sweep."""

from __future__ import annotations

from loadgen.analysis.formats import markdown_table, rate, seconds, share, si
from loadgen.analysis.verdicts import SweepAnalysis

FORMULAS = {
    "tokens": [
        "decode step time ≥ max((weight bytes + B·KV bytes per sequence) ÷ bandwidth, (2·params + attention)·B ÷ peak)",
        "KV bytes per sequence = 2·layers·kv_heads·head_dim·dtype bytes·context; attention = "
        "4·layers·heads·head_dim·context FLOPs per token",
        "tokens/s ≤ B ÷ step time; per-stream tokens/s ≤ 1 ÷ step time; TTFT ≥ 2·params·prompt tokens ÷ peak",
        "crossover batch B* = ridge·weight bytes ÷ (2·params + attention − ridge·KV bytes per sequence) "
        "(≈ ridge·dtype bytes ÷ 2 for short contexts)",
    ],
    "asr": [
        "chunk = (right context + 1) × 80 ms; cache-aware streaming encodes each new 80 ms frame once",
        "step time ≥ max((weight bytes + B·cache bytes) ÷ bandwidth, B·(2·params·frames per chunk + attention) ÷ peak)",
        "real-time while the batched step time ≤ chunk duration; buffered streaming re-encodes its whole window "
        "every chunk",
        "audio s/s ≤ min(streams offered, B·chunk ÷ step time)",
    ],
    "tts": [
        "time to speak = patches, one after another, × time per patch (one 160 ms patch per LM step)",
        "time per patch ≥ max(bytes ÷ bandwidth, FLOPs ÷ peak), bytes = weights + (DiT calls − 1)·DiT weights, "
        "FLOPs = 2·LM params + DiT calls·2·DiT params·DiT tokens·2 (guidance); DiT calls = diffusion steps less "
        "the skipped first ones",
        "requests are not batched: B streams side by side share the device, so each takes B × the single-stream "
        "time; RTF = time per patch ÷ 0.16 s; real-time streams = ⌊0.16 s ÷ single-stream time per patch⌋",
    ],
}


def render_predictions(analysis: SweepAnalysis) -> str:
    work = analysis.work
    if work is None:
        return f"### Predicted vs measured: {analysis.target}\n\n{analysis.crossover_sentence}\n"
    unit = work.unit if work.unit == "tokens" else analysis.target
    lines = [
        f"### Predicted vs measured: {analysis.target}",
        "",
        f"Ceilings measured by the service on {analysis.device}: read bandwidth "
        f"{si(analysis.memory_bandwidth_bytes_per_s, 'B/s')}, peak {si(analysis.peak_flops_per_s, 'FLOP/s')}, "
        f"ridge {analysis.ridge_flops_per_byte:.3g} FLOP/byte. Step model: {work.what} (work from the {work.source}).",
        "",
        *[f"- {formula}" for formula in FORMULAS.get(unit, [])],
        *[f"- note: {note}" for note in work.notes],
        "",
    ]
    lines += markdown_table(
        ["component", "what determines its time", "predicted", "measured", "agreement"],
        [list(row.values()) for row in analysis.predictions_table],
    )
    lines += ["", "Per level:", ""]
    rows = []
    for v in analysis.levels:
        p = v.predicted
        rows.append(
            [
                str(v.concurrency),
                p.bound,
                seconds(p.step_time_s),
                seconds(p.measured_step_s),
                rate(p.throughput, work.unit),
                rate(p.measured_throughput, work.unit),
                share(p.ratio) + (" (step time)" if p.ratio_basis == "step time" else ""),
            ]
        )
    header = ["C", "predicted bound", "step time ≥", "measured step p50", "predicted", "measured"]
    header.append("efficiency (measured ÷ predicted)")
    lines += markdown_table(header, rows)
    return "\n".join(lines) + "\n"


def render_verdict(analysis: SweepAnalysis) -> str:
    crossover = analysis.crossover_sentence if analysis.work else ""
    lines = [f"### Verdict: {analysis.target}", "", f"**{analysis.knee_sentence}** {crossover}".rstrip()]
    if analysis.realtime_limit is not None:
        measured = (
            f"Real-time limit: C={analysis.realtime_limit} measured"
            if analysis.realtime_limit
            else "Not real-time at any measured level"
        )
        predicted = analysis.predicted_realtime_streams
        allows = f"; the roofline allows {predicted} stream{'' if predicted == 1 else 's'} at once."
        lines.append(measured + (allows if predicted is not None else "."))
    lines.append("")
    rows = []
    for v in analysis.levels:
        realtime = "" if v.realtime_ok is None else ("yes" if v.realtime_ok else "NO")
        source = {"counters": "", "estimated": " (est.)"}.get(v.utilisation_source)
        rows.append(
            [
                str(v.concurrency),
                f"**{v.regime}**",
                "—" if source is None else share(v.bandwidth_utilisation) + source,
                "—" if source is None else share(v.flop_utilisation) + source,
                f"{v.arithmetic_intensity:.3g}",
                realtime,
                "; ".join(v.reasons),
                v.artefact,
            ]
        )
    lines += markdown_table(["C", "regime", "bandwidth", "FLOPs", "FLOP/byte", "real time", "why", "artefact"], rows)
    lines += ["", "Rules:", "", *[f"- {rule}" for rule in analysis.rules]]
    return "\n".join(lines) + "\n"


def render_markdown(analysis: SweepAnalysis) -> str:
    """Both sections, for embedding in report.md (and, converted, report.html)."""
    return render_predictions(analysis) + "\n" + render_verdict(analysis)
