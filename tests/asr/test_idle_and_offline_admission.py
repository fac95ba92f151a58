"""What a client cannot hold for ever: a stream that goes quiet ends OUT_OF_RANGE and gives its slot back, and
Recognize calls past `--max-offline-requests` get RESOURCE_EXHAUSTED (each waiting call keeps its clip in memory).
A real server of the tiny preset with a 2 s idle timeout and room for one Recognize call."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.asr.client import clip, config, metric, requests
from tests.harness import running_service, venv_python
from voiceagent.v1 import asr_pb2, asr_pb2_grpc

IDLE_S = 2.0


@pytest.fixture(scope="module")
def strict():
    args = ["--preset", "tiny", "--probe-ceilings", "false", "--threads", "1", "--max-streams", "2"]
    args += ["--stream-idle-timeout-s", str(IDLE_S), "--max-offline-requests", "1", "--offline-pass-s", "0"]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


def _quiet_after(messages: list, quiet_s: float):
    yield from messages
    time.sleep(quiet_s)


@pytest.mark.parametrize("sent", ["config-and-audio", "nothing"])
def test_a_quiet_stream_ends_out_of_range_and_frees_its_slot(strict, sent):
    messages = list(requests(config(320), clip(0.5))) if sent == "config-and-audio" else []
    started = time.monotonic()
    with grpc.insecure_channel(strict.address) as channel:
        call = asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(_quiet_after(messages, 3 * IDLE_S))
        with pytest.raises(grpc.RpcError) as ended:
            list(call)
    took = time.monotonic() - started
    assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE, ended.value
    assert "stream_idle_timeout_s" in ended.value.details()
    assert IDLE_S <= took < 3 * IDLE_S, took
    deadline = time.monotonic() + 10
    while metric(strict, "voiceagent_asr_active_streams") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(strict, "voiceagent_asr_active_streams") == 0


def test_a_stream_sending_in_real_time_is_not_idle(strict):
    """Pieces IDLE_S / 2 apart, for longer than IDLE_S in all: served to its final hypothesis."""
    pieces = list(requests(config(320), clip(1.0), piece_samples=4000))

    def paced():
        for piece in pieces:
            yield piece
            time.sleep(IDLE_S / 2)

    with grpc.insecure_channel(strict.address) as channel:
        responses = list(asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(paced(), timeout=60))
    assert responses[-1].is_final


def test_recognize_calls_past_the_limit_are_resource_exhausted(strict):
    long_clip = (clip(60.0) * 32767).astype("<i2").tobytes()
    request = asr_pb2.RecognizeRequest(config=config(320, encoding=1), audio=long_clip)  # PCM16
    with grpc.insecure_channel(strict.address) as channel:
        stub = asr_pb2_grpc.SpeechRecognizerStub(channel)
        first = stub.Recognize.future(request, timeout=120)
        time.sleep(0.5)  # the first is in (stepped chunk by chunk: seconds for 60 s of audio)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Recognize(asr_pb2.RecognizeRequest(config=config(320, encoding=1), audio=b"\0\0" * 1600), timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        assert "max_offline_requests" in refused.value.details()
        assert first.result().audio_s == pytest.approx(60.0)
        again = stub.Recognize(asr_pb2.RecognizeRequest(config=config(320, encoding=1), audio=b"\0\0" * 1600))
        assert again.audio_s == pytest.approx(0.1)
