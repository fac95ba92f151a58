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
