"""The padded steady step (the CPU twin of the CUDA graphs): bucket choice, padding rows that never reach a
stream, slots mapped by index, and streaming that still equals offline, over a real server."""

from __future__ import annotations

import numpy as np
import pytest

from services.asr.engine.step_graphs import bucket_for, buckets_up_to
from tests.asr.client import CHUNK_MS, clip, config, equals_offline, metric, stream, streams_together, stub
from voiceagent.v1 import common_pb2


def test_buckets_are_powers_of_two_then_multiples_of_64_up_to_the_batch_limit():
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(5) == [1, 2, 4, 5]
    assert buckets_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets_up_to(200) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 200]
    assert buckets_up_to(1024) == [1, 2, 4, 8, 16, 32, *range(64, 1025, 64)]
    assert [bucket_for(n, [1, 2, 4, 5]) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, 5]
    with pytest.raises(ValueError, match="exceed"):
        bucket_for(6, [1, 2, 4, 5])


def _padded_rows(service, chunk_ms: int) -> tuple[float, float]:
    label = str(chunk_ms)
    return (
        metric(service, "voiceagent_asr_padded_step_rows_total", chunk_ms=label, kind="stream"),
        metric(service, "voiceagent_asr_padded_step_rows_total", chunk_ms=label, kind="padding"),
    )


@pytest.mark.parametrize("chunk_ms", CHUNK_MS)
def test_one_stream_on_padded_stepsequals_offline(padded, record_dir, chunk_ms):
    before = _padded_rows(padded, chunk_ms)
    audio = clip(2.345, seed=100 + chunk_ms)
    responses = stream(padded, config(chunk_ms, request_id=f"padded-one-{chunk_ms}"), audio)
    streams, padding = (a - b for a, b in zip(_padded_rows(padded, chunk_ms), before, strict=True))
    assert streams >= 1 and padding == 0  # steady steps of one stream ran in bucket 1
    equals_offline(padded, record_dir, f"padded-one-{chunk_ms}", chunk_ms, audio, responses[-1])


@pytest.mark.parametrize("chunk_ms", [80, 320])
def test_padding_rows_never_reach_a_stream(padded, record_dir, chunk_ms):
    """Three streams fill bucket 4 with one padding row; as the short ones end, the rest step on slots that
    are no longer consecutive (bucket 2 with slots like [0, 2], bucket 1). Every stream equals its own
    offline pass: no padding row and no other stream's slot leaks into its caches, decoder state or tokens."""
    before = _padded_rows(padded, chunk_ms)
    seconds = (1.2, 2.9, 2.0) if chunk_ms == 320 else (0.6, 1.5, 1.0)
    clips = [clip(s, seed=40 + index) for index, s in enumerate(seconds)]
    ids = [f"padded-{chunk_ms}-{index}" for index in range(len(clips))]
    results = streams_together(padded, [config(chunk_ms, request_id=i) for i in ids], clips)
    streams, padding = (a - b for a, b in zip(_padded_rows(padded, chunk_ms), before, strict=True))
    assert padding >= 1, "no step ran on a padded bucket"
    assert max(r.batch_size for r in results[1]) == 3
    for request_id, audio, responses in zip(ids, clips, results, strict=True):
        equals_offline(padded, record_dir, request_id, chunk_ms, audio, responses[-1])
        # what each step added and with how many streams (the GPU tests compare services step by step on these)
        steps = np.load(record_dir / f"{request_id}.nemo-cache-aware.streaming.npz")
        assert steps["step_frames"].sum() == len(steps["encoded"]) and steps["step_frames"].min() > 0
        assert steps["step_tokens"].sum() == len(steps["token_ids"])
        interim = [r.batch_size for r in responses if not r.is_final]
        assert steps["step_rows"].tolist()[: len(interim)] == interim and len(steps["step_rows"]) >= len(interim)


def test_padded_steps_reported(padded):
    info = stub(padded).GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert info.limits["padded_steps"] == 1
    assert info.limits["cuda_graphs"] == 0 and info.limits["cuda_graphs_captured"] == 0  # ignored on the CPU
