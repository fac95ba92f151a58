"""Text the model cannot hold is refused up front with INVALID_ARGUMENT naming the limit, not failed (INTERNAL)
or cut short inside the engine: a segment needs its text tokens + 1 + the patches it may speak in the K/V cache
(services/tts/context.py). The tiny preset's tokenizer is one token per character plus one, and synthetic
weights speak ceil(0.4 x characters) patches; so with 128 cache positions a 90-character text fits exactly
(91 + 1 + 36 = 128) and a 91-character one does not (92 + 1 + 37 = 130)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.harness import running_service, sample_sum, scrape_samples, venv_python
from tests.tts.conftest import collect, synthesize
from voiceagent.v1 import tts_pb2, tts_pb2_grpc

CACHE_POSITIONS = 128
FITS, TOO_LONG = "a" * 90, "a" * 91
# One slot and no queue: a request that waited for a slot would get RESOURCE_EXHAUSTED instead.
BATCHED = ["--preset", "tiny", "--backend", "batched", "--max-batch", "1", "--max-queue", "0"]
BATCHED += ["--cache-positions", str(CACHE_POSITIONS), "--probe-ceilings", "false"]
# The pool's workers hold the model's own max_length (1024 in the tiny preset): 731 characters need 1026.
POOL = ["--preset", "tiny", "--backend", "pool", "--workers", "1", "--max-text-chars", "2000"]
POOL += ["--probe-ceilings", "false"]


@pytest.fixture(scope="module")
def batched():
    with running_service("services.tts", venv_python("tts"), BATCHED) as service:
        yield service


@pytest.fixture(scope="module")
def stub(batched):
    with grpc.insecure_channel(batched.address) as channel:
        yield tts_pb2_grpc.SpeechSynthesizerStub(channel)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        collect(call)
    return error.value


def patches(service) -> float:
    return sample_sum(scrape_samples(service.metrics_url), "voiceagent_tts_patches_total")


def test_text_that_just_fits_is_spoken_whole_and_one_character_more_is_refused_naming_the_limit(stub, batched):
    before = patches(batched)
    assert synthesize(stub, FITS, seed=1).chunks[-1].is_last
    assert patches(batched) - before == 36  # ceil(0.4 x 90): not cut short by the cache
    error = refused(stub.Synthesize(tts_pb2.SynthesizeRequest(text=TOO_LONG)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"cache_positions {CACHE_POSITIONS}" in error.details() and "92 text tokens" in error.details()
    assert error.details().startswith("text: ")


def test_an_unfit_phrase_in_text_in_streaming_is_refused_naming_the_limit(stub):
    messages = [
        tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig()),
        tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text=TOO_LONG, flush=True)),
    ]
    error = refused(stub.StreamingSynthesize(iter(messages)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text (phrase 0)" in error.details() and f"cache_positions {CACHE_POSITIONS}" in error.details()


def test_unfit_text_is_refused_before_it_waits_for_a_slot(stub, batched):
    """The only slot is busy and nothing may queue: an unfit text still gets INVALID_ARGUMENT, at once."""
    release, done = threading.Event(), threading.Event()

    def holding():  # a text-in stream keeps its slot between phrases, until it ends
        yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig())
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text="Hold on.", flush=True))
        release.wait(60)

    holder = stub.StreamingSynthesize(holding())

    def drain():
        try:
            collect(holder)
        finally:
            done.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and sample_sum(scrape_samples(batched.metrics_url), "voiceagent_tts_busy_workers") < 1
    ):
        time.sleep(0.05)
    assert not done.is_set(), "the slot holder finished before the test acted: it proved nothing"
    started = time.perf_counter()
    error = refused(stub.Synthesize(tts_pb2.SynthesizeRequest(text=TOO_LONG)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert time.perf_counter() - started < 1.0
    assert not done.is_set(), "the slot was free when the unfit text came: it proved nothing"
    release.set()
    assert done.wait(30)


def test_the_pool_refuses_text_past_the_models_max_length():
    service = running_service("services.tts", venv_python("tts"), POOL)
    with service as pool, grpc.insecure_channel(pool.address) as channel:
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        error = refused(stub.Synthesize(tts_pb2.SynthesizeRequest(text="a" * 731)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the model's max_length 1024" in error.details()
        assert synthesize(stub, "a" * 20, seed=1).chunks[-1].is_last
