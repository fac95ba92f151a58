"""Cache-aware streaming over a real server: equals offline, each frame once, batching changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.asr.client import (
    CHUNK_MS,
    PCM16,
    clip,
    config,
    encoder_frames_of,
    metric,
    recorded,
    stream,
    streams_together,
    stub,
)
from voiceagent.v1 import asr_pb2

BACKEND = "nemo-cache-aware"
TOLERANCE = 1e-4  # observed ~1e-6: float reordering only


@pytest.mark.parametrize("chunk_ms", CHUNK_MS)
def test_streaming_equals_offline(cache_aware, record_dir, chunk_ms):
    audio = clip(2.345, seed=chunk_ms)
    request_id = f"equal-{chunk_ms}"
    responses = stream(cache_aware, config(chunk_ms, request_id=request_id), audio)
    offline = stub(cache_aware).Recognize(
        asr_pb2.RecognizeRequest(config=config(chunk_ms, request_id=request_id), audio=audio.tobytes()), timeout=60
    )
    streamed, streamed_tokens = recorded(record_dir, request_id, BACKEND, "streaming")
    reference, reference_tokens = recorded(record_dir, request_id, BACKEND, "offline")
    assert streamed.shape == reference.shape == (encoder_frames_of(len(audio)), streamed.shape[1])
    np.testing.assert_allclose(streamed, reference, atol=TOLERANCE, rtol=0)
    assert streamed_tokens == reference_tokens
    assert responses[-1].is_final and responses[-1].transcript == offline.transcript


@pytest.mark.parametrize("chunk_ms", CHUNK_MS)
def test_each_frame_computed_once_and_chunks_match_context(cache_aware, chunk_ms):
    audio = clip(3.0, seed=1)
    label = str(chunk_ms)
    frames_before = metric(cache_aware, "voiceagent_asr_encoder_frames_total", chunk_ms=label)
    audio_before = metric(cache_aware, "voiceagent_asr_audio_processed_seconds_total", chunk_ms=label)
    responses = stream(cache_aware, config(chunk_ms, encoding=PCM16), audio)
    expected_frames = encoder_frames_of(len(audio))
    frames = metric(cache_aware, "voiceagent_asr_encoder_frames_total", chunk_ms=label) - frames_before
    assert frames == expected_frames == math.ceil(len(audio) / 16000 / 0.08) + 1
    assert sum(r.encoder_frames for r in responses) == expected_frames
    processed = metric(cache_aware, "voiceagent_asr_audio_processed_seconds_total", chunk_ms=label) - audio_before
    assert processed == pytest.approx(len(audio) // 160 / 100)

    partials = [r for r in responses if not r.is_final]
    right = chunk_ms // 80 - 1
    # The first step consumes 10 ms + right x 80 ms (causal subsampling emits frame 0 from one mel frame);
    # every later step consumes exactly chunk_ms of new audio and computes right + 1 frames.
    assert partials[0].audio_processed_s == pytest.approx((1 + 8 * right) / 100)
    steps = np.diff([r.audio_processed_s for r in partials])
    np.testing.assert_allclose(steps[:-1], chunk_ms / 1000, atol=1e-9)
    assert all(r.encoder_frames == right + 1 for r in partials[:-1])
    assert all(r.chunk_ms == chunk_ms for r in responses)
    assert [r.chunk_index for r in partials] == list(range(len(partials)))
    assert responses[-1].is_final and responses[-1].audio_processed_s == pytest.approx(len(audio) // 160 / 100)


def test_batching_does_not_change_results(cache_aware, record_dir):
    clips = [clip(1.6 + 0.37 * i, seed=10 + i) for i in range(4)]
    configs = [config(160, request_id=f"together-{index}") for index in range(len(clips))]
    together = streams_together(cache_aware, configs, clips)
    assert max(r.batch_size for responses in together for r in responses) >= 2, "streams were never batched"

    for index, audio in enumerate(clips):
        alone = stream(cache_aware, config(160, request_id=f"alone-{index}"), audio)
        assert max(r.batch_size for r in alone) == 1
        batched, batched_tokens = recorded(record_dir, f"together-{index}", BACKEND, "streaming")
        single, single_tokens = recorded(record_dir, f"alone-{index}", BACKEND, "streaming")
        assert batched.shape == single.shape
        np.testing.assert_allclose(batched, single, atol=TOLERANCE, rtol=0)
        assert batched_tokens == single_tokens
        assert together[index][-1].transcript == alone[-1].transcript


def test_streams_starting_together_step_together(cache_aware):
    """Streams that join within the join window wait for each other: their first steps (which cannot share an
    encoder call with running streams) are one call, so all of them stay in lock-step to the end."""
    from tests.asr.conftest import JOIN_WINDOW_MS

    clips = [clip(1.6, seed=20 + i) for i in range(4)]
    spacing_s = JOIN_WINDOW_MS / 1000 / 4  # stream i joins i x 25 ms after the first
    configs = [config(320, request_id=f"cohort-{index}") for index in range(len(clips))]
    results = streams_together(cache_aware, configs, clips, spacing_s)
    for responses in results:
        partials = [r for r in responses if not r.is_final]
        assert [r.batch_size for r in partials] == [len(clips)] * len(partials)
        assert [r.chunk_index for r in partials] == list(range(len(partials)))


def test_empty_stream_gets_empty_final(cache_aware):
    responses = stream(cache_aware, config(320, request_id="empty"), np.zeros(0, np.float32))
    assert len(responses) == 1
    (final,) = responses
    assert final.is_final and final.transcript == "" and final.audio_processed_s == 0
    assert final.request_id == "empty"


def test_metrics_and_info(cache_aware, tiny_checkpoint):
    stream(cache_aware, config(320), clip(1.0))
    assert metric(cache_aware, "voiceagent_asr_chunk_processing_seconds_count", chunk_ms="320") > 0
    assert metric(cache_aware, "voiceagent_asr_final_latency_seconds_count", chunk_ms="320") > 0
    assert metric(cache_aware, "voiceagent_asr_step_batch_streams_count", chunk_ms="320") > 0
    assert metric(cache_aware, "voiceagent_asr_model_flops_total") > 0
    assert metric(cache_aware, "voiceagent_asr_model_read_bytes_total") > 0
    assert metric(cache_aware, "voiceagent_asr_engine_steps_total") > 0
    assert metric(cache_aware, "voiceagent_asr_active_streams") == 0

    from voiceagent.v1 import common_pb2

    info = stub(cache_aware).GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert info.service == "asr" and info.model.backend == BACKEND
    assert info.model.source == tiny_checkpoint and info.model.preset == "checkpoint"
    shape = info.model.shape
    assert shape["layers"] == 2 and shape["hidden_size"] == 64 and shape["left_context_frames"] == 56
    assert shape["encoder_frame_ms"] == 80 and shape["vocab_size"] == 65
    assert info.limits["max_streams"] == 4
