"""End to end: `python -m loadgen sweep` against the real tiny services, over real channels, writing real reports.

Each sweep runs as its own process, as a person would run it (Locust monkey-patches the process for gevent).
Levels are a few seconds long: these tests check that every part is measured and reported, not the numbers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO, venv_python

REGIMES = {"overhead-bound", "bandwidth-bound", "compute-bound", "queueing"}
SHORT = ["--duration-s", "3", "--warmup-s", "1"]


def sweep(reports: Path, flags: list[str], target: str, *args: str) -> tuple[Path, dict, list[dict], str]:
    """Run one sweep; returns its report folder, results.json, requests.jsonl records and printed output."""
    command = [venv_python("dev"), "-m", "loadgen", "sweep", "--target", target, "--reports", str(reports)]
    result = subprocess.run(
        [*command, *flags, *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder,) = reports.iterdir()
    results = json.loads((folder / "results.json").read_text())
    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    return folder, results, records, result.stdout


def test_llm_sweep_writes_every_report_section(tmp_path, endpoint_flags):
    folder, results, records, stdout = sweep(
        tmp_path, endpoint_flags, "llm", "--concurrency", "1,2", *SHORT, "--prompt-tokens", "32",
        "--output-tokens", "16",
    )  # fmt: skip

    for name in ("report.md", "report.html", "results.json", "levels.csv", "requests.jsonl"):
        assert (folder / name).stat().st_size > 0, name
    for plot in ("throughput.png", "speed.png", "latency.png", "roofline.png"):
        assert (folder / plot).read_bytes()[:4] == b"\x89PNG", plot
    report = (folder / "report.md").read_text()
    for section in ("## Plots", "## The service", "## Levels measured", "## Analysis", "Predicted vs measured",
                    "Verdict", "Rules", "## Load generator self-check", "## How it ran"):  # fmt: skip
        assert section in report, section
    html = (folder / "report.html").read_text()
    assert '<img alt="Roofline' in html and "<table>" in html

    levels = results["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        assert level["requests"] > 0 and level["errors"] == 0
        assert level["throughput"] > 0 and level["throughput_unit"] == "tokens/s"
        assert level["latency"]["ttft_s"]["p50"] > 0 and level["latency"]["itl_s"]["count"] > 0
        assert level["server"]["flops_per_s"] > 0 and level["server"]["read_bytes_per_s"] > 0  # scraped counters
        assert level["loadgen_cpu"] > 0
    assert {verdict["regime"] for verdict in results["analysis"]["levels"]} <= REGIMES
    assert results["facts"]["peak_flops_per_s"] > 0 and results["facts"]["weight_bytes"] > 0
    assert len((folder / "levels.csv").read_text().splitlines()) == 3

    assert records and all(record["ok"] for record in records)
    for record in records:  # ignore_eos: exactly the requested length, one inter-token latency per later token
        assert record["units"] == 16 and len(record["gaps_s"]) == 15
        assert 0 < record["first_s"] <= record["latency_s"]
    assert "report:" in stdout and "regimes:" in stdout


def test_asr_streams_paced_in_real_time(tmp_path, endpoint_flags):
    _, results, records, _ = sweep(
        tmp_path, endpoint_flags, "asr", "--concurrency", "1,2", *SHORT, "--utterance-s", "2", "--chunk-ms", "160"
    )
    assert records and all(record["ok"] for record in records)
    for record in records:
        # Paced like a microphone: the final cannot come before the audio has been spoken.
        assert record["latency_s"] >= record["extra"]["audio_s"] == 2.0
        assert record["extra"]["final_latency_s"] > 0
        assert 10 <= len(record["gaps_s"]) <= 14  # about one latency per 160 ms chunk of 2 s
    for level in results["levels"]:
        assert level["throughput_unit"] == "audio s/s" and level["realtime_ok"] is not None
        assert level["latency"]["final_latency_s"]["count"] == level["requests"]


def test_tts_reports_audio_gaps_and_underruns(tmp_path, endpoint_flags):
    _, results, records, _ = sweep(
        tmp_path, endpoint_flags, "tts", "--concurrency", "1,2", *SHORT, "--text-words", "3-6"
    )
    assert records and all(record["ok"] for record in records)
    for record in records:
        assert record["units"] > 0 and record["first_s"] > 0 and "underruns" in record["extra"]
    for level in results["levels"]:
        assert level["throughput"] > 0 and level["latency"]["first_audio_s"]["p50"] > 0
        assert isinstance(level["realtime_ok"], bool) and "underruns" in level["extra"]


def test_voice_turn_completes(tmp_path, endpoint_flags):
    folder, results, records, _ = sweep(
        tmp_path, endpoint_flags, "voice", "--concurrency", "1", "--requests", "2", "--warmup-s", "0",
        "--utterance-s", "2", "--reply-tokens", "12",
    )  # fmt: skip
    assert records and all(record["ok"] for record in records), records[:1]
    for record in records:
        extra = record["extra"]
        assert extra["reply_tokens"] == 12 and extra["reply_audio_s"] > 0
        stages = extra["asr_final_s"] + extra["llm_ttft_s"] + extra["tts_first_audio_s"]
        assert stages == pytest.approx(record["first_s"], abs=1e-6)  # the shares add up to voice-to-voice
        assert min(extra["asr_final_s"], extra["llm_ttft_s"], extra["tts_first_audio_s"]) > 0
    latency = results["levels"][0]["latency"]
    assert set(latency) >= {"voice_to_voice_s", "asr_final_s", "llm_ttft_s", "tts_first_audio_s"}
    assert (folder / "voice_stages.png").exists()


def test_sweep_stops_at_the_first_level_past_the_objective(tmp_path, endpoint_flags):
    _, results, _, stdout = sweep(
        tmp_path, endpoint_flags, "llm", "--concurrency", "1,2,4", *SHORT, "--output-tokens", "8",
        "--objective-s", "0.000001",
    )  # fmt: skip
    (level,) = results["levels"]
    assert "objective" in level["stopped_early"] and "stopping after concurrency 1" in stdout


def test_distributed_workers_deliver_every_record(tmp_path, endpoint_flags):
    _, results, records, _ = sweep(
        tmp_path, endpoint_flags, "llm", "--concurrency", "2", "--requests", "6", "--warmup-s", "1",
        "--workers", "2", "--output-tokens", "8",
    )  # fmt: skip
    (level,) = results["levels"]
    assert level["requests"] >= 6 and len(records) == level["requests"] + level["errors"]
    assert level["extra"]["loadgen_processes"] == 3  # the master and two workers, CPU counted over all
