"""What the tests of pods of gRPC front ends (`--frontends N`, voiceagent/serving/frontends.py) share: killing the
pod's engine and what must follow, for every service built that way."""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from tests.harness import child_processes


def kill_engine(pod) -> None:
    """SIGKILL the pod's engine: of the supervisor's spawned children it is the first started (the front ends
    follow it, and with setproctitle they are named `<service>-frontend-<i>` instead)."""
    os.kill(min(child_processes(pod.proc.pid, lambda command: b"spawn_main" in command)), signal.SIGKILL)


def assert_calls_end_unavailable(calls) -> None:
    """Every streaming call (an iterator of responses) ends UNAVAILABLE: the client may retry elsewhere."""
    for call in calls:
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def assert_pod_exits(pod, within_s: float = 60) -> None:
    """The pod drains and exits non-zero on its own, for its orchestrator to restart it."""
    deadline = time.monotonic() + within_s
    while pod.proc.poll() is None:
        assert time.monotonic() < deadline, "the pod kept running without its engine"
        time.sleep(0.1)
    assert pod.proc.returncode != 0
