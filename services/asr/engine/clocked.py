"""The clocked step policy (`--step-policy clocked`): the streams of one chunk size step once per chunk period.

With the default policy ("ready") a chunk size's loop steps whenever some streams have a whole chunk, after
waiting up to `batch_wait_fraction` of a chunk for others. Real-time streams whose chunks complete at
different phases of the period then take several steps per period, each paying the step's fixed cost (every
layer's kernels once). Clocked, the loop keeps a clock of the chunk period: at each tick every stream with a
whole chunk steps in one batch, so N real-time streams cost one batched step per period whatever their phases,
as in NeMo's own loop that steps all its streams together. The clock starts when the first stream is ready
and stops when no stream is left; a tick missed because steps ran long is skipped, keeping the phase.

The price is latency: a chunk completed just after a tick waits up to one period for the next (a stream's
last, short chunk too: the final hypothesis comes up to one period later than with "ready"). Streams that are
behind (a whole chunk more than the next step needs already buffered: audio fed faster than real time) do not
wait for the tick; they step at once, batch after batch, until one step from caught up.
"""

from __future__ import annotations

import asyncio
import math

from services.asr.engine.features import HOP_SAMPLES, SAMPLE_RATE

HOPS_PER_MS = SAMPLE_RATE / HOP_SAMPLES / 1000  # mel frames per millisecond of audio


def behind(backend, stream) -> bool:
    """Whether `stream` steps without waiting for the tick: it holds one more whole chunk than its next step
    needs (audio arriving faster than real time)."""
    chunk = round(stream.settings.chunk_ms * HOPS_PER_MS)
    return stream.mel_available() >= stream.mel_consumed + backend.chunk_mel(stream) + chunk


async def clocked_loop(backend, chunk_ms: int) -> None:
    """`backend`'s batching loop for `chunk_ms` under the clocked policy (see the module docstring)."""
    period = chunk_ms / 1000
    wake = backend.wake[chunk_ms]
    loop = asyncio.get_running_loop()
    tick: float | None = None  # the next tick (loop time); None while the clock is stopped
    everyone = True  # look at every stream: at start and after a timeout (a tick is due, a held stream is free)
    while True:
        # Between ticks a wake looks only at the streams touched since (audio in, ended, a step read back): one
        # look at every stream per audio message made the loop O(streams) per message (backend.changed).
        touched = backend.take_changed(chunk_ms)
        streams = list(backend.streams[chunk_ms]) if everyone else touched
        everyone = False
        for stream in streams:  # all audio stepped: the final hypothesis needs no step, so no tick either
            if (
                stream.closed
                and not (stream.finished or stream.in_step or stream.abandoned)
                and stream.mel_available() == stream.mel_consumed
            ):
                backend._finish(stream)
        late = [stream for stream in streams if backend._ready(stream) and behind(backend, stream)]
        if late:
            await backend._step_streams(late, every_batch=True)
            continue
        now = loop.time()
        if tick is None and any(backend._ready(stream) for stream in streams):
            tick = now  # the first ready stream starts the clock
        if tick is not None and now >= tick:
            ready = [stream for stream in backend.streams[chunk_ms] if backend._ready(stream)]  # once per tick
            if ready:
                await backend._step_streams(ready, every_batch=True)
            if not any(not stream.finished for stream in backend.streams[chunk_ms]):
                tick = None  # no stream left: the clock stops
            else:  # the next tick on the same phase, skipping those the step overran
                tick += period * max(1, math.ceil((loop.time() - tick) / period))
            continue
        if await backend.drain(chunk_ms):  # read the step in flight back before waiting; then look again
            continue
        wake.clear()
        waits = [left for left in (None if tick is None else tick - now, backend._hold_left(chunk_ms)) if left]
        try:
            await asyncio.wait_for(wake.wait(), min(waits) if waits else None)
        except TimeoutError:
            everyone = True
