"""A run made in parts (`python -m loadgen run --only ... --folder DIR`, as on the lent GPU, where one device call
lasts 10 minutes) and joined by `python -m loadgen combine`: the joined report covers every part, and a part
stopped before it finished is reported, not hidden. Tiny presets, short levels."""

from __future__ import annotations

import json
import shutil
import subprocess

from tests.harness import REPO, venv_python


def _loadgen(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([venv_python("dev"), "-m", "loadgen", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def test_parts_joined_into_one_report(tmp_path):
    for part, only in (("speech", "asr,tts"), ("text", "llm")):
        result = _loadgen("run", "--preset", "tiny", "--quick", "--only", only, "--folder", str(tmp_path / part))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        stage = json.loads((tmp_path / part / "stage.json").read_text())
        assert stage["stages"] == only.split(",") and not stage["failure"]
        # only the services a part needs were started
        assert sorted(log.stem for log in (tmp_path / part / "logs").glob("*.log")) == sorted(only.split(","))

    result = _loadgen("combine", "--into", str(tmp_path / "run"), str(tmp_path / "speech"), str(tmp_path / "text"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = tmp_path / "run"
    report = (run / "report.md").read_text()
    assert "Made in 2 parts" in report and (run / "report.html").is_file()
    for target in ("asr", "llm", "tts"):
        assert f"[{target}]({target}/report.md)" in report and f"## Predicted vs measured: {target}" in report
        assert (run / target / "results.json").is_file() and (run / target / "levels.csv").is_file()
        data = json.loads((run / target / "results.json").read_text())
        assert data["analysis"] and data["created"] < data["reanalysed"]  # re-analysed, the measurement kept
        assert "in flight / offered" in (run / target / "report.md").read_text()  # the generator's self-check
    assert "| component | what determines its time | predicted | measured | agreement |" in report
    assert "## Device ceilings" in report and "## Capacity plan" in report
    assert "speech: sweep asr" in report and "text: sweep llm" in report  # each part's stages
    assert (run / "logs" / "speech" / "asr.log").is_file() and (run / "logs" / "text" / "llm.log").is_file()

    # A part stopped before it finished (no stage.json): the joined report says so, and combine fails.
    shutil.copytree(tmp_path / "text", tmp_path / "cut")
    (tmp_path / "cut" / "stage.json").unlink()
    result = _loadgen("combine", "--into", str(tmp_path / "run2"), str(tmp_path / "speech"), str(tmp_path / "cut"))
    assert result.returncode == 1
    assert "part cut: no stage.json" in (tmp_path / "run2" / "report.md").read_text()
