"""The main job (`make run`): start the three services, sweep each and the voice turn, compare the LLM with
`vllm serve` on the same preset, write one report folder, stop everything, say where the report is.

reports/<time>-run/
    report.md, report.html     the whole run at a glance: per target knee, regime, real-time limit; side by side
    asr/ llm/ tts/ voice/      each sweep's own report (plots, results.json, levels.csv, requests.jsonl)
    peer/                      the side-by-side sweeps (ours and the peer at concurrency 1 and 16)
    logs/                      every process's output
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from loadgen.analysis.formats import markdown_table, si
from loadgen.analysis.plan import plan_section
from loadgen.levels import PRIMARY_LATENCY
from loadgen.peer import side_by_side
from loadgen.processes import ServiceProcess, service_process
from loadgen.report import run_folder, write_html, write_report
from loadgen.run_plans import PRESETS, SERVICE_ARGS, TARGETS, chosen_plans, service_args, services_for
from loadgen.run_plans import workload as run_workload
from loadgen.sweep import run_sweep
from loadgen.workload import Endpoints

SERVICES = ("asr", "llm", "tts")
SERVING_TIMEOUT_S = 600
PLAN_SESSIONS = 100  # the capacity plan at the end of the report: replicas for this many voice sessions
RUN_PRESETS = PRESETS["cpu"]  # the CPU run's presets (loadgen/run_plans.py holds both devices')
STAGES = (*TARGETS, "peer")  # what `--only` may pick: the sweeps and the side by side


class Stages:
    """Prints each stage as it starts and keeps how long each took, for the report."""

    def __init__(self):
        self.started = time.monotonic()
        self.times: list[tuple[str, float]] = []
        self._current: tuple[str, float] | None = None

    def begin(self, name: str) -> None:
        self.end()
        elapsed = time.monotonic() - self.started
        print(f"\n=== [{elapsed // 60:02.0f}:{elapsed % 60:02.0f}] {name}", flush=True)
        self._current = (name, time.monotonic())

    def end(self) -> None:
        if self._current:
            self.times.append((self._current[0], time.monotonic() - self._current[1]))
            self._current = None


def start_services(
    folder: Path, presets: dict[str, str], services: dict[str, ServiceProcess], device: str = "cpu"
) -> None:
    """Start the services one at a time, each SERVING before the next starts, into `services` (so the caller
    stops whatever started, also when one fails).

    Every service measures its device ceilings at start-up: started together, each probe ran while the others
    loaded their engines, and came out up to 2.8× too low (every utilisation and verdict inflated with it).
    One at a time, each probe has the machine to itself; the services already up are idle."""
    for name, preset in presets.items():
        services[name] = service_process(name, folder / f"{name}.log", service_args(device, name, preset))
        services[name].wait_serving(SERVING_TIMEOUT_S)
        print(f"{name}: SERVING on {services[name].address} (metrics {services[name].metrics_url}) after "
              f"{services[name].serving_at - services[name].started_at:.0f} s", flush=True)  # fmt: skip


def run_session(
    reports: Path,
    quick: bool = False,
    peer: bool = True,
    preset: str = "",
    presets: dict[str, str] | None = None,
    device: str = "cpu",
    only: list[str] | None = None,
    folder: Path | None = None,
) -> int:
    """`preset` (e.g. "tiny") sets every service's preset: a fast smoke run of the whole job; `presets` sets some
    services' presets over the device's (e.g. {"asr": "fastconformer-100m"}). `only` runs some stages (sweeps of
    asr, llm, tts, voice, and "peer", the side by side), starting only the services they need: a run split into
    parts, each in its own `folder`, that `python -m loadgen combine` joins into one report."""
    chosen_stages = list(only or [*TARGETS, *(["peer"] if peer else [])])
    if folder is None:
        folder = run_folder(reports, "run")
    else:
        folder.mkdir(parents=True, exist_ok=False)
    (folder / "logs").mkdir()
    stages = Stages()
    names = services_for(chosen_stages)
    chosen = {name: preset or (presets or {}).get(name, PRESETS[device][name]) for name in names}
    stages.begin("starting " + ", ".join(f"{name} ({chosen[name] or 'default preset'})" for name in names)
                 + f" on {device}, one at a time (each measures its device ceilings on a quiet machine)")  # fmt: skip
    services: dict[str, ServiceProcess] = {}
    sweeps: dict[str, tuple] = {}
    comparison: list[dict] = []
    failure = ""
    try:
        start_services(folder / "logs", chosen, services, device)
        endpoints = Endpoints(**{name: services[name].address for name in names},
                              **{f"{name}_metrics": services[name].metrics_url for name in names})  # fmt: skip
        workload = dataclasses.replace(run_workload(quick, device), endpoints=endpoints)
        for plan in chosen_plans(quick, device, chosen_stages):
            stages.begin(f"sweep {plan.target}: concurrency {', '.join(map(str, plan.concurrency))}")
            (folder / plan.target).mkdir()
            sweep = run_sweep(plan, workload, folder / plan.target, progress=lambda line: print(line, flush=True))
            analysis, text = write_report(sweep, folder / plan.target)
            print(text, flush=True)
            sweeps[plan.target] = (sweep, analysis)
        if "peer" in chosen_stages:
            for name in ("asr", "tts"):  # the comparison gets the machine to itself
                if name in services:
                    services[name].stop()
            comparison = side_by_side(services["llm"].address, workload, folder / "peer", quick, stages,
                                      service_args=tuple(SERVICE_ARGS[device]["llm"]))  # fmt: skip
    except (RuntimeError, TimeoutError, OSError) as error:  # a service that died or never came up: say which
        failure = str(error)
        print(f"\nrun failed: {failure}", flush=True)
    finally:
        stages.begin("stopping the services")
        for service in services.values():
            service.stop()
        stages.end()
    (folder / "stage.json").write_text(json.dumps({
        "device": device, "stages": chosen_stages, "presets": chosen, "quick": quick, "failure": failure,
        "times": stages.times, "comparison": comparison}, indent=1), encoding="utf-8")  # fmt: skip
    text = index(sweeps, comparison, stages.times, failure, device) + _plan(folder, sweeps)
    (folder / "report.md").write_text(text, encoding="utf-8")
    write_html(text, folder / "report.html", "voiceagent run")
    total = time.monotonic() - stages.started
    print(f"\nrun {'FAILED' if failure else 'finished'} in {total // 60:.0f} min {total % 60:.0f} s")
    print(f"report: {folder / 'report.md'} (and report.html)")
    return 1 if failure else 0


def _plan(folder: Path, sweeps: dict[str, tuple]) -> str:
    if not {"asr", "llm", "tts"} <= set(sweeps):
        return ""
    try:
        # The sweeps of this run only: the side-by-side LLM sweeps are not operating points to plan with.
        section = plan_section([folder / target / "results.json" for target in sweeps], sessions=PLAN_SESSIONS)
    except Exception as error:  # noqa: BLE001 — the sweeps' reports stand without the plan
        return f"\n## Capacity plan\n\nNo plan: {type(error).__name__}: {error}\n"
    return f"\n{section}\n"


def index(sweeps: dict[str, tuple], comparison: list[dict], times: list, failure: str = "", device: str = "cpu") -> str:
    """The run's report.md: `sweeps` maps a target to (sweep, analysis); objects read back from a stage's
    results.json (loadgen/combine.py) do as well, having the same attributes."""
    lines = ["# voiceagent run", "", f"Each service swept over concurrency on its {device.upper()} preset; click "
             "a target for its full report (plots, predicted vs measured, verdicts and the rules behind them).",
             ""]  # fmt: skip
    if failure:
        lines += ["**The run failed:**", "", "```", failure, "```", ""]
    rows = []
    for target, (sweep, analysis) in sweeps.items():
        best = max(sweep.levels, key=lambda level: level.throughput) if sweep.levels else None
        primary = PRIMARY_LATENCY[target]
        first = sweep.levels[0].latency[primary] if sweep.levels else None
        rows.append([
            f"[{target}]({target}/report.md)",
            f"C={analysis.knee_concurrency} ({analysis.knee_regime})" if analysis and analysis.knee_index is not None
            else "none measured",
            ", ".join(f"{v.concurrency}: {v.regime}" for v in analysis.levels) if analysis else "—",
            f"{best.throughput:.4g} {best.throughput_unit} at C={best.concurrency}" if best else "—",
            f"{first.p50 * 1000:.0f} ms" if first else "—",
            "" if not analysis or analysis.realtime_limit is None else f"C={analysis.realtime_limit}",
            "; ".join(sweep.warnings) or "",
        ])  # fmt: skip
    lines += markdown_table(
        ["target", "knee", "regime by concurrency", "best throughput", "primary latency p50 at C=1",
         "real-time limit", "load-generator warnings"], rows)  # fmt: skip
    lines += _seed_tables(sweeps)
    ceilings = [(target, sweep.facts) for target, (sweep, _) in sweeps.items() if target in SERVICES]
    if ceilings:
        lines += [
            "",
            "## Device ceilings (what every utilisation and verdict above is judged against)",
            "",
            "Each service measured them at start-up; the services start one at a time, so each probe has "
            "the machine to itself. A probe that ran under load is flagged: its ceilings are too low.",
            "",
        ]
        lines += markdown_table(
            ["service", "device, dtype", "read bandwidth", "matmul peak", "when and how"],
            [[target, f"{facts.device_name or facts.device}, {facts.dtype}", si(facts.memory_bandwidth_bytes_per_s,
              "B/s"), si(facts.peak_flops_per_s, "FLOP/s"), facts.ceilings_note()] for target, facts in ceilings],
        )  # fmt: skip
    if comparison:
        lines += ["", "## Side by side: our LLM service vs `vllm serve` (same preset, same workload)", "",
                  "Both servers up, taking turns per round and level (the order flips every round); pooled over "
                  "the rounds. A verdict says beats or trails only when the pooled difference exceeds the spread "
                  "of the per-round ratios; otherwise it matches.", ""]  # fmt: skip
        lines += markdown_table(
            ["C", "rounds", "ours TTFT p50", "peer TTFT p50", "ours tokens/s", "peer tokens/s", "verdict"],
            [[row["concurrency"], row["rounds"], row["ours_ttft"], row["peer_ttft"], row["ours_tps"],
              row["peer_tps"], row["verdict"]] for row in comparison],
        )  # fmt: skip
    lines += ["", "## Stages", ""]
    lines += markdown_table(["stage", "seconds"], [[name, f"{seconds:.0f}"] for name, seconds in times])
    return "\n".join(lines) + "\n"


def _seed_tables(sweeps: dict[str, tuple]) -> list[str]:
    """Each service's predicted-vs-measured table (component | what determines its time | predicted | measured |
    agreement) with its knee and crossover, on the run's first page; the per-level detail is in its report."""
    lines = []
    for target, (_, analysis) in sweeps.items():
        if target not in SERVICES or analysis is None or not analysis.predictions_table:
            continue
        sentences = f"{analysis.knee_sentence or ''} {analysis.crossover_sentence or ''}".strip()
        lines += ["", f"## Predicted vs measured: {target}", "", sentences, ""]
        lines += markdown_table(
            ["component", "what determines its time", "predicted", "measured", "agreement"],
            [list(row.values()) for row in analysis.predictions_table],
        )
    return lines
