"""Several gRPC front-end processes on one ASR engine process (`--frontends N`): the ASR part of the shared
launcher voiceagent/serving/frontends.py (one port by SO_REUSEPORT, one health, one /metrics).

The supervisor starts the engine process once with one socket pair per front end; each front end's service talks
to it over its own socket exactly as a lone gRPC process does over its child's (backends/engine_process.py), and
the engine process serves every socket's streams from the same batching loops, so streams that arrived through
different front ends still step together. Metric calls of the engine go to front end 0 (the supervisor merges
the front ends' registries). The front ends admit streams against one counter of `--max-streams` shared by the pod
(voiceagent/serving/admission.py), so together they never admit more streams than the engine has cache slots, and
none refuses while the pod has room; Recognize calls count against `--max-offline-requests` the same way.
"""

from __future__ import annotations

import socket
from typing import Any

from services.asr.backends.engine_process import EngineProcess, _engine_main
from services.asr.config import AsrConfig
from services.asr.servicer import AsrService
from voiceagent.serving.admission import Admission, shared_counter
from voiceagent.serving.frontends import SpawnedEngine, run_pod


class AsrEngineLauncher(SpawnedEngine):
    """The EngineLauncher of the ASR service: its engine process, started once in the supervisor."""

    def __init__(self, config: AsrConfig):
        super().__init__("asr")
        self.config = config

    def start(self, frontends: int) -> list[tuple[socket.socket, Any]]:
        socks = self.spawn(_engine_main, lambda theirs: (self.config, theirs), frontends)
        streams, offline = shared_counter(), shared_counter()  # in the pod, whichever front end took them
        return [(ours, streams, offline) for ours in socks]


def frontend_service(config: AsrConfig, handle: tuple[socket.socket, Any], index: int, count: int) -> AsrService:
    """A front end's service (voiceagent.serving.frontends calls it in the spawned process)."""
    sock, streams, offline = handle
    return AsrService(
        config,
        EngineProcess(config, attached=sock),
        Admission(config.max_streams, streams),
        Admission(config.max_offline_requests, offline),
    )


def serve_frontends(config: AsrConfig) -> None:
    """Entry point of `python -m services.asr --frontends N` (N > 1)."""
    run_pod("asr", config, config.frontends, AsrEngineLauncher(config), frontend_service, config.dtype)
