"""The engine process's side of a channel (backends/engine_process.py `_Engine`): streams driven by messages, with no
task per stream. A stream that opens while every slot is taken keeps the messages that come for it meanwhile and
replays them, in order, once it has a slot; one cancelled while it waits leaves nothing behind. Real backend (tiny
preset), real channel over a socket pair."""

from __future__ import annotations

import asyncio
import socket
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.engine_messages import (  # noqa: E402
    CancelStream,
    EndStream,
    OpenStream,
    StreamAudio,
    StreamFailed,
    StreamUpdate,
)
from services.asr.backends.engine_process import _Engine  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402
from voiceagent.serving.channel import Channel  # noqa: E402

SAMPLE_RATE = 16000


async def _updates_until_final(channel: Channel, stream_id: int, timeout_s: float = 60) -> list:
    """Every message for `stream_id` from the engine, up to and including its final update or its failure."""
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        messages = await asyncio.wait_for(channel.receive(), deadline - time.monotonic())
        for message in messages or []:
            if getattr(message, "stream_id", None) != stream_id:
                continue
            seen.append(message)
            if isinstance(message, StreamFailed) or message.update.is_final:
                return seen
    raise TimeoutError(f"no final update for stream {stream_id}")


def test_a_stream_that_waits_for_a_slot_replays_its_audio_in_order_and_a_cancelled_wait_leaves_nothing(tmp_path):
    async def scenario():
        config = AsrConfig(preset="tiny", max_streams=1, threads=1, record_encoder_dir=str(tmp_path))
        backend = load_in_process(config)
        await backend.start()
        engine_side, service_side = socket.socketpair()
        engine = _Engine(backend, await Channel.open(engine_side))
        service = await Channel.open(service_side)
        try:
            clip = np.random.default_rng(3).standard_normal(SAMPLE_RATE).astype(np.float32) * 0.1
            engine.dispatch(OpenStream(0, StreamSettings("holder", 160, interim_results=False)))
            engine.dispatch(StreamAudio(0, clip, time.perf_counter()))
            engine.dispatch(EndStream(0, time.perf_counter()))
            assert 0 in engine.streams

            # The only slot is taken: stream 1's messages wait with it, the same clip in three pieces.
            engine.dispatch(OpenStream(1, StreamSettings("waiter", 160, interim_results=False)))
            for piece in np.array_split(clip, 3):
                engine.dispatch(StreamAudio(1, piece, time.perf_counter()))
            engine.dispatch(EndStream(1, time.perf_counter()))
            assert 1 not in engine.streams and len(engine.waiting[1]) == 4

            # A third one gives up while it waits: nothing of it is left.
            engine.dispatch(OpenStream(2, StreamSettings("quitter", 160)))
            engine.dispatch(CancelStream(2))
            assert 2 not in engine.waiting and 2 not in engine.openings

            # The holder finishes and leaves; its slot goes to stream 1, which hears every piece, in order.
            held = (await _updates_until_final(service, 0))[-1]  # interim updates come too (the servicer drops them)
            final = (await _updates_until_final(service, 1))[-1]
            assert isinstance(final, StreamUpdate), final
            assert final.update.audio_processed_s == held.update.audio_processed_s == pytest.approx(1.0, abs=0.011)
            await asyncio.sleep(0.05)  # the finished stream leaves on the loop's next turn
            assert not engine.streams and not engine.waiting and not engine.openings
            assert backend.free_slots == [0]
        finally:
            await engine.stop()
            await backend.stop()
            await service.close()

    asyncio.run(scenario())
    # Both streams' encoder outputs, recorded as they were stepped: the same clip, the same frames.
    holder = np.load(tmp_path / "holder.nemo-cache-aware.streaming.npz")["encoded"]
    waiter = np.load(tmp_path / "waiter.nemo-cache-aware.streaming.npz")["encoded"]
    assert holder.shape[0] > 0
    np.testing.assert_array_equal(waiter, holder)
