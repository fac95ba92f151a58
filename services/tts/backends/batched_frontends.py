"""Several gRPC front-end processes on one batched TTS engine process (`--frontends N`): the TTS part of the shared
launcher voiceagent/serving/frontends.py (one port by SO_REUSEPORT, one health, one /metrics).

Why: every patch of every request leaves through a gRPC process: the engine's Patches message is split, each patch
formatted, wrapped in an AudioChunk and written to its stream. At C=256 that is ~2,000 chunks a second of 30 KB
through one asyncio process (on the 2-core VM ~0.25-0.3 ms of its CPU each, bench-tts's delivery table). With N
front ends each carries its share.

The supervisor starts the engine process once with one socket pair per front end; each front end's BatchedBackend
talks to it over its own socket exactly as a lone gRPC process does over its child's, and the engine steps every
front end's requests in the same batch (a request is known there by its channel and its id). The front ends admit
against one counter of `max_batch + max_queue` shared by the pod; the engine queues requests beyond its slots.
"""

from __future__ import annotations

import socket
from typing import Any

from services.tts.backends.batched import BatchedBackend, engine_spec
from services.tts.backends.batched_engine import engine_main
from services.tts.config import TtsConfig
from services.tts.servicer import TtsService
from voiceagent.serving.admission import Admission, shared_counter
from voiceagent.serving.frontends import SpawnedEngine, run_pod


class TtsEngineLauncher(SpawnedEngine):
    """The EngineLauncher of the TTS service: its batched engine process, started once in the supervisor."""

    def __init__(self, config: TtsConfig):
        super().__init__("tts")
        self.config = config

    def start(self, frontends: int) -> list[tuple[socket.socket, Any]]:
        spec = engine_spec(self.config)
        socks = self.spawn(engine_main, lambda theirs: (spec, theirs), frontends, daemon=True)
        pod = shared_counter()  # requests in the pod, whichever front end took them
        return [(ours, pod) for ours in socks]


def frontend_service(config: TtsConfig, handle: tuple[socket.socket, Any], index: int, count: int) -> TtsService:
    """A front end's service (voiceagent.serving.frontends calls it in the spawned process)."""
    sock, pod = handle
    return TtsService(
        config, BatchedBackend(config, attached=sock, pod=Admission(config.max_batch + config.max_queue, pod))
    )


def serve_frontends(config: TtsConfig) -> None:
    """Entry point of `python -m services.tts --frontends N` (N > 1)."""
    run_pod("tts", config, config.frontends, TtsEngineLauncher(config), frontend_service, config.resolved_dtype)
