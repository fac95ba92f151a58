"""A sweep's report folder: report.md and report.html with the plots, results.json, levels.csv, requests.jsonl.

The top of the report answers the question at a glance — where the knee is and which regime each level is
in — and the rest shows the evidence: the service's facts and ceilings, every level's numbers, the plots, the
analysis's predicted-vs-measured table and verdicts with the rules they follow, and the load generator's own
CPU use.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import html
import json
from pathlib import Path

import markdown

from loadgen import plots
from loadgen.analysis import SweepAnalysis, analyse, render_markdown
from loadgen.analysis.formats import markdown_table, si
from loadgen.levels import PRIMARY_LATENCY, SPEED_UNIT
from loadgen.results import LevelResult

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3}img{max-width:49%;border:1px solid #eee}code{background:#f6f6f6}"""


def run_folder(root: Path, name: str) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    folder = root / f"{stamp}-{name}"
    folder.mkdir(parents=True, exist_ok=False)
    return folder


def write_html(md_text: str, path: Path, title: str) -> None:
    body = markdown.markdown(md_text, extensions=["tables"])
    path.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>{body}</body></html>\n",
        encoding="utf-8",
    )


def _analyse(sweep) -> tuple[SweepAnalysis | None, str]:
    """The analysis, or why there is none (a peer without ceilings, an analysis error), in words."""
    if not sweep.levels:
        return None, "no level completed"
    if not sweep.facts.peak_flops_per_s and not sweep.facts.remote:  # a remote engine: the knee, no regimes
        return None, "the target reported no device ceilings (a peer without our info RPC)"
    try:
        # The whole workload: its means, the ASR chunk size and the TTS diffusion steps all enter the predictions.
        return analyse(sweep.facts, sweep.levels, sweep.target, sweep.workload), ""
    except Exception as error:  # noqa: BLE001 — a report without verdicts beats no report
        return None, f"analysis failed: {type(error).__name__}: {error}"


def _glance(sweep, analysis: SweepAnalysis | None) -> list[str]:
    primary = PRIMARY_LATENCY[sweep.target]
    header = ["C", "regime", f"throughput ({sweep.levels[0].throughput_unit})", SPEED_UNIT[sweep.target],
              f"{primary} p50 / p95", "bandwidth", "FLOPs", "real time", "errors", "note"]  # fmt: skip
    rows = []
    for index, level in enumerate(sweep.levels):
        verdict = analysis.levels[index] if analysis else None
        latency = level.latency.get(primary)
        knee = analysis is not None and analysis.knee_index == index
        rows.append([
            f"**{level.concurrency}**" if knee else str(level.concurrency),
            (f"**{verdict.regime}**" + (" ← knee" if knee else "")) if verdict else "—",
            f"{level.throughput:.4g}",
            f"{level.per_request_speed:.3g}",
            f"{latency.p50 * 1000:.0f} / {latency.p95 * 1000:.0f} ms" if latency and latency.count else "—",
            f"{verdict.bandwidth_utilisation:.0%}" if verdict and not sweep.facts.remote else "—",
            f"{verdict.flop_utilisation:.0%}" if verdict and not sweep.facts.remote else "—",
            "" if level.realtime_ok is None else ("yes" if level.realtime_ok else "**NO**"),
            str(level.errors),
            "; ".join(filter(None, [verdict.artefact if verdict else "", level.stopped_early])),
        ])  # fmt: skip
    return markdown_table(header, rows)


def _facts(sweep) -> list[str]:
    facts = sweep.facts
    rows = [
        ["service / backend", f"{facts.service} / {facts.backend}"],
        ["preset, dtype, device", f"{facts.preset}, {facts.dtype}, {facts.device} ({facts.device_name})"],
        ["parameters, weight bytes", f"{si(facts.parameter_count, '')}, {si(facts.weight_bytes, 'B')}"],
        ["measured read bandwidth", si(facts.memory_bandwidth_bytes_per_s, "B/s")],
        ["measured matmul peak", si(facts.peak_flops_per_s, "FLOP/s")],
        ["ridge", f"{facts.ridge_flops_per_byte:.3g} FLOP/byte"],
        ["ceilings measured", facts.ceilings_note()],
        ["shape", ", ".join(f"{k}={v:g}" for k, v in facts.shape.items()) or "—"],
        ["limits", ", ".join(f"{k}={v:g}" for k, v in facts.limits.items()) or "—"],
    ]
    return markdown_table(["fact (from GetInfo)", "value"], rows)


def _levels(sweep) -> list[str]:
    names = list(sweep.levels[0].latency)
    header = ["C", "requests", "errors", "s", *[f"{n} p50/p95/p99 ms" for n in names],
              "FLOP/s", "read B/s", "steps/s", "load gen cores", "busiest gen process", "in flight / offered",
              "machine cores"]  # fmt: skip
    rows = []
    for level in sweep.levels:
        latencies = [
            f"{p.p50 * 1000:.0f}/{p.p95 * 1000:.0f}/{p.p99 * 1000:.0f}" if p.count else "—"
            for p in (level.latency[name] for name in names)
        ]
        rows.append([
            level.concurrency, level.requests, level.errors, f"{level.duration_s:.1f}", *latencies,
            si(level.server.flops_per_s, ""), si(level.server.read_bytes_per_s, ""), f"{level.server.steps_per_s:.1f}",
            f"{level.loadgen_cpu:.2f}", _busiest(level), _in_flight(level),
            f"{level.extra.get('machine_cpu_cores', 0):.2f}",
        ])  # fmt: skip
    return markdown_table(header, rows)


def _busiest(level: LevelResult) -> str:
    busiest = level.extra.get("loadgen_busiest_process_cores")
    return "—" if busiest is None else f"{busiest:.2f} of 1 core"


def _in_flight(level: LevelResult) -> str:
    achieved = level.extra.get("achieved_concurrency")
    return "—" if achieved is None else f"{achieved:.1f} / {level.concurrency}"


def render(sweep, analysis: SweepAnalysis | None, why_none: str, images: dict[str, str]) -> str:
    plan, workload = sweep.plan, sweep.workload
    headline = analysis.summary if analysis else f"{sweep.target}: no verdict ({why_none})."
    lines = [f"# Sweep: {sweep.target}", "", f"**{headline}**", ""]
    lines += _glance(sweep, analysis) if sweep.levels else ["No level completed."]
    lines += ["", "## Plots", ""]
    lines += [f"![{title}]({name})" for title, name in images.items()]
    lines += ["", "## The service", "", *_facts(sweep), ""]
    if sweep.levels:
        lines += ["## Levels measured", "", *_levels(sweep), ""]
    lines += ["## Analysis", "", render_markdown(analysis) if analysis else f"No analysis: {why_none}.", ""]
    lines += ["## Load generator self-check", ""]
    lines += [
        f"The generator ran {1 + plan.workers} process(es) "
        f"({'Locust local runner' if not plan.workers else f'Locust master + {plan.workers} workers'}). "
        "A Python process saturates near one core; when it nears that, or when the machine is full and the "
        "generator holds a large share of it, the generator — not the service — may set the level's pace. "
        "Checked per level (the levels table): the busiest generator process's cores, and the requests in flight "
        "on average (Little's law over the window) against the offered concurrency.",
        "",
    ]
    lines += [f"- ⚠ {warning}" for warning in sweep.warnings] or [
        "- no warnings: the generator had headroom at every level"
    ]
    lines += ["", "## How it ran", ""]
    length = f"{plan.duration_s:g} s" if plan.requests is None else f"{plan.requests} requests"
    lines += [
        f"- levels {', '.join(map(str, plan.concurrency))}; each: {plan.warmup_s:g} s warm-up, then {length}, then "
        f"in-flight requests drained; stop when errors > {plan.max_error_rate:.0%} or "
        f"{PRIMARY_LATENCY[sweep.target]} p95 > {plan.objective:g} s",
        f"- workload: `{json.dumps(dataclasses.asdict(workload), separators=(',', ':'))}`",
        "- files: results.json (everything), levels.csv, requests.jsonl (one line per measured request)",
    ]
    return "\n".join(str(line) for line in lines) + "\n"


def write_levels_csv(levels: list[LevelResult], analysis: SweepAnalysis | None, path: Path) -> None:
    names = list(levels[0].latency) if levels else []
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["concurrency", "regime", "requests", "errors", "duration_s", "throughput", "throughput_unit",
                         "per_request_speed", "flops_per_s", "read_bytes_per_s", "steps_per_s", "realtime_ok",
                         "loadgen_cpu", "artefact", "stopped_early",
                         *[f"{n}_{q}" for n in names for q in ("p50", "p95", "p99", "mean")]])  # fmt: skip
        for index, level in enumerate(levels):
            verdict = analysis.levels[index] if analysis else None
            writer.writerow([
                level.concurrency, verdict.regime if verdict else "", level.requests, level.errors,
                f"{level.duration_s:.3f}", f"{level.throughput:.6g}", level.throughput_unit,
                f"{level.per_request_speed:.6g}", f"{level.server.flops_per_s:.6g}",
                f"{level.server.read_bytes_per_s:.6g}", f"{level.server.steps_per_s:.6g}", level.realtime_ok,
                f"{level.loadgen_cpu:.3f}", verdict.artefact if verdict else "", level.stopped_early,
                *[f"{getattr(level.latency[n], q):.6g}" for n in names for q in ("p50", "p95", "p99", "mean")],
            ])  # fmt: skip


def write_report(sweep, folder: Path) -> tuple[SweepAnalysis | None, str]:
    """Write every file of the report into `folder`; returns the analysis and a short summary to print."""
    analysis, why_none = _analyse(sweep)
    images = plots.all_plots(sweep, analysis, folder) if sweep.levels else {}
    text = render(sweep, analysis, why_none, images)
    (folder / "report.md").write_text(text, encoding="utf-8")
    write_html(text, folder / "report.html", f"Sweep: {sweep.target}")
    results = {
        "target": sweep.target,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "plan": dataclasses.asdict(sweep.plan),
        "workload": dataclasses.asdict(sweep.workload),
        "facts": dataclasses.asdict(sweep.facts),
        "levels": [dataclasses.asdict(level) for level in sweep.levels],
        "analysis": analysis.to_dict() if analysis else None,
        "warnings": sweep.warnings,
    }
    (folder / "results.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    write_levels_csv(sweep.levels, analysis, folder / "levels.csv")
    return analysis, summary(sweep, analysis, why_none)


def summary(sweep, analysis: SweepAnalysis | None, why_none: str = "") -> str:
    if not sweep.levels:
        return f"{sweep.target}: no level completed"
    best = max(sweep.levels, key=lambda level: level.throughput)
    primary = PRIMARY_LATENCY[sweep.target]
    lines = [
        analysis.summary if analysis else f"{sweep.target}: no verdict ({why_none})",
        f"  best throughput {best.throughput:.4g} {best.throughput_unit} at C={best.concurrency}; "
        f"{primary} p50 {sweep.levels[0].latency[primary].p50 * 1000:.0f} ms at C={sweep.levels[0].concurrency}",
    ]
    if analysis:
        lines.append("  regimes: " + ", ".join(f"C={v.concurrency} {v.regime}" for v in analysis.levels))
    lines += [f"  ⚠ {warning}" for warning in sweep.warnings]
    return "\n".join(lines)
