"""A SIGKILLed TTS service takes every process it started with it (voiceagent/serving/lifeline.py): the pool's
model workers and the batched engine process, while they load the model and once serving."""

from __future__ import annotations

import pytest

from tests.harness import venv_python
from tests.orphans import sigkill_leaves_no_orphans

ARGS = ["--preset", "tiny", "--workers", "2", "--max-batch", "2", "--probe-ceilings", "false"]


@pytest.mark.parametrize("when", ["starting", "serving"])
@pytest.mark.parametrize("backend", ["pool", "batched"])
def test_no_model_process_outlives_a_sigkilled_service(backend, when):
    args = [*ARGS, "--backend", backend]
    gone_s = sigkill_leaves_no_orphans("services.tts", venv_python("tts"), args, when, lambda c: "spawn_main" in c)
    print(f"{backend}: every child gone {gone_s:.2f} s after SIGKILL ({when})")
