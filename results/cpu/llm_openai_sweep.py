"""A load-generator sweep of the LLM service on its openai backend in front of `vllm serve` on the cpu preset
(the engine arguments our vllm backend builds for it, as the side-by-side starts it). The report's regime
column says "remote: not classified"; throughput, TTFT, ITL and the knee are still measured.

    flock /tmp/bench.lock .venv/llm/bin/python results/cpu/llm_openai_sweep.py results/cpu/llm_openai_sweep_DATE

Writes into the folder: command.txt (the sweep's command), sweep.txt (its printed output), reports/ (the
load generator's report), vllm-serve.log and llm-openai.log.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from loadgen.processes import HttpProcess, ServiceProcess, peer_command  # noqa: E402

LEVELS = "1,2,4,8,16,32"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(out: Path) -> None:
    out.mkdir(parents=True)
    port = free_port()
    serve = HttpProcess("vllm serve", peer_command("cpu", port), out / "vllm-serve.log",
                        f"http://127.0.0.1:{port}/v1/models")  # fmt: skip
    try:
        serve.wait_ready(900)
        upstream = ["--backend", "openai", "--upstream-url", f"http://127.0.0.1:{port}/v1"]
        llm = ServiceProcess("llm", out / "llm-openai.log", upstream)
        try:
            llm.wait_serving(120)
            command = [".venv/dev/bin/python", "-m", "loadgen", "sweep", "--target", "llm", "--llm", llm.address,
                       "--llm-metrics", llm.metrics_url, "--concurrency", LEVELS, "--duration-s", "10",
                       "--warmup-s", "2", "--prompt-tokens", "64", "--output-tokens", "64",
                       "--reports", str(out / "reports")]  # fmt: skip
            (out / "command.txt").write_text(" ".join(command) + "\n")
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
            (out / "sweep.txt").write_text(result.stdout + result.stderr)
            print(result.stdout[-4000:], result.stderr[-2000:])
        finally:
            llm.stop()
    finally:
        serve.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
