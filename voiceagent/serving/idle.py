"""Client streams that go quiet: the next message of a request stream, or StreamIdle (OUT_OF_RANGE) once none came
within the service's `stream_idle_timeout_s`. Every wait on a client's next message goes through here, the first
message's too: a stream that opened and sent nothing held its call open until the client's own deadline (for ever
without one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from voiceagent.serving.errors import StreamIdle


async def next_message(messages: AsyncIterator, idle_s: float, hint: str):
    """`messages`' next message (None at its end); StreamIdle, whose message ends with `hint` (what the client
    should do), once none came for `idle_s` seconds (0: wait for ever)."""
    try:
        async with asyncio.timeout(idle_s or None):
            return await anext(messages, None)
    except TimeoutError:
        raise StreamIdle(f"no message for {idle_s:g} s (stream_idle_timeout_s): {hint}") from None
