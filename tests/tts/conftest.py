from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import numpy as np
import pytest
import torch

from services.tts.audio import decode_audio
from tests.harness import running_service, venv_python
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

# In-process reference models run like the service's workers: one torch thread (two only contend on 2 cores).
torch.set_num_threads(1)

# One worker (or one batch slot) and a one-request queue make admission, queueing and cancellation
# observable with few requests.
TTS_ARGS = ["--preset", "tiny", "--workers", "1", "--max-batch", "1", "--max-queue", "1", "--max-text-chars", "500"]
BACKENDS = ("batched", "pool")
TEXT = "Every request in the batch speaks its own words."
LONG_TEXT = "This request speaks for a long while so that it is still going when the others act. " * 2


@pytest.fixture(scope="session", params=BACKENDS)
def tts(request):
    """The TTS service on the tiny preset, SERVING, in its own process (tts environment), once per backend."""
    with running_service("services.tts", venv_python("tts"), [*TTS_ARGS, "--backend", request.param]) as service:
        yield service


@pytest.fixture(scope="session")
def stub(tts):
    with grpc.insecure_channel(tts.address) as channel:
        yield tts_pb2_grpc.SpeechSynthesizerStub(channel)


@dataclasses.dataclass
class Response:
    chunks: list[tts_pb2.AudioChunk]
    arrivals: list[float]  # seconds after the call started
    total_s: float

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(
            [decode_audio(c.audio, c.encoding == common_pb2.AUDIO_ENCODING_PCM16) for c in self.chunks]
        )


def collect(responses) -> Response:
    started = time.perf_counter()
    chunks, arrivals = [], []
    for chunk in responses:
        arrivals.append(time.perf_counter() - started)
        chunks.append(chunk)
    return Response(chunks, arrivals, time.perf_counter() - started)


def synthesize(stub, text: str, **config) -> Response:
    return collect(stub.Synthesize(tts_pb2.SynthesizeRequest(text=text, config=tts_pb2.SynthesisConfig(**config))))


def together(calls: list[tuple[object, str, dict]]) -> list:
    """Start every (stub, text, config) call at once, one thread each; each one's Response, or the RpcError it
    ended with."""
    responses: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(index: int, stub, text: str, config: dict) -> None:
        start.wait()
        try:
            responses[index] = synthesize(stub, text, **config)
        except grpc.RpcError as error:
            responses[index] = error

    threads = [threading.Thread(target=run, args=(i, *call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return responses
