"""The channel between a gRPC process and its engine process: every message arrives once, in order, also
when a worker thread sends; the receiver sees None once the other end is closed."""

from __future__ import annotations

import asyncio
import socket
import threading

from voiceagent.serving.channel import Channel


async def _pair() -> tuple[Channel, Channel]:
    left, right = socket.socketpair()
    return await Channel.open(left), await Channel.open(right)


async def _receive_all(channel: Channel, count: int) -> list[tuple]:
    received: list[tuple] = []
    while len(received) < count:
        frame = await channel.receive()
        assert frame is not None, f"channel closed after {len(received)} of {count} messages"
        received += frame
    return received


def test_messages_from_the_loop_and_from_a_worker_thread_all_arrive_in_order():
    async def scenario():
        sender, receiver = await _pair()
        per_sender = 20000

        def worker():
            for index in range(per_sender):
                sender.send(("worker", index))

        thread = threading.Thread(target=worker)
        thread.start()
        for index in range(per_sender):
            sender.send(("loop", index))
            if index % 100 == 0:
                await asyncio.sleep(0)  # let flushes run while the worker is sending
        received = await _receive_all(receiver, 2 * per_sender)
        thread.join()
        await sender.close()
        assert await receiver.receive() is None
        await receiver.close()
        return received

    received = asyncio.run(scenario())
    for name in ("loop", "worker"):
        assert [index for who, index in received if who == name] == list(range(20000))


def test_a_frame_carries_every_message_sent_in_one_loop_turn():
    async def scenario():
        sender, receiver = await _pair()
        for index in range(64):
            sender.send(("update", index, b"x" * 100))
        frame = await receiver.receive()
        await sender.close()
        await receiver.close()
        return frame

    frame = asyncio.run(scenario())
    assert [message[1] for message in frame] == list(range(64))


def test_arrays_arrive_equal_and_writable_and_a_large_frame_whole_before_the_close():
    """A step's worth of audio (256 patches of 7,680 float32 samples, 7.9 MB: more than a socket buffer holds) goes out
    of band from a sender thread; it arrives equal, the receiver may write to it, close() sends it before the end."""
    import numpy as np

    async def scenario():
        sender, receiver = await _pair()
        audio = np.arange(256 * 7680, dtype=np.float32).reshape(256, 7680)
        sender.send(("patches", audio, tuple(range(256))))
        sender.send(("column", audio[:, 3]))  # a strided view: pickled as a copy
        await sender.close()
        frames = []
        while (frame := await receiver.receive()) is not None:
            frames += frame
        await receiver.close()
        return audio, frames

    audio, frames = asyncio.run(scenario())
    (name, received, rows), (_, column) = frames
    assert name == "patches" and rows == tuple(range(256))
    np.testing.assert_array_equal(received, audio)
    np.testing.assert_array_equal(column, audio[:, 3])
    received[0, 0] = -1.0  # writable: backed by the frame the receiver read
    assert received[0, 0] == -1.0


def test_a_channel_whose_other_end_is_gone_drops_its_sends_and_closes():
    import numpy as np

    async def scenario():
        sender, receiver = await _pair()
        await receiver.close()
        for _ in range(8):
            sender.send(("patches", np.zeros((256, 7680), dtype=np.float32)))  # more than the socket holds
            await asyncio.sleep(0)
        await asyncio.wait_for(sender.close(), 30)
        assert not sender.sender.is_alive()

    asyncio.run(scenario())
