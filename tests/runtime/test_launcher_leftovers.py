"""The launcher leaves nothing behind: the temporary log it gives a child it did not name a log for is removed when
the launching process exits, unless VOICEAGENT_KEEP_LOGS=1 asks to keep it; a child's own temp folder
(`private_tmp`, where `vllm serve` puts its IPC sockets) is removed once the child stopped, or at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO
from voiceagent.serving.launcher import Process

LAUNCH = """
import sys
from voiceagent.serving.launcher import Process
child = Process("a child", [sys.executable, "-c", "print('spoken by the child')"], private_tmp="CHILD_TMP")
child.proc.wait()
print(child.log)
print(child.private)
assert "spoken by the child" in child.output()
"""
# binds a Unix socket in its own folder, as vLLM's IPC does, and stays up until stopped
BIND = (
    "import os, socket, time; s = socket.socket(socket.AF_UNIX); "
    "s.bind(os.path.join(os.environ['CHILD_TMP'], 'ipc')); print('bound', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("keep", ["", "1"])
def test_a_temporary_log_is_gone_when_its_launcher_exits_unless_asked_to_keep_it(keep):
    env = {**os.environ, "VOICEAGENT_KEEP_LOGS": keep}
    done = subprocess.run([sys.executable, "-c", LAUNCH], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    log, private = (Path(line) for line in done.stdout.split())
    assert log.name.startswith("a-child-") and log.suffix == ".log"
    assert log.exists() == bool(keep)
    assert not private.exists()  # never stopped: removed when the launcher exited
    log.unlink(missing_ok=True)


def test_a_childs_own_temp_folder_is_gone_once_it_is_stopped():
    child = Process("a child", [sys.executable, "-c", BIND], private_tmp="CHILD_TMP")
    try:
        for _ in range(100):
            if "bound" in child.output():
                break
            time.sleep(0.1)
        assert (child.private / "ipc").is_socket()
    finally:
        child.stop(timeout_s=5)
    assert not child.private.exists()
