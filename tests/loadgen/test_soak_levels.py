"""The soak's levels: about 70 % of each target's knee (or real-time limit) in a run's results.json, with the
run's presets and workload; fixed defaults without a run; an explicit level wins. Read from the committed
`make run` output (results/cpu/run-2026-12-03)."""

from __future__ import annotations

import argparse
import shutil

from loadgen.soak import DEFAULT_LEVELS, newest_run, soak_levels
from tests.harness import REPO

RUN = REPO / "results" / "cpu" / "run-2026-12-03"


def options(**given) -> argparse.Namespace:
    defaults = {"from_run": None, "preset": "", "reports": REPO / "no-such-reports", "asr": None, "llm": None}
    return argparse.Namespace(**(defaults | {"tts": None, "voice": None} | given))


def test_levels_are_70_percent_of_each_knee_of_the_run_with_its_presets_and_workload():
    plan = soak_levels(options(from_run=RUN))
    levels = {target: level["concurrency"] for target, level in plan["levels"].items()}
    # LLM knee 16, TTS knee 4; ASR (no knee up to 32) and the voice turn by their real-time limits 8 and 2.
    assert levels == {"asr": 6, "llm": 11, "tts": 3, "voice": 1}
    assert "the knee" in plan["levels"]["llm"]["why"] and "real-time limit" in plan["levels"]["asr"]["why"]
    assert plan["presets"] == {"asr": "fastconformer-small", "llm": "cpu", "tts": "small"}
    flags = plan["workload"]
    assert flags[flags.index("--prompt-tokens") + 1] == "128" and flags[flags.index("--chunk-ms") + 1] == "160"


def test_without_a_run_or_with_a_preset_the_levels_are_the_defaults_and_a_given_level_wins():
    plan = soak_levels(options(preset="tiny", llm=2))
    assert plan["run"] is None and plan["presets"] == {} and plan["workload"] == []
    assert {t: level["concurrency"] for t, level in plan["levels"].items()} == DEFAULT_LEVELS | {"llm": 2}
    assert plan["levels"]["llm"]["why"] == "set on the command line"
    assert "--preset given" in plan["levels"]["asr"]["why"]
    assert "no run found" in soak_levels(options())["levels"]["tts"]["why"]


def test_make_soak_reads_the_newest_run_in_reports(tmp_path):
    assert newest_run(tmp_path) is None
    (tmp_path / "20261201-000000-run" / "llm").mkdir(parents=True)  # a run without results does not count
    shutil.copytree(RUN, tmp_path / "20261130-000000-run")
    assert newest_run(tmp_path) == tmp_path / "20261130-000000-run"
    assert soak_levels(options(reports=tmp_path))["levels"]["llm"]["concurrency"] == 11
