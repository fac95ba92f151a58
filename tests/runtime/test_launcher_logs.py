"""The launcher leaves nothing behind: the temporary log it gives a child it did not name a log for is removed when
the launching process exits, unless VOICEAGENT_KEEP_LOGS=1 asks to keep it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO

LAUNCH = """
import sys
from voiceagent.serving.launcher import Process
child = Process("a child", [sys.executable, "-c", "print('spoken by the child')"])
child.proc.wait()
print(child.log)
assert "spoken by the child" in child.output()
"""


@pytest.mark.parametrize("keep", ["", "1"])
def test_a_temporary_log_is_gone_when_its_launcher_exits_unless_asked_to_keep_it(keep):
    env = {**os.environ, "VOICEAGENT_KEEP_LOGS": keep}
    done = subprocess.run([sys.executable, "-c", LAUNCH], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    log = Path(done.stdout.strip())
    assert log.name.startswith("a-child-") and log.suffix == ".log"
    assert log.exists() == bool(keep)
    log.unlink(missing_ok=True)
