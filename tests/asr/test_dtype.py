"""`--dtype bfloat16`: the encoder, decoder and caches compute in bfloat16, end to end over a real server."""

from __future__ import annotations

import numpy as np

from tests.asr.client import clip, config, encoder_frames_of, recorded, stream, stub
from voiceagent.v1 import asr_pb2, common_pb2

BACKEND = "nemo-cache-aware"


def test_bfloat16_streams_like_offline(bfloat16, record_dir):
    audio = clip(2.345, seed=5)
    for chunk_ms in (80, 560):
        request_id = f"bf16-{chunk_ms}"
        responses = stream(bfloat16, config(chunk_ms, request_id=request_id), audio)
        assert responses[-1].is_final and len(responses) > 2
        stub(bfloat16).Recognize(
            asr_pb2.RecognizeRequest(config=config(chunk_ms, request_id=request_id), audio=audio.tobytes()), timeout=60
        )
        streamed, _tokens = recorded(record_dir, request_id, BACKEND, "streaming")
        reference, _tokens = recorded(record_dir, request_id, BACKEND, "offline")
        assert streamed.shape == reference.shape == (encoder_frames_of(len(audio)), 64)
        # bfloat16 keeps 8 bits of mantissa: the two paths round differently (observed: a few ulps at |x| ~ 3),
        # but a wrong cache or mask would differ by the size of the outputs themselves.
        scale = np.abs(reference).max()
        assert np.abs(streamed - reference).max() <= 0.05 * scale


def test_bfloat16_is_reported_and_counted(bfloat16):
    info = stub(bfloat16).GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert info.model.dtype == "bfloat16"
    assert info.model.weight_bytes == 2 * info.model.parameter_count
    shape = info.model.shape
    assert shape["cache_bytes_per_stream"] == shape["layers"] * shape["hidden_size"] * (56 + 9 - 1) * 2
