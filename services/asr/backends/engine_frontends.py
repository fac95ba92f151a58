"""Several gRPC front-end processes on one ASR engine process (`--frontends N`): the ASR part of the shared
launcher voiceagent/serving/frontends.py (one port by SO_REUSEPORT, one health, one /metrics).

The supervisor starts the engine process once with one socket pair per front end; each front end's service talks
to it over its own socket exactly as a lone gRPC process does over its child's (backends/engine_process.py), and
the engine process serves every socket's streams from the same batching loops, so streams that arrived through
different front ends still step together. Metric calls of the engine go to front end 0 (the supervisor merges
the front ends' registries). Each front end admits its share of `--max-streams`, so together they never admit
more streams than the engine has cache slots.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import socket

from services.asr.backends.engine_process import EngineProcess, _engine_main
from services.asr.config import AsrConfig
from services.asr.servicer import AsrService
from voiceagent.serving.frontends import supervise
from voiceagent.serving.lifeline import start_process

log = logging.getLogger(__name__)


class AsrEngineLauncher:
    """The EngineLauncher of the ASR service: its engine process, started once in the supervisor."""

    def __init__(self, config: AsrConfig):
        self.config = config
        self.process: multiprocessing.Process | None = None

    def start(self, frontends: int) -> list[socket.socket]:
        pairs = [socket.socketpair() for _ in range(frontends)]
        self.process = start_process(
            _engine_main, (self.config, [theirs for _ours, theirs in pairs]), name="asr-engine"
        )
        for _ours, theirs in pairs:
            theirs.close()
        log.info("ASR engine process %d started for %d front ends", self.process.pid, frontends)
        return [ours for ours, _theirs in pairs]

    def failure(self) -> str:
        if self.process is None or self.process.exitcode is None:
            return ""
        return f"the ASR engine process exited (code {self.process.exitcode})"

    def stop(self) -> None:
        if self.process is not None:
            self.process.join(30)  # each front end's service sent StopEngine while stopping
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


def share(total: int, index: int, count: int) -> int:
    """Front end `index`'s share of `total` stream slots."""
    return total // count + (index < total % count)


def frontend_service(config: AsrConfig, sock: socket.socket, index: int, count: int) -> AsrService:
    """A front end's service (voiceagent.serving.frontends calls it in the spawned process)."""
    admitted = dataclasses.replace(config, max_streams=share(config.max_streams, index, count))
    return AsrService(admitted, EngineProcess(config, attached=sock))


def serve_frontends(config: AsrConfig) -> None:
    """Entry point of `python -m services.asr --frontends N` (N > 1)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(supervise("asr", config, config.frontends, AsrEngineLauncher(config), frontend_service, config.dtype))
