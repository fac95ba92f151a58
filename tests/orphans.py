"""SIGKILL a service and check that every process it started went with it (voiceagent/serving/lifeline.py):
no engine process, model worker, front end or vLLM engine core lives on holding the model's memory."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from grpc_health.v1 import health_pb2

from tests.harness import ServiceProcess, proc_stat, start_service

GONE_WITHIN_S = 3  # the lifeline acts at once (parent-death signal) or within 0.25 s (its watch thread)
_START_TIME = 19  # /proc/<pid>/stat field 22 (start time, in clock ticks), indexed as proc_stat returns it


def descendants(pid: int) -> dict[int, tuple[str, str]]:
    """Every process under `pid`, recursively: pid -> (start time, command line)."""
    children: dict[int, list[int]] = {}
    facts: dict[int, tuple[str, str]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = proc_stat(int(entry.name))
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(stat[1]), []).append(int(entry.name))
        facts[int(entry.name)] = (stat[_START_TIME], command)
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = facts[child]
            todo.append(child)
    return found


def running(pid: int, start_time: str) -> bool:
    """`pid` is still the same process (not a reused pid) and not a zombie."""
    try:
        stat = proc_stat(pid)
    except OSError:
        return False
    return stat[_START_TIME] == start_time and stat[0] != "Z"


def wait_for_child(service: ServiceProcess, matches: Callable[[str], bool], timeout_s: float) -> None:
    """Until a process under the service has a command line that `matches` (its engine is starting, say)."""
    deadline = time.monotonic() + timeout_s
    while not any(matches(command) for _, command in descendants(service.pid).values()):
        service.check_alive()
        assert time.monotonic() < deadline, f"no matching child of {service.name} within {timeout_s} s"
        time.sleep(0.1)


def assert_still_starting(service: ServiceProcess) -> None:
    assert not service.serving(), f"{service.name} is already SERVING: this would not test a kill during start-up"


def assert_serving(service: ServiceProcess) -> None:
    assert service.health() == health_pb2.HealthCheckResponse.SERVING


def kill_and_assert_no_orphans(service: ServiceProcess, expect: Callable[[str], bool]) -> float:
    """SIGKILL the service; assert that a child that `expect` matches was running, and that within
    GONE_WITHIN_S no process it had started remains. Returns how long the last one took to go."""
    tree = descendants(service.pid)
    assert any(expect(command) for _, command in tree.values()), f"expected child missing: {tree}"
    os.kill(service.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    service.proc.wait()
    while survivors := {pid: facts for pid, facts in tree.items() if running(pid, facts[0])}:
        elapsed = time.monotonic() - killed_at
        assert elapsed < GONE_WITHIN_S, f"orphans {GONE_WITHIN_S} s after SIGKILL of {service.name}: {survivors}"
        time.sleep(0.05)
    return time.monotonic() - killed_at


def sigkill_leaves_no_orphans(module: str, python: str, args: list[str], when: str, expect: Callable[[str], bool],
                              env: dict[str, str] | None = None, ready_timeout_s: float = 600) -> float:  # fmt: skip
    """Start a service, SIGKILL it while its engine starts (`when="starting"`: a child `expect` matches exists,
    health is not SERVING yet) or once SERVING (`"serving"`), and assert that nothing it started survives."""
    service = start_service(module, python, args, env)
    try:
        if when == "starting":
            wait_for_child(service, expect, ready_timeout_s)
            assert_still_starting(service)
        else:
            service.wait_serving(ready_timeout_s)
            assert_serving(service)
        return kill_and_assert_no_orphans(service, expect)
    finally:
        service.stop(5)
