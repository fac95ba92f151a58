"""Text-in streaming, cancellation, the bounded queue and every bad input, over a real channel."""

from __future__ import annotations

import math
import threading
import time

import grpc
import pytest

from tests.harness import sample_sum, scrape_samples
from tests.tts.conftest import collect, synthesize
from voiceagent.v1 import tts_pb2

LONG_TEXT = "This request speaks for a long while so that it is still going when we act on it. " * 3
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def config_message(**config) -> tts_pb2.StreamingSynthesizeRequest:
    return tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig(**config))


def text_message(text: str, flush: bool = False) -> tts_pb2.StreamingSynthesizeRequest:
    return tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text=text, flush=flush))


def test_text_in_streaming_speaks_the_first_phrase_before_the_last_piece_is_sent(stub):
    pieces = ["Hello there, ", "my friend. ", "This is the first", " sentence. And here", " comes the rest", "."]
    first_audio = threading.Event()
    sent_last_at: list[float] = []

    def requests():
        yield config_message(seed=9)
        for piece in pieces[:-1]:
            yield text_message(piece)
        first_audio.wait(timeout=30)  # an LLM still thinking: the last piece waits for the first audio
        sent_last_at.append(time.perf_counter())
        yield text_message(pieces[-1])

    first_audio_at = None
    chunks = []
    for chunk in stub.StreamingSynthesize(requests()):
        if first_audio_at is None:
            first_audio_at = time.perf_counter()
            first_audio.set()
        chunks.append(chunk)
    assert first_audio_at < sent_last_at[0]
    # phrases: "Hello there," / "my friend." / "This is the first sentence." / "And here comes the rest."
    segments = [chunk.segment_index for chunk in chunks]
    assert segments == sorted(segments) and set(segments) == {0, 1, 2, 3}
    assert chunks[-1].is_last and [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert chunks[0].queue_s >= 0


def test_each_phrase_sounds_as_it_would_alone(stub):
    """Audio order follows text order: segment k of a stream is the synthesis of phrase k (seeded once)."""
    phrases = ["Hello there my friend.", "How are you today?"]
    chunks = list(
        stub.StreamingSynthesize(iter([config_message(seed=4), *map(text_message, [p + " " for p in phrases])]))
    )
    first_segment = collect(c for c in chunks if c.segment_index == 0 and c.audio).audio
    alone = synthesize(stub, phrases[0], seed=4).audio
    assert first_segment.shape == alone.shape and (first_segment == alone).all()
    assert any(c.segment_index == 1 and c.audio for c in chunks)


def test_flush_synthesises_text_without_a_phrase_boundary(stub):
    flushed = threading.Event()

    def requests():
        yield config_message()
        yield text_message("no punctuation at all", flush=True)
        flushed.wait(timeout=30)
        yield text_message(" and more")

    responses = stub.StreamingSynthesize(requests())
    first = next(responses)  # arrives although the stream is still open and no boundary was seen
    flushed.set()
    rest = list(responses)
    assert first.segment_index == 0 and {c.segment_index for c in rest} == {0, 1}


def test_cancelling_a_stream_frees_its_worker_at_once(tts, stub):
    call = stub.Synthesize(tts_pb2.SynthesizeRequest(text=LONG_TEXT))
    next(call)
    next(call)
    call.cancel()
    started = time.perf_counter()
    follower = synthesize(stub, "Next turn.", seed=1)
    # The only worker was early in ~100 patches (seconds of work); the follower waits about one patch step.
    assert follower.chunks[0].queue_s < 1.0
    assert follower.arrivals[0] < 2.0
    assert time.perf_counter() - started < 5
    assert sample_sum(scrape_samples(tts.metrics_url), "voiceagent_tts_busy_workers") == 0
    samples = scrape_samples(tts.metrics_url)
    assert sample_sum(samples, "voiceagent_tts_rpc_requests_total", method="Synthesize", code="CANCELLED") >= 1


def test_requests_past_the_queue_bound_are_refused(stub):
    holder = stub.Synthesize(tts_pb2.SynthesizeRequest(text=LONG_TEXT))
    next(holder)  # holds the only worker
    waited: list = []
    waiter = threading.Thread(target=lambda: waited.append(synthesize(stub, "I wait in line.")), daemon=True)
    waiter.start()
    time.sleep(0.5)  # the waiter takes the one queue slot
    try:
        with pytest.raises(grpc.RpcError) as refused:
            synthesize(stub, "One too many.")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_queue" in refused.value.details()
    finally:
        holder.cancel()
    waiter.join(30)
    assert waited and waited[0].chunks[0].queue_s > 0.4  # served once the holder let go, after waiting


@pytest.mark.parametrize(
    ("text", "config", "field"),
    [
        ("", {}, "text"),
        ("   ", {}, "text"),
        ("x" * 501, {}, "text"),
        ("Hi.", {"sample_rate_hz": 22050}, "config.sample_rate_hz"),
        ("Hi.", {"encoding": 7}, "config.encoding"),
        ("Hi.", {"inference_timesteps": 0}, "config.inference_timesteps"),
        ("Hi.", {"inference_timesteps": 51}, "config.inference_timesteps"),
        ("Hi.", {"cfg_value": -0.5}, "config.cfg_value"),
        ("Hi.", {"cfg_value": 10.5}, "config.cfg_value"),
        ("Hi.", {"cfg_value": math.nan}, "config.cfg_value"),
        ("Hi.", {"voice": "alice"}, "config.voice"),
    ],
)
def test_bad_synthesize_input_is_invalid_argument_naming_the_field(stub, text, config, field):
    with pytest.raises(grpc.RpcError) as error:
        synthesize(stub, text, **config)
    assert error.value.code() == INVALID
    assert error.value.details().startswith(field + ":"), error.value.details()


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"inference_timesteps": 51}, "config.inference_timesteps: must be in [1, 50], got 51"),
        ({"cfg_value": 10.5}, "config.cfg_value: must be in [0, 10], got 10.5"),
    ],
)
def test_an_out_of_range_setting_names_the_bounds_a_request_may_use(stub, config, says):
    with pytest.raises(grpc.RpcError) as error:
        synthesize(stub, "Hi.", **config)
    assert error.value.details() == says


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([text_message("Hello.")], "config"),
        ([], "config"),
        ([config_message()], "text"),
        ([config_message(), text_message("   ")], "text"),
        ([config_message(), text_message("Hello. "), config_message()], "config"),
        ([config_message(), text_message("x" * 300), text_message("y" * 201)], "text"),
        ([config_message(sample_rate_hz=8000), text_message("Hello.")], "config.sample_rate_hz"),
        ([config_message(inference_timesteps=100), text_message("Hello.")], "config.inference_timesteps"),
    ],
)
def test_bad_streaming_input_is_invalid_argument_naming_the_field(stub, messages, field):
    with pytest.raises(grpc.RpcError) as error:
        list(stub.StreamingSynthesize(iter(messages)))
    assert error.value.code() == INVALID
    assert error.value.details().startswith(field + ":"), error.value.details()
