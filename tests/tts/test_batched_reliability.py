"""The batched engine (the default backend) under the issue's reliability tests: hostile text never delays a
small request, a client deadline frees the slot and stops the engine's work for it, and an engine process that
dies fails its streams with UNAVAILABLE and takes the service down non-zero (one model serves every request, so
the orchestrator restarts the service; the pool's replacement of a worker is tests/tts/test_reliability.py).

The engine-death test ends the module's service, so it runs last.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.harness import child_processes, running_service, sample_sum, scrape_samples, start_service, venv_python
from tests.tts.conftest import collect, synthesize
from tests.tts.test_reliability import (
    MAX_TEXT_CHARS,
    MAX_TEXT_MESSAGES,
    assert_hostile_text_does_not_delay,
    config_message,
    refused,
    text_message,
)
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

ARGS = ["--preset", "tiny", "--backend", "batched", "--max-batch", "4", "--max-queue", "4", "--probe-ceilings", "false"]
ARGS += ["--max-text-chars", str(MAX_TEXT_CHARS), "--max-text-messages", str(MAX_TEXT_MESSAGES)]
IDLE_S = 3.0
ARGS += ["--stream-idle-timeout-s", str(IDLE_S)]  # no other test here leaves a text-in stream quiet that long
LONG_TEXT = "This request speaks for a long while so that it is still going when we act on it. " * 3


@pytest.fixture(scope="module")
def tts():
    with running_service("services.tts", venv_python("tts"), ARGS) as service:
        yield service


@pytest.fixture(scope="module")
def stub(tts):
    with grpc.insecure_channel(tts.address) as channel:
        yield tts_pb2_grpc.SpeechSynthesizerStub(channel)


def gauge(tts, name: str) -> float:
    return sample_sum(scrape_samples(tts.metrics_url), name)


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_hostile_text_does_not_delay_a_small_request(stub, tts):
    assert_hostile_text_does_not_delay(stub, tts.address)


def test_a_deadline_frees_the_slot_and_stops_the_engine_for_it(stub, tts):
    before = gauge(tts, "voiceagent_tts_patches_total")
    with pytest.raises(grpc.RpcError) as error:
        # ~100 patches of the tiny preset: well past 0.4 s even where a step takes 4 ms (a 1 s deadline was not)
        request = tts_pb2.SynthesizeRequest(text=LONG_TEXT, config=tts_pb2.SynthesisConfig(seed=0))
        collect(stub.Synthesize(request, timeout=0.4))
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for(lambda: gauge(tts, "voiceagent_tts_busy_workers") == 0, 10), "the slot stayed taken"
    made = gauge(tts, "voiceagent_tts_patches_total") - before
    time.sleep(1.0)
    assert gauge(tts, "voiceagent_tts_patches_total") - before == made, "patches were still made for no one"
    assert made < 0.4 * len(LONG_TEXT), "the engine spoke the whole text for a client that was gone"
    assert synthesize(stub, "Free again.", seed=2).chunks[-1].is_last


def test_clients_that_stop_reading_do_not_hold_the_slots(stub, tts):
    """Every slot taken by a client that read one chunk and then stopped reading (without cancelling): once the
    engine has spoken their texts the slots are free, and a new request is served."""
    # ~500 characters each: more audio than gRPC's flow-control windows take in before the server's writes wait
    calls = [stub.Synthesize(tts_pb2.SynthesizeRequest(text="word " * 99), timeout=120) for _ in range(4)]
    try:
        for call in calls:
            next(call)
        assert wait_for(lambda: gauge(tts, "voiceagent_tts_busy_workers") == 0, 60), "stalled readers held slots"
        assert synthesize(stub, "Still served.", seed=3).chunks[-1].is_last
    finally:
        for call in calls:
            call.cancel()


def test_a_text_stream_found_invalid_while_queued_leaves_the_queue_at_once(stub, tts):
    """Every slot busy; a text-in stream whose text breaks a limit is refused while it waits for a slot (before,
    it kept its queue place, and then took a slot and a prefill, until a slot came free)."""
    calls = [stub.Synthesize(tts_pb2.SynthesizeRequest(text="word " * 99), timeout=120) for _ in range(4)]
    try:
        for call in calls:
            next(call)
        too_many = [config_message(), *[text_message("Hi. ")] * (MAX_TEXT_MESSAGES + 1)]
        error = refused(stub.StreamingSynthesize(iter(too_many), timeout=60))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_text_messages" in error.details()
        assert gauge(tts, "voiceagent_tts_busy_workers") == 4, "refused only once a slot came free"
        assert gauge(tts, "voiceagent_tts_queued_requests") == 0
    finally:
        for call in calls:
            call.cancel()


def test_a_quiet_text_stream_ends_out_of_range_and_frees_its_slot(stub, tts):
    """A text-in stream that sent one phrase and then neither text nor its end: once the engine has waited
    --stream-idle-timeout-s for more, the call ends OUT_OF_RANGE and the slot is free."""

    def quiet():
        yield tts_pb2.StreamingSynthesizeRequest(config=tts_pb2.SynthesisConfig(seed=4))
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextPiece(text="Hello there. ", flush=True))
        time.sleep(4 * IDLE_S)

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as ended:
        collect(stub.StreamingSynthesize(quiet(), timeout=60))
    assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE, ended.value
    assert "stream_idle_timeout_s" in ended.value.details()
    assert time.monotonic() - started < 3 * IDLE_S
    assert wait_for(lambda: gauge(tts, "voiceagent_tts_busy_workers") == 0, 10)


def test_a_stream_that_sends_nothing_ends_out_of_range(stub):
    """No config, no half-close: the call ends OUT_OF_RANGE after --stream-idle-timeout-s (it waited for the
    client's own deadline before, for ever without one)."""
    opened = threading.Event()

    def nothing():
        opened.wait(4 * IDLE_S)  # sends nothing until the call has ended (or long after the idle timeout)
        return
        yield

    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as ended:
        collect(stub.StreamingSynthesize(nothing(), timeout=60))
    opened.set()
    assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE, ended.value
    assert "stream_idle_timeout_s" in ended.value.details() and "SynthesisConfig" in ended.value.details()
    assert time.monotonic() - started < 3 * IDLE_S


def test_a_client_that_stops_reading_is_ended_and_its_audio_dropped(stub, tts):
    """Its slot is free once the text is spoken, but its audio waited in the service for as long as the client liked
    (and each such client freed its slot for the next). Now a client that takes no audio for
    --stream-idle-timeout-s is ended: the service's call is over while the client still reads nothing."""
    config = tts_pb2.SynthesisConfig(sample_rate_hz=48_000, encoding=common_pb2.AUDIO_ENCODING_FLOAT32, seed=5)
    # Without BDP probing the client's flow-control window stays at 64 KB, so the service's writes wait after a
    # chunk or two (with it the window grows to megabytes, more than this text's audio).
    with grpc.insecure_channel(tts.address, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = tts_pb2_grpc.SpeechSynthesizerStub(channel).Synthesize(
            tts_pb2.SynthesizeRequest(text="word " * 99, config=config), timeout=120
        )
        next(call)  # it started; then reads nothing
        started = time.monotonic()
        in_flight = lambda: sample_sum(  # noqa: E731
            scrape_samples(tts.metrics_url), "voiceagent_tts_rpc_in_flight", method="Synthesize"
        )
        assert wait_for(lambda: in_flight() == 0, 60), "the call stays open while its client reads nothing"
        assert time.monotonic() - started < 3 * IDLE_S
        with pytest.raises(grpc.RpcError) as ended:
            collect(call)
    assert ended.value.code() == grpc.StatusCode.OUT_OF_RANGE, ended.value
    assert "took no audio" in ended.value.details()


def test_calls_before_the_engine_has_loaded_are_unavailable():
    """The port opens while the model loads: every call then gets UNAVAILABLE saying so, never UNKNOWN."""
    service = start_service("services.tts", venv_python("tts"), ["--preset", "tiny", "--probe-ceilings", "true"])
    answered = []  # (code, details) of every call the server itself answered before it was ready
    try:
        with grpc.insecure_channel(service.address) as channel:
            stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
            calls = (
                lambda: stub.GetInfo(common_pb2.InfoRequest(), timeout=5),
                lambda: collect(stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi."), timeout=5)),
            )
            deadline, ready = time.monotonic() + 120, False
            while not ready and time.monotonic() < deadline:
                for call in calls:
                    try:
                        call()
                        ready = True
                    except grpc.RpcError as error:
                        if "failed to connect" not in (error.details() or ""):  # the port is not open yet
                            answered.append((error.code(), error.details()))
                time.sleep(0.05)
    finally:
        service.terminate()
    assert answered, "no call was answered before the engine was ready"
    assert all(code == grpc.StatusCode.UNAVAILABLE and "still loading" in details for code, details in answered)


def test_a_dead_engine_fails_open_streams_with_unavailable_and_the_service_exits_non_zero(stub, tts):
    """Runs last: it ends the module's service."""
    results: list = [None, None]

    def run(index: int) -> None:
        try:
            results[index] = synthesize(stub, LONG_TEXT, seed=index)
        except grpc.RpcError as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: gauge(tts, "voiceagent_tts_busy_workers") == 2)
    (engine,) = child_processes(tts.proc.pid, lambda command: b"spawn_main" in command)
    os.kill(engine, signal.SIGKILL)
    killed_at = time.monotonic()
    for thread in threads:
        thread.join(60)
    for result in results:
        assert isinstance(result, grpc.RpcError), "a stream finished although its engine died"
        assert result.code() == grpc.StatusCode.UNAVAILABLE and "TTS engine process exited" in result.details()
    seen_not_serving = False
    while tts.proc.poll() is None and time.monotonic() - killed_at < 20:
        with contextlib.suppress(grpc.RpcError):  # its port may be closing
            seen_not_serving |= tts.health() == health_pb2.HealthCheckResponse.NOT_SERVING
        time.sleep(0.05)
    assert tts.proc.poll() is not None, "the service kept running without its engine"
    assert tts.proc.returncode != 0, "exited 0: a restart policy of on-failure would not restart it"
    assert time.monotonic() - killed_at < 15
    assert seen_not_serving or "draining" in tts.output()
    assert "exiting with status 1" in tts.output()
