"""A steady step's host cost does not grow with its streams' torch calls: on a GPU every torch call is host time (a
view, a kernel launch), and a call per stream per step was, at ~1,000 streams, tens of milliseconds of each step
(results/h200/README.md, v5). Counted on the CPU twin of the padded step, as the H200 run plan configures it."""

from __future__ import annotations

import asyncio
import collections
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import features  # noqa: E402

MAX_STREAMS = 16


class Calls(TorchDispatchMode):
    """Counts the torch operations run under it, by name."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module", params=[True, False], ids=["features-in-step", "features-on-host"])
def backend(request):
    config = AsrConfig(
        preset="tiny",
        max_streams=MAX_STREAMS,
        max_batch_streams=MAX_STREAMS,
        padded_steps=True,
        features_in_step=request.param,
    )
    backend = load_in_process(config)
    backend.warm_up()
    return backend


def _steady_step_calls(backend, chunk_ms: int, count: int) -> collections.Counter[str]:
    """Torch calls of the fourth step of `count` real-time streams (one chunk of audio arrives per step)."""
    rng = np.random.default_rng(count)
    streams = [backend._new_stream(StreamSettings(f"s{i}", chunk_ms, False)) for i in range(count)]
    piece = chunk_ms * features.SAMPLE_RATE // 1000
    try:
        for step in range(4):
            for stream in streams:  # a chunk's audio, and the 16 ms its last frame's window reaches past it
                while stream.mel_available() < stream.mel_consumed + backend.chunk_mel(stream):
                    stream.append(rng.standard_normal(piece).astype(np.float32) * 0.1, time.perf_counter())
            if step < 3:
                backend._step(streams)
        with Calls() as calls:
            backend._step(streams)
        return calls.counts
    finally:
        for stream in streams:
            backend._release(stream)


@pytest.mark.parametrize("chunk_ms", [80, 320])
def test_a_steady_step_makes_no_torch_call_per_stream(backend, chunk_ms):
    few, many = _steady_step_calls(backend, chunk_ms, 2), _steady_step_calls(backend, chunk_ms, MAX_STREAMS)
    grew = {name: (few[name], many[name]) for name in few | many if few[name] != many[name]}
    assert not grew, f"torch calls that grew from 2 to {MAX_STREAMS} streams (2, {MAX_STREAMS}): {grew}"
    assert sum(few.values()) > 100  # the step itself ran under the count


def test_a_short_last_chunk_steps_apart_from_whole_chunks(backend, monkeypatch):
    """A stream's short last chunk does not take the whole chunks stepping beside it off their padded step (one
    short chunk made a whole batch step eagerly: at 320 ms, thousands of streams, once per stream ending)."""
    chunk_ms, rng = 320, np.random.default_rng(5)
    steady = backend.padded[chunk_ms, backend.pre_encode_frames]
    rows = []
    replay = steady._replay
    monkeypatch.setattr(steady, "_replay", lambda slots: rows.append(len(slots)) or replay(slots))
    long, short = (backend._new_stream(StreamSettings(name, chunk_ms, False)) for name in ("long", "short"))
    try:
        for stream in (long, short):  # the first chunk and the second whole one
            while stream.mel_available() < backend.chunk_mel(stream) + backend.streaming[chunk_ms].chunk_size[1]:
                stream.append(rng.standard_normal(1600).astype(np.float32) * 0.1, time.perf_counter())
            backend._step([stream])
            backend._step([stream])
        rows.clear()
        long.append(rng.standard_normal(chunk_ms * 16).astype(np.float32) * 0.1, time.perf_counter())
        short.append(rng.standard_normal(chunk_ms * 4).astype(np.float32) * 0.1, time.perf_counter())
        short.closed = True
        assert long.mel_available() >= long.mel_consumed + backend.chunk_mel(long)
        assert short.mel_consumed < short.mel_available() < short.mel_consumed + backend.chunk_mel(short)
        asyncio.run(backend._step_streams([long, short]))
        assert rows == [1], f"the whole chunk's padded step took {rows} rows"
        assert short.mel_consumed == short.mel_available()  # stepped too, eagerly
    finally:
        for stream in (long, short):
            backend._release(stream)


def test_padded_steps_compute_their_streams_features_when_asked(backend, monkeypatch):
    """With --features-in-step a padded step takes audio and computes the mel frames itself: no mel front end runs
    before it (on a GPU, a few dozen eager launches and a cuFFT plan per new shape, each step)."""
    host = []
    mel_batch = features.mel_batch
    monkeypatch.setattr(features, "mel_batch", lambda *args: host.append(len(args[2])) or mel_batch(*args))
    _steady_step_calls(backend, 80, 3)
    assert (host == []) == backend.features_in_step, f"mel front end calls before the step: {host}"
