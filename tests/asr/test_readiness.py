"""Readiness is kept as it changes (engine/batching.py `changed`): while a step waits for its batch to fill, an
audio message costs a look at its own stream, not at every stream (a scan of all of them per message bound the
event loop at ~1,000 paced streams on an H100). Real backend (tiny preset), no server: the wait itself."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402

STREAMS, FED_DURING_WAIT = 64, 10


def test_a_message_during_the_batch_wait_looks_at_its_own_stream_only():
    async def scenario():
        config = AsrConfig(preset="tiny", max_streams=STREAMS, batch_wait_fraction=1.0, join_window_ms=0)
        backend = load_in_process(config)
        streams = [backend.join(StreamSettings(f"s{i}", 320), lambda update: None) for i in range(STREAMS)]
        first_chunk = np.zeros(backend.chunk_mel(streams[0]) * 160 + 400, np.float32)
        backend.feed(streams[0], first_chunk, time.perf_counter())

        looks = []
        ready_check = backend._ready
        backend._ready = lambda stream: looks.append(stream) or ready_check(stream)

        async def feed_others():
            for stream in streams[1 : 1 + FED_DURING_WAIT]:
                await asyncio.sleep(0.005)
                backend.feed(stream, first_chunk, time.perf_counter())

        feeding = asyncio.create_task(feed_others())
        gathered = await backend._gather_ready(320)  # waits up to one chunk: the batch never fills
        await feeding
        return streams, gathered, looks

    streams, gathered, looks = asyncio.run(scenario())
    assert gathered == streams[: 1 + FED_DURING_WAIT]  # every stream fed during the wait joined the batch, in order
    # One look at every stream when the gathering began, one per message during the wait and one per stream taken
    # at the end; a look at every stream per message would be 64 x 10 more.
    assert len(looks) <= STREAMS + FED_DURING_WAIT + len(gathered)
