"""A distributed sweep whose Locust workers never connect fails fast, names them, and leaves none behind.

Runs the sweep's runner in its own process (importing Locust monkey-patches the interpreter) with a worker
command that hangs instead of connecting.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.harness import REPO, venv_python

SCRIPT = """
import sys
from pathlib import Path
sys.executable = {hang!r}  # the runner starts its workers as `sys.executable -m loadgen worker ...`
from loadgen.sweep import RecordSink, SweepPlan, _Runner
from loadgen.workload import Workload
try:
    _Runner(SweepPlan("llm", [1], workers=2), Workload(), RecordSink(Path({sink!r})), connect_timeout_s=2)
except TimeoutError as exc:
    print(exc)
"""


def test_workers_that_never_connect_are_named_and_stopped(tmp_path):
    hang = tmp_path / "hanging-python"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    script = SCRIPT.format(hang=str(hang), sink=str(tmp_path / "requests.jsonl"))
    result = subprocess.run(
        [venv_python("dev"), "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    message = result.stdout.strip()
    assert message.startswith("0 of 2 Locust workers connected in 2 s"), message
    pids = [int(pid) for pid in re.findall(r"pid (\d+) running", message)]
    assert len(pids) == 2, message
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "a worker outlived the failed sweep"
