"""A SIGKILLed TTS service takes every process it started with it (voiceagent/serving/lifeline.py): the pool's
model workers and the batched engine process, while they load the model and once serving. A service stops when
the process that launched it dies."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.harness import REPO, venv_python
from tests.orphans import descendants, running, sigkill_leaves_no_orphans

ARGS = ["--preset", "tiny", "--workers", "2", "--max-batch", "2", "--probe-ceilings", "false"]
STOPPED_WITHIN_S = 15  # a drain of 1 s and the workers' stop, on a shared machine


@pytest.mark.parametrize("when", ["starting", "serving"])
@pytest.mark.parametrize("backend", ["pool", "batched"])
def test_no_model_process_outlives_a_sigkilled_service(backend, when):
    args = [*ARGS, "--backend", backend]
    gone_s = sigkill_leaves_no_orphans("services.tts", venv_python("tts"), args, when, lambda c: "spawn_main" in c)
    print(f"{backend}: every child gone {gone_s:.2f} s after SIGKILL ({when})")


LAUNCHER = """
import sys, time
from voiceagent.serving.launcher import start_service, venv_python
service = start_service("services.tts", venv_python("tts"), sys.argv[1:])
service.wait_serving(300)
print(service.pid, flush=True)
time.sleep(600)
"""


def test_a_service_stops_when_the_process_that_launched_it_is_killed():
    """The launcher (tests, benchmarks, the load generator's runs and soak) dying by SIGKILL stops the services it
    started: SIGTERM, so they drain and stop their engines; nothing is left."""
    args = [*ARGS, "--backend", "pool", "--grace-s", "1"]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        service_pid = int(launcher.stdout.readline())
        tree = descendants(launcher.pid)
        assert service_pid in tree and len(tree) >= 3, tree  # the service, its workers, the resource tracker
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + STOPPED_WITHIN_S
        while survivors := {pid: facts for pid, facts in tree.items() if running(pid, facts[0])}:
            assert time.monotonic() < deadline, f"left {STOPPED_WITHIN_S} s after the launcher died: {survivors}"
            time.sleep(0.1)
    finally:
        launcher.kill()
