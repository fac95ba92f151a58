"""The buffered baseline behind the same RPCs: it streams, and recomputes its window's frames every step."""

from __future__ import annotations

import math

import pytest

from tests.asr.client import clip, config, encoder_frames_of, metric, recorded, stream, stub
from tests.asr.conftest import BUFFERED_WINDOW_MS
from voiceagent.v1 import common_pb2


@pytest.mark.parametrize("chunk_ms", [80, 320, 1120])
def test_buffered_recomputes_its_window(buffered, record_dir, chunk_ms):
    audio = clip(2.0, seed=3)
    request_id = f"buffered-{chunk_ms}"
    before = metric(buffered, "voiceagent_asr_encoder_frames_total", chunk_ms=str(chunk_ms))
    responses = stream(buffered, config(chunk_ms, request_id=request_id), audio)
    frames = metric(buffered, "voiceagent_asr_encoder_frames_total", chunk_ms=str(chunk_ms)) - before

    chunk_frames = chunk_ms // 80
    window_frames = math.ceil(BUFFERED_WINDOW_MS / 80 / chunk_frames) * chunk_frames
    steps = math.ceil(len(audio) // 160 / (8 * chunk_frames))
    # The last step's hypothesis is the final one when the audio had already ended.
    assert responses[-1].is_final and responses[-1].chunk_index == steps - 1
    assert frames == steps * window_frames  # overlap: window_frames - chunk_frames recomputed per step
    assert frames > encoder_frames_of(len(audio))
    emitted, _tokens = recorded(record_dir, request_id, "nemo-buffered", "streaming")
    assert emitted.shape[0] == math.ceil(len(audio) // 160 / 8)  # each step hands only its new frames on


def test_buffered_info(buffered):
    info = stub(buffered).GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert info.model.backend == "nemo-buffered" and info.model.preset == "tiny" and info.model.synthetic_weights
    assert info.limits["buffered_window_ms"] == BUFFERED_WINDOW_MS
