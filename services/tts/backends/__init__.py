"""Engines behind the TTS backend contract, one module per engine; `load_backend` builds the configured one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.tts.backend import SpeechBackend
    from services.tts.config import TtsConfig


def load_backend(config: TtsConfig) -> SpeechBackend:
    """batched: one model, requests share each patch step (default); pool: one request per worker process."""
    if config.backend == "pool":
        from services.tts.backends.voxcpm import VoxCPMBackend

        return VoxCPMBackend(config)
    from services.tts.backends.batched import BatchedBackend

    return BatchedBackend(config)
