"""Overlapped steps (--overlap-steps): a chunk size's next step is launched before the last one is read back.
Over a real server on the CPU with the overlap forced on: steps did overlap, and every stream still equals its own
offline pass, its partials in order, one chunk each."""

from __future__ import annotations

import numpy as np
import pytest

from tests.asr.client import clip, config, equals_offline, metric, streams_together, stub
from voiceagent.v1 import common_pb2


@pytest.mark.parametrize("chunk_ms", [80, 320])
def test_overlapped_steps_give_each_stream_its_offline_result_in_order(overlapped, record_dir, chunk_ms):
    label = str(chunk_ms)
    before = metric(overlapped, "voiceagent_asr_overlapped_steps_total", chunk_ms=label)
    seconds = (2.1, 1.3, 2.6, 1.9) if chunk_ms == 320 else (1.1, 0.7, 1.4, 0.9)
    clips = [clip(s, seed=70 + index) for index, s in enumerate(seconds)]
    policy = stub(overlapped).GetInfo(common_pb2.InfoRequest(), timeout=10).limits["clocked_steps"]
    ids = [f"overlap-{policy:.0f}-{chunk_ms}-{index}" for index in range(len(clips))]
    results = streams_together(overlapped, [config(chunk_ms, request_id=i) for i in ids], clips)
    assert metric(overlapped, "voiceagent_asr_overlapped_steps_total", chunk_ms=label) > before, "no step overlapped"
    assert max(r.batch_size for responses in results for r in responses) == 2
    for request_id, audio, responses in zip(ids, clips, results, strict=True):
        partials = [r for r in responses if not r.is_final]
        assert [r.chunk_index for r in partials] == list(range(len(partials)))
        steps = np.diff([r.audio_processed_s for r in partials])
        np.testing.assert_allclose(steps[:-1], chunk_ms / 1000, atol=1e-9)
        equals_offline(overlapped, record_dir, request_id, chunk_ms, audio, responses[-1])


def test_overlap_is_reported_and_off_by_default_on_the_cpu(overlapped, cache_aware):
    assert stub(overlapped).GetInfo(common_pb2.InfoRequest(), timeout=10).limits["overlap_steps"] == 1
    assert stub(cache_aware).GetInfo(common_pb2.InfoRequest(), timeout=10).limits["overlap_steps"] == 0
