"""A sweep of the LLM service on its openai backend (the engine on another server): each level's regime is
"remote: not classified", and throughput, TTFT, ITL and the knee are still measured and reported. The
upstream is the openai backend tests' OpenAI-compatible server (tests/llm/upstream_server.py), streaming
token-id prompts' tokens at a fixed pace; the service is the real LLM service process."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.harness import REPO, running_service, venv_python
from tests.loadgen.test_sweep import SHORT, sweep


@pytest.fixture(scope="module")
def upstream_url():
    server = subprocess.Popen([venv_python("llm"), "-u", "-m", "tests.llm.upstream_server"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    line = server.stdout.readline()
    match = re.search(r"listening on (\S+):(\d+)", line)
    assert match, line
    yield f"http://{match[1]}:{match[2]}/v1"
    server.terminate()
    server.wait(10)


def test_a_remote_llm_is_swept_without_regime_guesses(tmp_path, upstream_url):
    args = ["--backend", "openai", "--upstream-url", upstream_url]
    with running_service("services.llm", venv_python("llm"), args, ready_timeout_s=60) as llm:
        flags = ["--llm", llm.address, "--llm-metrics", llm.metrics_url]
        folder, results, records, stdout = sweep(
            tmp_path, flags, "llm", "--concurrency", "1,2", *SHORT, "--prompt-tokens", "16", "--output-tokens", "8"
        )
    assert results["facts"]["device"] == "remote" and results["facts"]["backend"] == "openai"
    for level in results["levels"]:
        assert level["requests"] > 0 and level["errors"] == 0 and level["throughput"] > 0
        assert level["latency"]["ttft_s"]["count"] > 0 and level["latency"]["itl_s"]["count"] > 0
    analysis = results["analysis"]
    assert [verdict["regime"] for verdict in analysis["levels"]] == ["remote: not classified"] * 2
    assert "Knee at" in analysis["knee_sentence"] or "No knee up to C=2" in analysis["knee_sentence"]
    report = (folder / "report.md").read_text()
    assert "**remote: not classified**" in report and "the engine is remote" in report
    assert all(record["ok"] and record["units"] == 8 for record in records)
