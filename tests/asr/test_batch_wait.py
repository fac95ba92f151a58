"""The batch wait is counted from when a chunk was complete (engine/batching.py `_gather_ready`): a chunk that
already waited (for the step in flight, or because its audio came in long ago) is not held again, while a chunk
that has just completed still waits for others. Real backend (tiny preset), no server: the wait itself."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402

CHUNK_MS = 320
WAIT_FRACTION = 0.5  # 160 ms at 320 ms chunks


def _gather_after(complete_s_ago: float) -> tuple[float, int]:
    """Two streams; one has a whole first chunk that was complete `complete_s_ago` seconds ago, the other has no
    audio. How long `_gather_ready` took, and how many streams it returned."""

    async def scenario():
        config = AsrConfig(
            preset="tiny", max_streams=2, batch_wait_fraction=WAIT_FRACTION, join_window_ms=0, overlap_steps="off"
        )
        backend = load_in_process(config)
        streams = [backend.join(StreamSettings(f"s{i}", CHUNK_MS), lambda update: None) for i in range(2)]
        chunk = np.zeros(backend.chunk_mel(streams[0]) * 160 + 400, np.float32)
        backend.feed(streams[0], chunk, time.perf_counter() - complete_s_ago)
        started = time.perf_counter()
        gathered = await backend._gather_ready(CHUNK_MS)
        return time.perf_counter() - started, len(gathered)

    return asyncio.run(scenario())


def test_a_chunk_complete_for_longer_than_the_wait_steps_at_once():
    took, gathered = _gather_after(complete_s_ago=1.0)
    assert gathered == 1
    assert took < 0.05  # counted from the loop's look it would wait the whole 160 ms for the stream with no audio


def test_a_chunk_just_complete_waits_the_rest_of_its_share():
    took, gathered = _gather_after(complete_s_ago=0.1)
    assert gathered == 1
    # 160 ms from completion, 100 of them already gone: ~60 ms left (not 160: the wait is not restarted)
    assert 0.04 < took < 0.14
