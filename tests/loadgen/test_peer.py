"""The peer target: `vllm serve` on the LLM's tiny preset with our service's engine arguments, driven by the
same LLM workload through its OpenAI-compatible completions endpoint."""

from __future__ import annotations

import socket

from loadgen.processes import HttpProcess, peer_command
from tests.loadgen.test_sweep import sweep


def test_openai_peer_runs_the_same_workload(tmp_path, services):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = peer_command("tiny", port)
    assert "--load-format" in command and "dummy" in command  # synthetic weights, like our service
    command.append("--enforce-eager")  # skip the compile warm-up: this test checks the workload, not speed
    base_url = f"http://127.0.0.1:{port}"
    peer = HttpProcess("vllm serve", command, tmp_path / "vllm-serve.log", f"{base_url}/v1/models")
    try:
        peer.wait_ready(300)
        flags = ["--openai", base_url, "--llm", services["llm"].address]  # our service: the model's facts
        _, results, records, _ = sweep(
            tmp_path / "reports", flags, "openai", "--concurrency", "1,2", "--duration-s", "3", "--warmup-s", "1",
            "--prompt-tokens", "32", "--output-tokens", "16",
        )  # fmt: skip
    finally:
        peer.stop()
    assert records and all(record["ok"] for record in records), records[:1]
    for record in records:  # same fixed-length workload: 16 tokens, one inter-token latency per later token
        assert record["units"] == 16 and len(record["gaps_s"]) == 15 and record["extra"]["prompt_tokens"] == 32
    assert [level["concurrency"] for level in results["levels"]] == [1, 2]
    assert all(level["throughput"] > 0 for level in results["levels"])
