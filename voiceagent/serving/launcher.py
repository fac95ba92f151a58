"""Start a service as its own process (its own virtualenv), find its ports, wait for health, read its metrics,
stop it: the one launcher the load generator, the benchmarks, the results/ scripts and the tests all use.

A service prints `<name>: gRPC listening on HOST:PORT, metrics on URL` once bound (voiceagent/serving/server.py);
ports are chosen by the OS (port 0), so launched services never collide with others. Output goes to a log file
(a temporary one unless named), which is what failure messages quote; temporary logs are removed when the
launching process exits (VOICEAGENT_KEEP_LOGS=1 keeps them). A child can be given a folder of its own for what it
would leave in the temp folder (`private_tmp`: e.g. `vllm serve`'s IPC sockets), removed once it stopped. A service
started here stops (SIGTERM: it drains) when the process that started it dies, however
(voiceagent/serving/lifeline.py).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from voiceagent.serving.lifeline import launcher_env
from voiceagent.serving.tempdirs import private_folder, shared_temp, temp_env
from voiceagent.serving.tls import PLAINTEXT, ClientTls, open_channel

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"gRPC listening on (\S+):(\d+), metrics on (\S+)")


def venv_python(name: str) -> str:
    """The interpreter of `.venv/<name>` (`make setup` builds one per service and `dev`)."""
    path = REPO / ".venv" / name / "bin" / "python"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `make setup`")
    return str(path)


_LOG_FOLDERS: list[Path] = []  # the folder of the logs this process made up for its children, removed when it exits
_PRIVATE_FOLDERS: list[Path] = []  # children's own temp folders, removed when it exits (if not before)


def _temporary_log(name: str) -> Path:
    """A log for a child the caller named none for. It goes in a folder of this process's own, removed when it exits
    (or, if it is SIGKILLed, by the next process's first temporary log), unless VOICEAGENT_KEEP_LOGS=1 asks to keep
    it: then in the shared temp folder."""
    folder = shared_temp()
    if os.environ.get("VOICEAGENT_KEEP_LOGS") != "1":
        if not _LOG_FOLDERS:
            _LOG_FOLDERS.append(private_folder("voiceagent-logs-"))
        folder = str(_LOG_FOLDERS[0])
    handle, path = tempfile.mkstemp(prefix=f"{name.replace(' ', '-')}-", suffix=".log", dir=folder)
    os.close(handle)
    return Path(path)


@atexit.register
def _remove_temporary_files() -> None:
    for folder in (*_LOG_FOLDERS, *_PRIVATE_FOLDERS):
        shutil.rmtree(folder, ignore_errors=True)


class Process:
    """A child process with its output in `log`; `stop` sends SIGTERM (services drain), then kills."""

    def __init__(self, name: str, command: Sequence[str], log: Path | None = None, env: dict[str, str] | None = None,
                 private_tmp: str = ""):  # fmt: skip
        """`private_tmp`: an environment variable the child gets naming a folder of its own, removed once the
        child stopped (by `stop`, or when this process exits). It is the child's temp folder too (TMPDIR), so
        what the child leaves there when killed (`vllm serve`'s FileStore file) goes with it."""
        self.private = None
        if private_tmp:
            self.private = private_folder(f"{name.replace(' ', '-')}-")
            _PRIVATE_FOLDERS.append(self.private)
            env = {**(env or {}), **temp_env(self.private), private_tmp: str(self.private)}
        if log is None:
            log = _temporary_log(name)
        self.name, self.log = name, log
        self.started_at = time.time()  # wall clock, to tell which start-ups overlapped what
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                list(command),
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **launcher_env(), **(env or {})},
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = "\n".join(self.output().splitlines()[-40:])
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; last lines of {self.log}:\n{tail}")

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.private is not None:
            shutil.rmtree(self.private, ignore_errors=True)
        return self.proc.returncode


class ServiceProcess(Process):
    """`python -m <module>` on free loopback ports; `address` and `metrics_url` once `wait_listening` returns.
    A service serving TLS (`--tls-cert` ... in `args`) is health-checked with `tls`."""

    def __init__(self, module: str, python: str = sys.executable, args: Sequence[str] = (), log: Path | None = None,
                 env: dict[str, str] | None = None, host: str = "127.0.0.1", tls: ClientTls = PLAINTEXT):  # fmt: skip
        command = [python, "-u", "-m", module, "--host", host, "--port", "0", "--metrics-port", "0", *args]
        super().__init__(module.removeprefix("services."), command, log, env)
        self.tls = tls
        self.address = self.metrics_url = ""
        self.serving_at = 0.0

    def wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.address:
            if match := LISTENING.search(self.output()):
                self.address, self.metrics_url = f"{match[1]}:{match[2]}", match[3]
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not listen within {timeout_s:g} s:\n{self.output()[-4000:]}")
            time.sleep(0.1)

    def health(self, service: str = "") -> int:
        with open_channel(self.address, self.tls) as channel:
            request = health_pb2.HealthCheckRequest(service=service)
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status

    def serving(self) -> bool:
        try:
            return self.health() == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError as error:
            # An engine loading in the same process can hold the GIL past the health deadline: not serving yet.
            if error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return False
            raise

    def wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self.wait_listening(timeout_s)
        while not self.serving():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not SERVING within {timeout_s:g} s:\n{self.output()[-4000:]}")
            time.sleep(0.2)
        self.serving_at = time.time()

    def metrics(self) -> dict[str, float]:
        return read_metrics(self.metrics_url)

    # the tests' name for stop()
    terminate = Process.stop


class HttpProcess(Process):
    """A server that is ready when GET `ready_url` answers 200 (e.g. `vllm serve`'s /v1/models)."""

    def __init__(self, name: str, command: Sequence[str], log: Path | None, ready_url: str,
                 env: dict[str, str] | None = None, private_tmp: str = ""):  # fmt: skip
        super().__init__(name, command, log, env, private_tmp)
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


def start_service(module: str, python: str = sys.executable, args: Sequence[str] = (),
                  env: dict[str, str] | None = None, log: Path | None = None,
                  tls: ClientTls = PLAINTEXT) -> ServiceProcess:  # fmt: skip
    """Start `python -m module` on free loopback ports; returns once it is listening (not yet SERVING)."""
    service = ServiceProcess(module, python, args, log, env, tls=tls)
    try:
        service.wait_listening(timeout_s=120)
    except BaseException:
        service.stop(5)
        raise
    return service


@contextlib.contextmanager
def running_service(
    module: str,
    python: str = sys.executable,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 300,
    tls: ClientTls = PLAINTEXT,
) -> Iterator[ServiceProcess]:
    """A SERVING service for the duration of the block; stopped (SIGTERM, then kill) afterwards."""
    service = start_service(module, python, args, env, tls=tls)
    try:
        service.wait_serving(ready_timeout_s)
        yield service
    finally:
        service.stop()


def scrape_samples(url: str, timeout_s: float = 10) -> list[Sample]:
    """Every sample of a Prometheus text endpoint, parsed by prometheus_client (name, labels, value)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


_MISSING = object()


def sample_sum(samples: Iterable[Sample], name: str, default: float | object = _MISSING, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`; LookupError when none does (unless a
    `default` is given: an unlabelled series not observed yet, say)."""
    found = [sample.value for sample in samples if sample.name == name and labels.items() <= sample.labels.items()]
    if not found:
        if default is _MISSING:
            raise LookupError(f"{name} {labels} not exported")
        return default
    return sum(found)


def read_metrics(url: str, timeout_s: float = 10) -> dict[str, float]:
    """Every sample of a Prometheus text endpoint, by name with its labels (`name{a="b"}`), summed over duplicates."""
    samples: dict[str, float] = {}
    for sample in scrape_samples(url, timeout_s):
        labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
        key = f"{sample.name}{{{labels}}}" if labels else sample.name
        samples[key] = samples.get(key, 0.0) + sample.value
    return samples


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
