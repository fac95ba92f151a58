"""A SIGKILLed LLM service takes vLLM's engine core with it (voiceagent/serving/lifeline.py), also while the engine
loads (an engine core orphaned at start-up was seen holding 1.6 GB), and with several front ends: the supervisor's
death takes the front ends and the engine core."""

from __future__ import annotations

import pytest

from tests.harness import venv_python
from tests.llm.conftest import READY_TIMEOUT_S, TEST_ARGS, TEST_ENV
from tests.orphans import sigkill_leaves_no_orphans

ARGS = ["--preset", "tiny", "--max-in-flight", "8", *TEST_ARGS]


def engine_core(command: str) -> bool:
    return command.startswith("VLLM::EngineCore")


@pytest.mark.parametrize("when", ["starting", "serving"])
@pytest.mark.parametrize("frontends", [1, 2])
def test_no_engine_core_outlives_a_sigkilled_service(frontends, when):
    args = [*ARGS, "--frontends", str(frontends)]
    gone_s = sigkill_leaves_no_orphans("services.llm", venv_python("llm"), args, when, engine_core, TEST_ENV,
                                       READY_TIMEOUT_S)  # fmt: skip
    print(f"{frontends} front ends: every child gone {gone_s:.2f} s after SIGKILL ({when})")
