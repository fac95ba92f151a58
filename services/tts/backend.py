"""The engine-facing contract of the TTS service: one streaming method, and the types it speaks.

The servicer turns protos into a `SynthesisRequest` and `AudioPiece`s back into `AudioChunk`s; a backend
turns text segments into audio, patch by patch, in the requested format.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from voiceagent.serving.errors import EngineUnavailable, InvalidRequest
from voiceagent.serving.info import ModelFacts


class WorkerDiedError(EngineUnavailable):
    """The model process serving the request died: the caller gets UNAVAILABLE. The pool starts a new process
    in its place; the batched engine's service shuts down to be restarted (one model serves every request)."""


class UnfitTextError(InvalidRequest):
    """The model cannot hold a segment's text (services/tts/context.py): the caller gets INVALID_ARGUMENT.
    The engine's message already names the field ("text: ...")."""

    def __init__(self, message: str):
        ValueError.__init__(self, message)
        self.field = "text"


@dataclasses.dataclass(frozen=True)
class SynthesisRequest:
    request_id: str
    # Text segments (phrases) in speaking order. Each is synthesised as its own VoxCPM generation; the next one
    # may still be arriving while the first is spoken. An exception raised by the iterator ends the request.
    segments: AsyncIterator[str]
    sample_rate_hz: int
    pcm16: bool  # else float32
    inference_timesteps: int
    cfg_value: float
    seed: int


@dataclasses.dataclass(frozen=True)
class AudioPiece:
    """Audio in the requested format: one model patch, or (last) whatever the resampler still held."""

    audio: bytes
    samples: int  # at the requested rate
    segment_index: int
    patches: int  # model patches in this piece: 1, or 0 for the closing piece
    queue_s: float  # time the request waited for a worker (same on every piece)
    is_last: bool = False
    generation_s: float = 0.0  # on the last piece: wall time the worker spent generating this request


class SpeechBackend(Protocol):
    async def start(self) -> None:
        """Load the model instances and warm them up."""

    async def stop(self) -> None:
        """Stop the model instances."""

    def facts(self) -> ModelFacts: ...

    def limits(self) -> Mapping[str, float]: ...

    def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioPiece]:
        """Audio of `request.segments`, one piece per decoded patch as soon as it is decoded.

        Raises QueueFull (voiceagent/serving/errors.py) before the first piece when no worker can be waited
        for. Closing the iterator early (a cancelled RPC) stops generation and frees the worker.
        """
        ...
