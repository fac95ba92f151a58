"""The clocked step policy over a real server: real-time streams at different phases of the chunk period take
one batched step per period (the default policy steps them apart), and still give the offline transcript."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.asr.client import clip, config, metric, stub
from tests.harness import running_service, venv_python
from voiceagent.v1 import asr_pb2, common_pb2

CHUNK_MS = 320
STREAMS = 4
PHASE_S = 0.1  # stream i starts i x 100 ms after the first: four phases of the 320 ms period
SECONDS = 3.2


def _service(policy: str):
    args = ["--preset", "tiny", "--max-streams", "8", "--probe-ceilings", "false", "--threads", "1"]
    return running_service("services.asr", venv_python("asr"), [*args, "--step-policy", policy])


def _real_time(cfg, audio: np.ndarray):
    """The config, then one chunk of audio per chunk period, paced by the wall clock from the first message."""
    yield asr_pb2.StreamingRecognizeRequest(config=cfg)
    piece = 16 * CHUNK_MS
    started = time.monotonic()
    for index, start in enumerate(range(0, len(audio), piece)):
        time.sleep(max(0.0, started + index * CHUNK_MS / 1000 - time.monotonic()))
        yield asr_pb2.StreamingRecognizeRequest(audio=audio[start : start + piece].tobytes())


def _steps(service) -> float:
    return metric(service, "voiceagent_asr_step_duration_seconds_count", chunk_ms=str(CHUNK_MS))


def _stream_in_phases(service, clips) -> tuple[float, list[str]]:
    """The streams, real time, started PHASE_S apart; the steps they took and their final transcripts."""
    finals: list[str] = [""] * len(clips)
    before = _steps(service)

    def run(index):
        time.sleep(index * PHASE_S)
        cfg = config(CHUNK_MS, request_id=f"phase-{index}")
        for response in stub(service).StreamingRecognize(_real_time(cfg, clips[index]), timeout=60):
            if response.is_final:
                finals[index] = response.transcript

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(clips))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _steps(service) - before, finals


@pytest.fixture(scope="module")
def clips():
    return [clip(SECONDS, seed=200 + index) for index in range(STREAMS)]


def test_real_time_streams_in_different_phases_take_one_step_per_period(clips):
    with _service("clocked") as clocked:
        info = stub(clocked).GetInfo(common_pb2.InfoRequest(), timeout=10)
        assert info.limits["clocked_steps"] == 1
        clocked_steps, finals = _stream_in_phases(clocked, clips)
        offline = [
            stub(clocked).Recognize(asr_pb2.RecognizeRequest(config=config(CHUNK_MS), audio=a.tobytes()), timeout=60)
            for a in clips
        ]
    with _service("ready") as ready:
        ready_steps, _ = _stream_in_phases(ready, clips)
    periods = (SECONDS + (STREAMS - 1) * PHASE_S) / (CHUNK_MS / 1000)
    print(f"{periods:.1f} periods: clocked {clocked_steps:.0f} steps, ready {ready_steps:.0f} steps")
    assert finals == [result.transcript for result in offline]
    # One step per period; a stream's first step (no history yet) cannot share the others' call, so it adds one.
    assert clocked_steps <= periods + STREAMS
    assert ready_steps > clocked_steps, "the default policy stepped the phases together too"
