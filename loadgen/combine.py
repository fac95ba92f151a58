"""`python -m loadgen combine --into RUN PART...`: one report from a run made in parts.

A run on a lent GPU cannot always be one command (a device call may last 10 minutes): it is made as parts,
`python -m loadgen run --device cuda --only llm --folder PART`, each with its own sweeps, logs and stage.json.
This joins them: each part's target folders (asr/, llm/, tts/, voice/, peer/) are copied into RUN, its logs into
RUN/logs/<part>/, each sweep's report is written again from its results.json with this code's analysis (so a
fix of the analysis reaches recorded runs), and RUN/report.md and report.html are written as `make run` writes
them, with each part's stages and failures. A target measured in two parts is taken from the last part given.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from loadgen.analysis.recorded import facts_from_dict, level_from_dict
from loadgen.main_job import STAGES, _plan, index
from loadgen.report import write_html, write_report
from loadgen.sweep import Sweep, SweepPlan
from loadgen.workload import Workload


def recorded(results: Path) -> Sweep:
    """The sweep a results.json holds, as the sweep runner returned it (less the per-request records)."""
    data = json.loads(results.read_text(encoding="utf-8"))
    levels = sorted((level_from_dict(level) for level in data["levels"]), key=lambda level: level.concurrency)
    names = {field.name for field in dataclasses.fields(SweepPlan)}
    plan = SweepPlan(**{key: value for key, value in data["plan"].items() if key in names})
    return Sweep(data["target"], facts_from_dict(data["facts"]), levels, list(data.get("warnings", [])), plan,
                 Workload.from_json(json.dumps(data["workload"])))  # fmt: skip


def rewrite(folder: Path) -> tuple:
    """Re-analyse a sweep folder's results.json with this code and rewrite its report, plots, results.json and
    levels.csv (requests.jsonl is kept as it is); returns (sweep, analysis)."""
    created = json.loads((folder / "results.json").read_text(encoding="utf-8")).get("created")
    sweep = recorded(folder / "results.json")
    analysis, _ = write_report(sweep, folder)
    data = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    data.update(created=created, reanalysed=data["created"])  # when it ran, and when this report was written
    (folder / "results.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return sweep, analysis


def combine_parts(parts: list[Path], into: Path) -> int:
    into.mkdir(parents=True, exist_ok=False)
    sweeps: dict[str, tuple] = {}
    comparison: list[dict] = []
    times: list[tuple[str, float]] = []
    failures: list[str] = []
    devices: set[str] = set()
    for part in parts:
        stage_file = part / "stage.json"
        stage = json.loads(stage_file.read_text(encoding="utf-8")) if stage_file.is_file() else {}
        if not stage:
            failures.append(f"part {part.name}: no stage.json (the part was stopped before it finished)")
        devices.add(stage.get("device", ""))
        if stage.get("failure"):
            failures.append(f"part {part.name}: {stage['failure']}")
        times += [(f"{part.name}: {name}", seconds) for name, seconds in stage.get("times", [])]
        for target in STAGES:
            source = part / target
            if not source.is_dir():
                continue
            shutil.rmtree(into / target, ignore_errors=True)
            shutil.copytree(source, into / target)
            if (source / "results.json").is_file():
                sweeps[target] = rewrite(into / target)
            if target == "peer" and (source / "comparison.json").is_file():
                comparison = json.loads((source / "comparison.json").read_text(encoding="utf-8"))
        if (part / "logs").is_dir():
            shutil.copytree(part / "logs", into / "logs" / part.name)
    device = "/".join(sorted(filter(None, devices))) or "cpu"
    ordered = {target: sweeps[target] for target in STAGES if target in sweeps}
    text = index(ordered, comparison, times, "\n".join(failures), device) + _plan(into, ordered)
    made = (f"Made in {len(parts)} parts (`python -m loadgen run --only ...`), joined by `python -m loadgen "
            f"combine`: {', '.join(part.name for part in parts)}.")  # fmt: skip
    text = text.replace("# voiceagent run\n", f"# voiceagent run\n\n{made}\n", 1)
    (into / "report.md").write_text(text, encoding="utf-8")
    write_html(text, into / "report.html", "voiceagent run")
    print(f"report: {into / 'report.md'} (and report.html) from {len(parts)} parts; targets {', '.join(ordered)}")
    return 1 if failures or not ordered else 0
