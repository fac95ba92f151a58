"""Continuous batching over a real channel: a request's audio does not depend on what shares its steps,
requests join and leave between steps, and the per-step metrics tell how many requests each step carried."""

from __future__ import annotations

import itertools
import statistics
import threading
import time

import grpc
import numpy as np
import pytest

from tests.harness import running_service, sample_sum, scrape_samples, venv_python
from tests.tts.conftest import LONG_TEXT, TEXT, collect, synthesize, together
from voiceagent.v1 import tts_pb2, tts_pb2_grpc

MAX_BATCH = 8
ARGS = ["--preset", "tiny", "--backend", "batched", "--max-batch", str(MAX_BATCH), "--max-queue", "2"]
PATCH_BYTES = 7680 * 4  # one 160 ms patch at 48 kHz, float32


@pytest.fixture(scope="module")
def batched():
    with running_service("services.tts", venv_python("tts"), ARGS) as service:
        yield service


@pytest.fixture(scope="module")
def stub(batched):
    with grpc.insecure_channel(batched.address) as channel:
        yield tts_pb2_grpc.SpeechSynthesizerStub(channel)


def test_a_seeded_request_sounds_the_same_alone_and_inside_a_batch_of_eight(stub):
    alone = synthesize(stub, TEXT, seed=42).audio
    others = [(f"Another voice number {i} with other words.", {"seed": i}) for i in range(MAX_BATCH - 1)]
    batch = together([(stub, TEXT, {"seed": 42}), *((stub, *other) for other in others)])
    assert alone.shape == batch[0].audio.shape
    np.testing.assert_allclose(batch[0].audio, alone, atol=1e-5)  # float rounding of batched matmuls only
    assert np.abs(alone).max() > 0.01
    assert not np.allclose(batch[1].audio[: len(alone)], alone[: len(batch[1].audio)])


def test_requests_with_other_diffusion_steps_and_guidance_share_steps_unchanged(stub):
    config = {"seed": 5, "inference_timesteps": 4, "cfg_value": 1.5}
    alone = synthesize(stub, TEXT, **config).audio
    batch = together(
        [(stub, TEXT, config), (stub, LONG_TEXT, {"seed": 6}), (stub, TEXT, {"seed": 7, "cfg_value": 3.0})]
    )
    np.testing.assert_allclose(batch[0].audio, alone, atol=1e-5)


def test_every_chunk_but_the_last_is_one_patch_inside_a_batch(stub):
    for response in together([(stub, TEXT, {"seed": i}) for i in range(4)]):
        *patches, last = response.chunks
        assert patches and all(len(chunk.audio) == PATCH_BYTES for chunk in patches)
        assert last.is_last and [c.chunk_index for c in response.chunks] == list(range(len(response.chunks)))


def _stream(stub, text: str, seed: int, log: list, started: threading.Event | None = None) -> None:
    """Collect a response's chunk arrival times into `log` as they come; set `started` at the second chunk."""
    call = stub.Synthesize(tts_pb2.SynthesizeRequest(text=text, config=tts_pb2.SynthesisConfig(seed=seed)))
    for chunk in call:
        log.append((time.perf_counter(), chunk))
        if started is not None and len(log) == 2:
            started.set()


def test_a_request_joining_a_running_batch_gets_audio_within_its_prefill_plus_about_one_step(batched, stub):
    logs = [[] for _ in range(4)]
    going = [threading.Event() for _ in logs]
    runners = [
        threading.Thread(target=_stream, args=(stub, LONG_TEXT, i, log, event))
        for i, (log, event) in enumerate(zip(logs, going, strict=True))
    ]
    for runner in runners:
        runner.start()
    for event in going:
        assert event.wait(30)
    before = scrape_samples(batched.metrics_url)
    joined_at = time.perf_counter()
    joiner = collect(stub.Synthesize(tts_pb2.SynthesizeRequest(text=TEXT)))
    after = scrape_samples(batched.metrics_url)
    for runner in runners:
        runner.join(60)
    # Counted in steps, which a loaded machine does not stretch: the joiner's text reached the engine during
    # a step (or between two), was prefilled at the next boundary and spoken in the step after it.
    joins = sample_sum(after, "voiceagent_tts_first_patch_steps_count") - sample_sum(
        before, "voiceagent_tts_first_patch_steps_count"
    )
    within_two = sample_sum(after, "voiceagent_tts_first_patch_steps_bucket", le="2.0") - sample_sum(
        before, "voiceagent_tts_first_patch_steps_bucket", le="2.0"
    )
    assert joins == 1 and within_two == 1
    prefill_s = sample_sum(after, "voiceagent_tts_prefill_seconds_sum") - sample_sum(
        before, "voiceagent_tts_prefill_seconds_sum"
    )
    steps = sample_sum(after, "voiceagent_tts_step_seconds_count") - sample_sum(
        before, "voiceagent_tts_step_seconds_count"
    )
    step_s = (
        sample_sum(after, "voiceagent_tts_step_seconds_sum") - sample_sum(before, "voiceagent_tts_step_seconds_sum")
    ) / steps
    assert prefill_s < step_s  # one short text: its prefill costs less than a step of five
    # in wall time, as the client sees it (gRPC and a shared 2-core machine included: a loose bound)
    assert joiner.arrivals[0] < 1.0
    # the running requests were not held up by the join: no gap around it is more than about two steps
    gaps = [b[0] - a[0] for log in logs for a, b in itertools.pairwise(log) if joined_at - 0.3 < b[0] < joined_at + 1]
    assert statistics.median(gaps) < 3 * step_s + 0.05, (gaps, step_s)


def test_cancelling_mid_batch_frees_the_slot_and_the_others_continue_unchanged(batched, stub):
    alone = {seed: synthesize(stub, TEXT, seed=seed).audio for seed in (11, 13)}
    logs: dict[int, list] = {seed: [] for seed in (11, 13)}
    threads = [threading.Thread(target=_stream, args=(stub, TEXT, seed, logs[seed])) for seed in (11, 13)]
    cancelled = stub.Synthesize(tts_pb2.SynthesizeRequest(text=LONG_TEXT, config=tts_pb2.SynthesisConfig(seed=12)))
    for thread in threads:
        thread.start()
    next(cancelled)
    next(cancelled)
    cancelled.cancel()
    for thread in threads:
        thread.join(60)
    for seed in (11, 13):
        audio = collect(chunk for _, chunk in logs[seed]).audio
        np.testing.assert_allclose(audio, alone[seed], atol=1e-5)
    deadline = time.perf_counter() + 5
    while sample_sum(scrape_samples(batched.metrics_url), "voiceagent_tts_busy_workers") != 0:
        assert time.perf_counter() < deadline, "the cancelled request still holds its slot"
        time.sleep(0.05)
    # every slot is free again: a full batch is admitted at once, nobody queues
    full = together([(stub, "Short.", {"seed": i}) for i in range(MAX_BATCH)])
    assert all(response.chunks[0].queue_s < 0.05 for response in full)


def test_the_step_batch_metric_equals_the_requests_in_flight(batched, stub):
    before = scrape_samples(batched.metrics_url)
    logs = [[] for _ in range(5)]
    going = [threading.Event() for _ in logs]
    runners = [
        threading.Thread(target=_stream, args=(stub, LONG_TEXT, i, log, event))
        for i, (log, event) in enumerate(zip(logs, going, strict=True))
    ]
    for runner in runners:
        runner.start()
    for event in going:
        assert event.wait(30)
    samples = scrape_samples(batched.metrics_url)
    in_flight = sample_sum(samples, "voiceagent_tts_rpc_in_flight", method="Synthesize")
    assert in_flight == 5
    assert sample_sum(samples, "voiceagent_tts_step_batch_requests") == in_flight
    assert sample_sum(samples, "voiceagent_tts_busy_workers") == in_flight
    for runner in runners:
        runner.join(60)
    after = scrape_samples(batched.metrics_url)

    def grew(name: str) -> float:
        return sample_sum(after, name) - sample_sum(before, name)

    assert grew("voiceagent_tts_engine_steps_total") == grew("voiceagent_tts_step_requests_count")
    # every patch came out of exactly one step, and no step ran more requests than were in flight
    assert grew("voiceagent_tts_step_requests_sum") == grew("voiceagent_tts_patches_total")
    assert grew("voiceagent_tts_step_requests_sum") / grew("voiceagent_tts_step_requests_count") <= 5


def test_past_max_batch_and_the_queue_requests_are_refused(stub):
    logs = [[] for _ in range(MAX_BATCH + 2)]
    runners = [threading.Thread(target=_stream, args=(stub, LONG_TEXT, i, log)) for i, log in enumerate(logs)]
    for runner in runners:
        runner.start()
    time.sleep(1.0)  # eight hold slots, two wait
    with pytest.raises(grpc.RpcError) as refused:
        synthesize(stub, "One too many.")
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_queue" in refused.value.details()
    for runner in runners:
        runner.join(120)
    assert all(log and log[-1][1].is_last for log in logs)
