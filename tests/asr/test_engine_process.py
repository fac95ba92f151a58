"""The model runs in its own process: losing it fails open streams with UNAVAILABLE and stops the service;
losing the gRPC process takes the engine process with it (no orphan holding the model's memory)."""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest

from tests.asr.client import hold_stream
from tests.harness import child_processes, running_service, venv_python
from tests.orphans import sigkill_leaves_no_orphans

ARGS = ["--preset", "tiny", "--threads", "1", "--probe-ceilings", "false", "--grace-s", "2"]


def engine_pid(service_pid: int) -> int:
    """The service's engine process: its child started by multiprocessing's spawn (not the resource tracker)."""
    (pid,) = child_processes(service_pid, lambda command: b"spawn_main" in command)
    return pid


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_dead_engine_fails_open_streams_with_unavailable_and_stops_the_service():
    with running_service("services.asr", venv_python("asr"), ARGS) as service:
        _channel, call = hold_stream(service.address, "orphaned")
        os.kill(engine_pid(service.proc.pid), signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "engine process exited" in caught.value.details()
        # The service drains and exits on its own, so that docker or Kubernetes starts a fresh one.
        wait_until(lambda: service.proc.poll() is not None, 60, "the service kept running without its engine")
        assert "failing 1 open streams" in service.output()


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_the_engine_process_dies_with_the_grpc_process_even_by_sigkill(when):
    """No drain, no stop message, also while the engine loads its model (voiceagent/serving/lifeline.py)."""
    gone_s = sigkill_leaves_no_orphans("services.asr", venv_python("asr"), ARGS, when, lambda c: "spawn_main" in c)
    print(f"every child gone {gone_s:.2f} s after SIGKILL ({when})")
