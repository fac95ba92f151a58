"""Recorded sweeps read back from results.json, and the workload facts the predictions need from them.

results.json (written by the sweep runner) holds at least `facts` (ServiceFacts as a dict) and `levels`
(LevelResult dicts); `target`, `workload` (the sweep's Workload as a dict) and `analysis` are used when present.
Unknown keys are ignored, so older and newer files both load.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loadgen.analysis.work import asr_chunk_frames
from loadgen.results import LevelResult, Percentiles, ServerCounters, ServiceFacts


@dataclasses.dataclass
class RecordedSweep:
    target: str
    facts: ServiceFacts
    levels: list[LevelResult]
    workload: dict[str, Any]
    source: str  # the file it came from

    @property
    def variant(self) -> str:
        """What distinguishes this sweep from another of the same service (ASR chunk, TTS diffusion steps)."""
        if self.target == "asr" and chunk_ms(self):
            buffered = " buffered" if "buffer" in self.facts.backend else ""
            return f"chunk {chunk_ms(self):.0f} ms{buffered}"
        if self.target == "tts" and diffusion_steps(self):
            return f"{diffusion_steps(self):g} diffusion steps"
        return self.facts.preset or Path(self.source).parent.name


def _known(cls, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {field.name for field in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def level_from_dict(data: Mapping[str, Any]) -> LevelResult:
    fields = _known(LevelResult, data)
    fields["latency"] = {name: Percentiles(**_known(Percentiles, p)) for name, p in data.get("latency", {}).items()}
    fields["server"] = ServerCounters(**_known(ServerCounters, data.get("server", {})))
    return LevelResult(**fields)


def facts_from_dict(data: Mapping[str, Any]) -> ServiceFacts:
    return ServiceFacts(**_known(ServiceFacts, data))


def sweep_from_dict(data: Mapping[str, Any], source: str = "") -> RecordedSweep:
    if "facts" not in data or "levels" not in data:
        raise ValueError(f"{source or 'results'}: expected 'facts' and 'levels' (a sweep's results.json)")
    facts = facts_from_dict(data["facts"])
    levels = sorted((level_from_dict(level) for level in data["levels"]), key=lambda level: level.concurrency)
    target = data.get("target") or facts.service
    return RecordedSweep(target, facts, levels, dict(data.get("workload") or {}), source)


def read_sweeps(paths: list[str | Path]) -> list[RecordedSweep]:
    """Sweeps from results.json files, or from folders searched for them (a run folder holds one per target).

    A file may also hold several sweeps as {"sweeps": [...]}, or a list of them.
    """
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.rglob("results.json")) if path.is_dir() else [path]
    sweeps = []
    for file in files:
        data = json.loads(file.read_text(encoding="utf-8"))
        entries = data if isinstance(data, list) else data.get("sweeps", [data])
        sweeps += [sweep_from_dict(entry, str(file)) for entry in entries]
    return sweeps


def mean_length(spec: Any) -> float | None:
    """Mean of a workload length: a number, "64", "32-128", "lognormal:64,0.5", or {"spec": ...}."""
    if isinstance(spec, Mapping):
        spec = spec.get("spec")
    if isinstance(spec, int | float):
        return float(spec)
    if not isinstance(spec, str):
        return None
    if match := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*", spec):
        return float(match[1])
    if match := re.fullmatch(r"\s*(\d+)-(\d+)\s*", spec):
        return (int(match[1]) + int(match[2])) / 2
    if match := re.fullmatch(r"\s*lognormal:(\d+(?:\.\d+)?),(\d+(?:\.\d+)?)\s*", spec):
        return float(match[1]) * math.exp(float(match[2]) ** 2 / 2)
    return None


def workload_hints(workload: Mapping[str, Any]) -> dict[str, float]:
    """What `analyse(..., workload=...)` uses from a sweep's Workload (as a dict): mean prompt and output
    lengths (LLM), the ASR chunk and the TTS diffusion steps."""
    hints = {}
    for name in ("prompt_tokens", "output_tokens", "context_tokens", "chunk_ms", "inference_timesteps"):
        value = mean_length(workload.get(name))
        if value:
            hints[name] = value
    return hints


def chunk_ms(sweep: RecordedSweep) -> float | None:
    frames, frame_s, known = asr_chunk_frames(sweep.facts, workload_hints(sweep.workload))
    return frames * frame_s * 1000 if known else None


def diffusion_steps(sweep: RecordedSweep) -> float | None:
    steps = workload_hints(sweep.workload).get("inference_timesteps")
    return steps or sweep.facts.shape.get("inference_timesteps") or sweep.facts.shape.get("diffusion_steps")
