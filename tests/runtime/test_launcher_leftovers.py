"""The launcher leaves nothing behind: the temporary log it gives a child it did not name a log for is removed when
the launching process exits, unless VOICEAGENT_KEEP_LOGS=1 asks to keep it; a child's own temp folder
(`private_tmp`, where `vllm serve` puts its IPC sockets) is removed once the child stopped, or at exit. What a
SIGKILLed launcher left is removed by the next launcher's first temporary log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO
from voiceagent.serving.launcher import Process
from voiceagent.serving.tempdirs import shared_temp

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


HOLD = LAUNCH + "print('launched', flush=True)\nimport time\ntime.sleep(60)\n"


def test_the_logs_of_a_sigkilled_launcher_are_removed_by_the_next_one(short_tmp):
    tmp_path = short_tmp
    env = {**os.environ, "VOICEAGENT_KEEP_LOGS": "", "TMPDIR": str(tmp_path)}
    holding = subprocess.Popen([sys.executable, "-c", HOLD], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    lines = [holding.stdout.readline() for _ in range(3)]
    assert lines[-1].strip() == "launched", lines
    log = Path(lines[0].strip())
    os.kill(holding.pid, signal.SIGKILL)
    holding.wait()
    holding.stdout.close()
    assert log.parent.parent == tmp_path, log
    assert log.exists(), "a SIGKILLed launcher runs no exit handler: its log should still be there"
    done = subprocess.run([sys.executable, "-c", LAUNCH], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not log.parent.exists(), f"the killed launcher's logs are still there: {sorted(tmp_path.rglob('*'))}"
    assert not list(tmp_path.iterdir()), f"left: {sorted(tmp_path.rglob('*'))}"


def test_a_childs_own_folder_is_its_temp_folder_and_torchs_compile_cache_stays_shared():
    report = "import os, tempfile; print(tempfile.gettempdir()); print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    child = Process("a child", [sys.executable, "-c", report], private_tmp="CHILD_TMP")
    try:
        child.proc.wait(timeout=30)
        temp, inductor = child.output().split()
        assert Path(temp) == child.private  # what it leaves in its temp folder goes with the folder
        assert Path(inductor).parent == Path(shared_temp()) and Path(inductor).name.startswith("torchinductor_")
    finally:
        child.stop(timeout_s=5)
    assert not child.private.exists()
