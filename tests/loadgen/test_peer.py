"""The side by side: `vllm serve` on the LLM's tiny preset with our service's engine arguments, beside our
service, the two taking turns per round and level; the verdict pools the rounds and states their spread."""

from __future__ import annotations

import json
import subprocess

from loadgen.peer import Comparison
from loadgen.processes import peer_command
from tests.harness import REPO, venv_python


def test_interleaved_rounds_run_the_same_workload_on_both_sides(tmp_path, services):
    command = [venv_python("dev"), "-m", "loadgen", "compare", "--llm", services["llm"].address,
               "--llm-metrics", services["llm"].metrics_url, "--rounds", "2", "--quick", "--reports", str(tmp_path),
               "--prompt-tokens", "32", "--output-tokens", "16", "--peer-args=--enforce-eager"]  # fmt: skip
    # (--enforce-eager: this test checks the procedure, not the peer's speed)
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder,) = tmp_path.iterdir()
    turns = json.loads((folder / "peer" / "turns.json").read_text())

    # Interleaved: per round, per level, both sides one after the other; the order flips every round.
    order = [(turn["round"], turn["concurrency"], turn["side"]) for turn in turns]
    assert order == [(1, 1, "ours"), (1, 1, "peer"), (1, 16, "ours"), (1, 16, "peer"),
                     (2, 1, "peer"), (2, 1, "ours"), (2, 16, "peer"), (2, 16, "ours")]  # fmt: skip
    assert [turn["started_s"] for turn in turns] == sorted(turn["started_s"] for turn in turns)
    assert all(turn["requests"] > 0 and turn["errors"] == 0 and turn["tokens_per_s"] > 0 for turn in turns)

    # The same fixed-length workload on both sides: 16 tokens, one inter-token gap per later token, 32 prompt tokens.
    for records in (folder / "peer").glob("round*/requests.jsonl"):
        for record in map(json.loads, records.read_text().splitlines()):
            assert record["ok"] and record["units"] == 16 and len(record["gaps_s"]) == 15
            assert record["extra"]["prompt_tokens"] == 32

    rows = json.loads((folder / "peer" / "comparison.json").read_text())
    assert [(row["concurrency"], row["rounds"]) for row in rows] == [(1, 2), (16, 2)]
    for row in rows:
        assert "over 2 rounds" in row["verdict"] and row["verdict"].count("±") == 2


def test_verdict_needs_a_difference_larger_than_the_spread():
    # Rounds that disagree (one 20% slower, one 10% faster): a 5% pooled gap is within their spread.
    noisy = Comparison("tokens/s", ours=95.0, peer=100.0, ratios=[0.8, 1.1], lower_is_better=False)
    assert noisy.verdict().startswith("tokens/s matches (-5%, ±15% over 2 rounds")
    # Rounds that agree: the same gap is a result.
    steady = Comparison("tokens/s", ours=95.0, peer=100.0, ratios=[0.94, 0.95, 0.96], lower_is_better=False)
    assert steady.verdict().startswith("tokens/s trails by 5%")
    faster = Comparison("TTFT p50", ours=0.09, peer=0.1, ratios=[0.89, 0.9, 0.91], lower_is_better=True)
    assert faster.verdict().startswith("TTFT p50 beats by 10%")
    assert Comparison("TTFT p50", 0.0, 0.1, [], True).verdict() == "TTFT p50: no data"


def test_peer_gets_our_engine_arguments():
    command = peer_command("tiny", 8000)
    assert "--load-format" in command and "dummy" in command  # synthetic weights, like our service
    assert command[command.index("--max-model-len") + 1].isdigit()
