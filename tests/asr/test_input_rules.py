"""Bad input gets INVALID_ARGUMENT naming the field; admission is bounded; vanished clients free slots."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

from tests.asr.client import FLOAT32, PCM16, clip, config, hold_stream, metric, requests, stub
from tests.harness import REPO
from voiceagent.v1 import asr_pb2

Audio = asr_pb2.StreamingRecognizeRequest


def _status(service, messages) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        list(stub(service).StreamingRecognize(iter(messages), timeout=30))
    return caught.value


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([Audio(audio=b"\0\0")], "config must come first"),
        ([], "config must come first"),
        ([Audio(config=config(100))], "config.chunk_ms"),
        ([Audio(config=config(320, encoding=0))], "config.encoding"),
        ([Audio(config=config(320, encoding=7))], "config.encoding"),
        ([Audio(config=config(320, sample_rate_hz=8000))], "config.sample_rate_hz"),
        ([Audio(config=config(320, encoding=PCM16)), Audio(audio=b"\0\0\0")], "2-byte AUDIO_ENCODING_PCM16"),
        ([Audio(config=config(320, encoding=FLOAT32)), Audio(audio=b"\0" * 6)], "4-byte AUDIO_ENCODING_FLOAT32"),
        ([Audio(config=config(320)), Audio(audio=np.array([np.nan], "<f4").tobytes())], "finite"),
        ([Audio(config=config(320)), Audio(config=config(320))], "only the first message may be a config"),
        ([Audio(config=config(320)), Audio()], "neither config nor audio"),
        ([Audio(config=config(320)), Audio(audio=np.array([0.5, -1200.0], "<f4").tobytes())], "PCM16 values"),
        ([Audio(config=config(320, request_id="x" * 129))], "config.request_id: 129 characters"),
        ([Audio(config=config(320, request_id="a\nb"))], "config.request_id: 'a\\nb' has characters that do not"),
        ([Audio(config=config(320, language_code="de-DE"))], "config.language_code: de-DE is not a language"),
        ([Audio(config=config(320, language_code="xx-" + "Z" * 600))], "is not a BCP-47 language tag"),
    ],
    ids=[
        "audio-first",
        "nothing",
        "chunk-ms",
        "unspecified-encoding",
        "unknown-encoding",
        "rate",
        "odd-pcm16",
        "short-float32",
        "nan",
        "second-config",
        "empty-message",
        "float32-out-of-range",
        "long-request-id",
        "control-in-request-id",
        "language-not-the-models",
        "language-not-a-tag",
    ],  # fmt: skip
)
def test_bad_stream_is_invalid_argument(cache_aware, messages, reason):
    error = _status(cache_aware, messages)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in error.details()


def test_a_language_of_the_model_is_accepted_in_any_region(cache_aware):
    for code in ("en", "en-US", "EN-gb"):
        request = asr_pb2.RecognizeRequest(config=config(320, language_code=code), audio=b"\0" * 6400)
        assert stub(cache_aware).Recognize(request, timeout=30).audio_s > 0


def test_bad_recognize_is_invalid_argument(cache_aware):
    for request, reason in [
        (asr_pb2.RecognizeRequest(config=config(90), audio=b""), "config.chunk_ms"),
        (asr_pb2.RecognizeRequest(config=config(320, encoding=PCM16), audio=b"\0"), "PCM16"),
        (asr_pb2.RecognizeRequest(config=config(320), audio=b""), "audio: is empty"),
        (asr_pb2.RecognizeRequest(config=config(320, request_id="x" * 129), audio=b"\0" * 4), "config.request_id"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            stub(cache_aware).Recognize(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in caught.value.details()


@pytest.mark.parametrize("where", ["first", "after-config"])
def test_a_stream_message_that_does_not_parse_is_invalid_argument(cache_aware, where):
    """Raw bytes that are not a StreamingRecognizeRequest (a length past the message's end), first or mid-stream."""
    good = Audio(config=config(320)).SerializeToString()
    messages = [b"\x0a\xff\xff\xff\xff\x0f"] if where == "first" else [good, b"\x0a\xff\xff\xff\xff\x0f"]
    with grpc.insecure_channel(cache_aware.address) as channel:
        call = channel.stream_stream("/voiceagent.v1.SpeechRecognizer/StreamingRecognize")
        with pytest.raises(grpc.RpcError) as caught:
            list(call(iter(messages), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert "request: not a valid message" in caught.value.details()


def _wait_active(service, expected: float, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(service, "voiceagent_asr_active_streams") != expected:
        assert time.monotonic() < deadline, f"active streams never reached {expected}"
        time.sleep(0.1)


def test_more_streams_than_configured_and_cancelled_clients_free_slots(cache_aware):
    held = [hold_stream(cache_aware.address, f"held-{i}") for i in range(4)]  # the server admits 4
    calls = [call for _channel, call in held]
    _wait_active(cache_aware, 4)
    error = _status(cache_aware, requests(config(320), clip(0.2)))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_streams" in error.details()

    calls[0].cancel()  # the client goes away: its slot is freed and a new stream is admitted
    _wait_active(cache_aware, 3)
    responses = list(stub(cache_aware).StreamingRecognize(requests(config(320), clip(0.5)), timeout=30))
    assert responses[-1].is_final
    for call in calls[1:]:
        call.cancel()
    _wait_active(cache_aware, 0)


def test_killed_client_process_frees_its_slot(cache_aware):
    client = subprocess.Popen(
        [sys.executable, "-m", "tests.asr.client", cache_aware.address], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert client.stdout.readline().strip() == "open"
        _wait_active(cache_aware, 1)
    finally:
        client.kill()
        client.wait()
    _wait_active(cache_aware, 0)
