"""What the ASR gRPC process and its engine process say to each other over the shared channel
(voiceagent/serving/channel.py): one dataclass per message, `stream_id`/`request_id` naming the call."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from services.asr.backend import OfflineResult, RecognitionUpdate, StreamSettings
from voiceagent.serving.info import ModelFacts


# -- gRPC process → engine ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpenStream:
    stream_id: int
    settings: StreamSettings


@dataclasses.dataclass(frozen=True)
class StreamAudio:
    """A piece of a stream's audio, stamped with when the gRPC process received it."""

    stream_id: int
    piece: np.ndarray
    arrived_at: float


@dataclasses.dataclass(frozen=True)
class EndStream:
    stream_id: int
    ended_at: float


@dataclasses.dataclass(frozen=True)
class CancelStream:
    """The client left (or its audio was bad): free the stream's slot."""

    stream_id: int


@dataclasses.dataclass(frozen=True)
class Transcribe:
    request_id: int
    settings: StreamSettings
    audio: np.ndarray


@dataclasses.dataclass(frozen=True)
class CancelTranscribe:
    request_id: int


@dataclasses.dataclass(frozen=True)
class StopEngine:
    pass


# -- engine → gRPC process ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EngineReady:
    name: str
    chunk_ms_choices: tuple[int, ...]
    facts: ModelFacts
    limits: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class StartFailed:
    message: str


@dataclasses.dataclass(frozen=True)
class StreamUpdate:
    stream_id: int
    update: RecognitionUpdate


@dataclasses.dataclass(frozen=True)
class StreamFailed:
    stream_id: int
    message: str


@dataclasses.dataclass(frozen=True)
class Transcribed:
    request_id: int
    result: OfflineResult | str  # a string: why it failed


@dataclasses.dataclass(frozen=True)
class MetricCall:
    """`metric.labels(*labels).method(*args)` made in the engine process, applied to the gRPC process's registry."""

    metric: str
    labels: tuple
    method: str
    args: tuple
