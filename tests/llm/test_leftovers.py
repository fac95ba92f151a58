"""A stopped LLM service leaves nothing in the temp folder but caches: vLLM's IPC sockets (seven per start, left
behind by vLLM itself) live in a folder of the service's own, removed when it exits. A SIGKILLed one leaves its
folders (its own, with what its killed engine core left there, and the front-end supervisor's metrics folder):
the next start removes them."""

from __future__ import annotations

import os
import signal
import stat
import time

from tests.harness import running_service, start_service, venv_python
from tests.llm.conftest import READY_TIMEOUT_S, TEST_ARGS, TEST_ENV

CACHES = {"torchinductor_root", "voiceagent-llm"}  # torch's compile cache; the staged model folder, kept to reuse


def sockets(folder) -> list[str]:
    return [p.name for p in folder.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


def test_a_stopped_llm_service_leaves_only_caches_in_its_temp_folder(short_tmp):
    tmp_path = short_tmp
    args = ["--preset", "tiny", *TEST_ARGS]
    env = {**TEST_ENV, "TMPDIR": str(tmp_path)}
    with running_service("services.llm", venv_python("llm"), args, env, READY_TIMEOUT_S):
        (private,) = tmp_path.glob("va-llm-*")
        assert sockets(private), "vLLM's IPC sockets are not in the service's own folder"
        assert not [name for name in sockets(tmp_path) if not (tmp_path / private.name / name).exists()]
    left = {p.name for p in tmp_path.iterdir()}
    assert left <= CACHES, f"left behind: {sorted(left - CACHES)}"
    assert not sockets(tmp_path)


def test_what_a_sigkilled_llm_service_left_is_removed_by_the_next_start(short_tmp):
    tmp_path = short_tmp
    env = {**TEST_ENV, "TMPDIR": str(tmp_path)}
    args = ["--preset", "tiny", *TEST_ARGS]
    killed = start_service("services.llm", venv_python("llm"), [*args, "--frontends", "2"], env)
    try:
        killed.wait_serving(READY_TIMEOUT_S)
    finally:
        os.kill(killed.pid, signal.SIGKILL)
        killed.proc.wait()
    time.sleep(1)  # the lifeline takes the front ends and the engine core
    left = {p.name for p in tmp_path.iterdir()} - CACHES
    (folder,) = left  # the service's own: the supervisor's metrics folder and the engine core's leftovers
    assert folder.startswith("va-llm-") and list((tmp_path / folder).glob("voiceagent-llm-metrics-*")), left
    # restarted with one front end: no supervisor, and the killed one's folder goes all the same
    with running_service("services.llm", venv_python("llm"), args, env, READY_TIMEOUT_S):
        assert folder not in {p.name for p in tmp_path.iterdir()}, "the killed service's folder is still there"
    assert {p.name for p in tmp_path.iterdir()} <= CACHES
