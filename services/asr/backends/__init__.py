"""Recognizer backends, one module per way of driving NeMo; `load_backend` builds the configured one.

engine_process.py: the engine in a child process beside the gRPC server (the default), running what
in_process.py builds: the model wrapped in one of the in-process backends. nemo_cache_aware.py:
cache-aware streaming, in this process. nemo_buffered.py: the baseline that re-encodes a sliding window. The
shared engine they drive (streams, batching, slots, greedy decoding, features) is services/asr/engine/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.asr.backend import RecognizerBackend
    from services.asr.config import AsrConfig


def load_backend(config: AsrConfig) -> RecognizerBackend:
    """The configured backend, not started yet: the engine process (`engine_process`, the default) runs
    `load_in_process` in a child; otherwise this builds the model here (blocking: call it off the event loop)."""
    if config.engine_process:
        from services.asr.backends.engine_process import EngineProcess

        return EngineProcess(config)
    from services.asr.backends.in_process import load_in_process

    return load_in_process(config)
