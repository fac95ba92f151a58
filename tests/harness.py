"""Start a service as its own process (its own virtualenv), find its ports, wait for health, stop it.

Every test that needs a server uses this: a real process, a real port chosen by the OS, a real channel.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"gRPC listening on (\S+):(\d+), metrics on (\S+)")


def venv_python(name: str) -> str:
    """The interpreter of `.venv/<name>`; the current one when running inside it already."""
    path = REPO / ".venv" / name / "bin" / "python"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `make setup`")
    return str(path)


class ServiceProcess:
    """A service running in a child process; its stdout and stderr are kept for failure messages."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._listening = threading.Event()
        self.address = ""
        self.metrics_url = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not self._listening.is_set():
                self.address = f"{match[1]}:{match[2]}"
                self.metrics_url = match[3]
                self._listening.set()

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._listening.wait(0.1):
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader drain
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"service did not listen within {timeout_s} s:\n{self.output()}")

    def health(self, service: str = "") -> int:
        with grpc.insecure_channel(self.address) as channel:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                .status
            )

    def _serving(self) -> bool:
        try:
            return self.health() == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError as error:
            # An engine loading in the same process can hold the GIL past the health deadline: not serving yet.
            if error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return False
            raise

    def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._serving():
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"service not SERVING within {timeout_s} s:\n{self.output()}")
            time.sleep(0.2)

    def terminate(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_service(
    module: str, python: str = sys.executable, args: Sequence[str] = (), env: dict[str, str] | None = None
) -> ServiceProcess:
    """Start `python -m module` on free ports of the loopback interface; returns once it is listening."""
    proc = subprocess.Popen(
        [python, "-u", "-m", module, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    service = ServiceProcess(proc)
    try:
        service.wait_listening(timeout_s=120)
    except BaseException:
        service.terminate(5)
        raise
    return service


@contextlib.contextmanager
def running_service(
    module: str,
    python: str = sys.executable,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 300,
) -> Iterator[ServiceProcess]:
    """A SERVING service for the duration of the block; stopped (SIGTERM, then kill) afterwards."""
    service = start_service(module, python, args, env)
    try:
        service.wait_serving(ready_timeout_s)
        yield service
    finally:
        service.terminate()


def proc_stat(pid: int, tid: int | None = None) -> list[str]:
    """/proc/<pid>/stat (or one thread's, /proc/<pid>/task/<tid>/stat) after the command name: [state, ppid,
    ...]; user and system CPU ticks are at indices 11 and 12, the nice value at 16."""
    path = Path(f"/proc/{pid}/stat") if tid is None else Path(f"/proc/{pid}/task/{tid}/stat")
    return path.read_text().rsplit(")", 1)[1].split()


def child_processes(parent_pid: int, matches: Callable[[bytes], bool]) -> list[int]:
    """Pids of `parent_pid`'s children whose command line (NUL-separated) `matches`: an engine process, say."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes()
            parent = int(proc_stat(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if parent == parent_pid and matches(command):
            found.append(int(entry.name))
    return found
