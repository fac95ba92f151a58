"""A step holds the device lock until its worker thread has finished, even when the call that started it is
cancelled (a Recognize past its deadline, a client gone): a second step must never use the model meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.engine.offline import finish_holding  # noqa: E402


@pytest.mark.parametrize("cancels", [1, 3])
def test_a_cancelled_step_keeps_the_device_lock_until_its_thread_ends(cancels):
    async def scenario() -> None:
        lock, done = asyncio.Lock(), threading.Event()

        def step() -> None:
            time.sleep(0.4)
            done.set()

        async def call() -> None:
            async with lock:
                await finish_holding(asyncio.to_thread(step))

        caller = asyncio.create_task(call())
        await asyncio.sleep(0.05)
        for _ in range(cancels):  # a deadline, then the client going away, ...
            caller.cancel()
            await asyncio.sleep(0.02)
        async with lock:
            assert done.is_set(), "the lock was free while the cancelled call's step still ran"
        with pytest.raises(asyncio.CancelledError):
            await caller

    asyncio.run(scenario())


def test_a_step_returns_its_result_and_raises_its_error():
    async def scenario() -> None:
        assert await finish_holding(asyncio.to_thread(lambda: 7)) == 7
        with pytest.raises(ZeroDivisionError):
            await finish_holding(asyncio.to_thread(lambda: 1 / 0))

    asyncio.run(scenario())
