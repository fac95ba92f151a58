"""bench-asr's `--paced` probe (services/asr/benchmark.py) against a real server: streams send their audio in real
time, every partial gets a latency from the client's clock, and the probe value is their p95 over the chunk."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.asr.benchmark import clip_seconds, p95_over_chunk, service_latencies


def test_paced_streams_take_their_audio_time_and_every_partial_has_a_latency(cache_aware):
    seconds = clip_seconds(320, 1.6)  # 5 chunks
    started = time.perf_counter()
    latencies = asyncio.run(service_latencies(cache_aware.address, 320, 2, seconds))
    wall = time.perf_counter() - started
    assert wall >= seconds, f"not paced: {wall:.2f} s for {seconds} s of audio"
    assert len(latencies) >= 2 * 5, f"a partial per chunk and stream, then the finals: {len(latencies)}"
    assert all(0 < latency < 5 for latency in latencies)
    assert 0 < p95_over_chunk(latencies, 320) < 5 / 0.32


def test_the_probe_value_is_the_p95_over_the_chunk():
    assert p95_over_chunk([0.1] * 19 + [1.0], 320) == pytest.approx(0.145 / 0.32)  # linear: 0.1 + 0.05 x 0.9
    assert p95_over_chunk([], 320) == float("inf")  # nothing came back: fails
