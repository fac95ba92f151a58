"""A process's own temp folder does not outlive it for long: one left by a process killed with SIGKILL (no clean-up
ran) is removed by the next process that makes a folder of the same kind; a folder whose process still runs stays."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.harness import REPO
from voiceagent.serving.tempdirs import private_folder

MAKE = """
import sys, time
from voiceagent.serving.tempdirs import private_folder
folder = private_folder(sys.argv[1])
(folder / "ipc").write_text("a socket would be here")
print(folder, flush=True)
time.sleep(120)
"""


def _owner(prefix: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", MAKE, prefix], cwd=REPO, stdout=subprocess.PIPE, text=True)
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_processs_folder_is_removed_by_the_next_one_and_a_live_ones_stays():
    prefix = f"va-test-{uuid.uuid4().hex[:8]}-"
    killed, left = _owner(prefix)
    alive, kept = _owner(prefix)
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        assert (left / "ipc").exists()  # nothing of its own removed it
        mine = private_folder(prefix)
        assert not left.exists()
        assert (kept / "ipc").exists()  # its process holds the lock
        assert mine.exists() and mine != kept
    finally:
        for proc in (killed, alive):
            proc.kill()
            proc.wait(10)
    private_folder(prefix)  # both owners gone now: both folders go
    assert not kept.exists()
    for folder in mine.parent.glob(f"{prefix}*"):  # this process's own
        shutil.rmtree(folder)
