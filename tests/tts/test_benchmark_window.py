"""bench-tts's sustained throughput: the audio that arrived while every client was busy, over that window; a level
measured for real against the tiny service has such a window and counts only chunks inside it; clients spread over
processes and ramped all come back, with the clients' self-check."""

from __future__ import annotations

import grpc
import pytest

from services.tts.benchmark import (
    CounterTrace,
    client_check,
    counters,
    delivery,
    grpc_cpu_s,
    service_level,
    step_counters,
    sustained_rate,
)
from tests.harness import running_service, venv_python
from voiceagent.v1 import common_pb2, tts_pb2_grpc


def test_only_chunks_inside_the_window_count():
    chunks = [(0.5, 0.16), (1.0, 0.16), (1.5, 0.16), (2.0, 0.16), (3.5, 0.16)]
    assert sustained_rate(chunks, 1.0, 2.0) == pytest.approx(3 * 0.16 / 1.0)
    assert sustained_rate(chunks, 2.0, 2.0) is None  # a client finished before the last one started hearing audio


def test_the_trace_reads_the_counters_between_its_first_and_last_samples_inside_a_window():
    trace = CounterTrace("http://unused")
    trace.samples = [(t, {"steps": 10.0 * t}) for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    assert trace.between(0.5, 3.5) == (2.0, {"steps": 10.0}, {"steps": 30.0})
    assert trace.between(0.5, 1.5) is None  # one sample inside: no interval to read


def test_a_level_against_the_service_has_a_window_inside_its_wall_time():
    args = ["--preset", "tiny", "--backend", "batched", "--max-batch", "4"]
    with running_service("services.tts", venv_python("tts"), args) as service:
        before, cpu = counters(service.metrics_url), grpc_cpu_s(service.proc.pid)
        with CounterTrace(service.metrics_url, every_s=0.05) as trace:
            level = service_level(service.address, 3, 3)
        after, cpu = counters(service.metrics_url), grpc_cpu_s(service.proc.pid) - cpu
        steps = step_counters(before, after, 3).split()
        with grpc.insecure_channel(service.address) as channel:
            info = tts_pb2_grpc.SpeechSynthesizerStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=10)
        steady = trace.between(*level.window)
        delivered = delivery(level, before, after, 3, info.model.shape["patch_ms"] / 1000, cpu, steady).split()
        spread = service_level(service.address, 4, 2, ramp_s=0.4, processes=2)
    start, end = level.window
    arrivals = [at for at, _ in level.chunks]
    assert min(arrivals) <= start < end <= max(arrivals)
    assert len(level.runs) == 9 and sum(seconds for _, seconds in level.chunks) == pytest.approx(
        sum(run[2] for run in level.runs)
    )
    inside = sum(seconds for at, seconds in level.chunks if start <= at <= end)
    assert 0 < inside < sum(run[2] for run in level.runs)  # the start and the tail are left out
    assert sustained_rate(level.chunks, start, end) == pytest.approx(inside / (end - start))
    assert level.row("batched service", 3).split()[-1] != "-"
    # the service's own counters over the level: 9 segments, each first heard at its own step or later
    assert int(steps[0]) == 3 and int(steps[1]) >= 9 and 1.0 <= float(steps[6]) <= float(steps[1])
    firsts = "voiceagent_tts_first_patch_steps_count"
    assert after[firsts] - before[firsts] == 9
    # the service's own first audio (over both RPC methods' labels) and slot wait: 9 requests, 3 at a time on 4 slots
    heard, waited = "voiceagent_tts_time_to_first_audio_seconds_count", "voiceagent_tts_queue_seconds_count"
    assert after[heard] - before[heard] == 9 and after[waited] - before[waited] == 9
    slot_ms, service_fa_ms = float(steps[7]), float(steps[8])
    assert 0 <= slot_ms < service_fa_ms <= 1000 * max(run[0] for run in level.runs)
    # delivery: the engine steps every running request each step, so (3 clients, nothing else) a client hears its
    # patches about one step apart; the gRPC process's CPU over the level is some, and less than the 2 cores here
    step_every, patch_p50, grpc_cpu = float(delivered[1]), float(delivered[2]), float(delivered[4])
    assert 0.5 * step_every <= patch_p50 <= 2 * step_every
    assert 0 < grpc_cpu < 2
    # the steady window's own step interval, rows and step time, from the counters sampled while the level ran: the
    # samples bracket the window, at most 3 rows (3 clients), a step's launch-to-done time within its interval
    assert steady is not None and trace.samples[0][0] <= level.window[0] and trace.samples[-1][0] >= level.window[1]
    steady_every, rows, step_ms = float(delivered[5]), float(delivered[6]), float(delivered[7])
    assert 0.5 * steady_every <= patch_p50 <= 2 * steady_every
    assert 1 <= rows <= 3 and 0 < step_ms <= steady_every
    # of the step's time: its launch (on a CPU the step is done at launch: most of it) and its wait for a prefill pass
    launch_ms, pass_wait_ms = float(delivered[8]), float(delivered[9])
    assert 0.5 * step_ms <= launch_ms <= step_ms and 0 <= pass_wait_ms <= step_ms - launch_ms + 0.01
    # clients in two processes, ramped: every client's requests come back, the steady-state percentiles count the
    # requests started after the ramp (each client's second), the aggregate counts all of them
    assert len(spread.chunks) > 0 and len(spread.runs) >= 4
    assert sum(seconds for _, seconds in spread.chunks) == pytest.approx(spread.audio_s)
    assert spread.audio_s > sum(run[2] for run in spread.runs)
    assert 0 <= spread.client_lag_s < 1.0 and 0 < spread.client_cpu < 2  # each client process's CPU, 2 cores here
    assert "2 process(es)" in client_check(spread, 4, 2)
