"""What a recognizer backend is: one streaming method, and the internal types the servicer translates to.

Two backends implement it: cache-aware streaming (backends/nemo_cache_aware.py) and the buffered
baseline that re-encodes a sliding window (backends/nemo_buffered.py). The servicer never sees NeMo.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import numpy as np

from voiceagent.serving.errors import EngineFailure, ServiceError
from voiceagent.serving.info import ModelFacts


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    request_id: str
    chunk_ms: int  # (right context + 1) x 80 ms
    interim_results: bool = True  # for the client: backends yield every update, the servicer drops interim ones


@dataclasses.dataclass(frozen=True)
class RecognitionUpdate:
    """A hypothesis for one stream: partial after each encoder step, or final after the audio ended."""

    transcript: str
    token_ids: tuple[int, ...]
    is_final: bool
    audio_processed_s: float
    processing_latency_s: float
    chunk_index: int
    encoder_frames: int  # frames this update's step computed for this stream
    batch_size: int  # streams stepped together in that step


@dataclasses.dataclass(frozen=True)
class OfflineResult:
    transcript: str
    token_ids: tuple[int, ...]
    audio_s: float
    processing_s: float


class RecognizerBackend(Protocol):
    name: str  # "nemo-cache-aware" or "nemo-buffered"
    chunk_ms_choices: tuple[int, ...]

    async def start(self) -> None:
        """Load and warm up the model (every chunk size once)."""

    async def stop(self) -> None: ...

    def facts(self) -> ModelFacts: ...

    def limits(self) -> Mapping[str, float]: ...

    def recognize(self, settings: StreamSettings, audio: AsyncIterator[np.ndarray]) -> AsyncIterator[RecognitionUpdate]:
        """Stream hypotheses for 16 kHz float32 audio arriving in pieces of any length, one per step (the
        servicer learns from each how much audio is processed, and holds a client that sends faster back); the
        last is final.

        Raises InvalidRequest if `audio` does, EngineUnavailable if the engine is gone (voiceagent/serving/
        errors.py). Cancelling the iteration frees the stream's resources."""

    async def transcribe(self, settings: StreamSettings, audio: np.ndarray) -> OfflineResult:
        """One offline pass over a whole clip with the attention context of `settings.chunk_ms`."""


def step_failure(error: BaseException) -> ServiceError:
    """What a stream or Recognize whose step failed ends with: INTERNAL naming the engine's error (not UNKNOWN)."""
    if isinstance(error, ServiceError):
        return error
    return EngineFailure("INTERNAL", f"ASR engine: {type(error).__name__}: {error}")
