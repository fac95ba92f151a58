"""One ASR engine behind two gRPC front-end processes (`--frontends 2`): the calls spread over both front ends
(one port, SO_REUSEPORT), streams that arrived through either step together in the one engine, results equal
the offline pass, and the one /metrics merges both front ends and the engine's counters."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.asr.client import clip, config, hold_stream, metric, streams_together, stub
from tests.harness import running_service, venv_python
from tests.pods import assert_calls_end_unavailable, assert_pod_exits, kill_engine
from voiceagent.v1 import asr_pb2

STREAMS = 4


@pytest.fixture(scope="module")
def pod():
    args = ["--preset", "tiny", "--frontends", "2", "--max-streams", str(2 * STREAMS), "--probe-ceilings", "false"]
    args += ["--threads", "1", "--join-window-ms", "100"]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


def _rpcs(pod) -> list[float]:
    return [metric(pod, "voiceagent_asr_frontend_rpcs_total", frontend=str(index)) for index in (0, 1)]


def test_streams_through_two_front_ends_step_together_in_one_engine(pod):
    rpcs_before, steps_before = _rpcs(pod), metric(pod, "voiceagent_asr_step_duration_seconds_count")
    clips = [clip(1.6 + 0.3 * index, seed=300 + index) for index in range(STREAMS)]
    # each call on a channel of its own: a new connection, which the kernel hands to either front end
    results = streams_together(pod, [config(320, request_id=f"fe-{i}") for i in range(STREAMS)], clips)
    offline = []
    for _round in range(2):
        offline = [
            stub(pod).Recognize(asr_pb2.RecognizeRequest(config=config(320), audio=a.tobytes()), timeout=60)
            for a in clips
        ]
    assert [responses[-1].transcript for responses in results] == [result.transcript for result in offline]
    assert all(responses[-1].is_final for responses in results)
    assert max(update.batch_size for responses in results for update in responses) == STREAMS
    taken = [after - before for after, before in zip(_rpcs(pod), rpcs_before, strict=True)]
    assert all(count > 0 for count in taken), f"one front end took every call: {taken}"
    assert metric(pod, "voiceagent_asr_step_duration_seconds_count") > steps_before  # the engine's, merged


def test_the_pod_admits_max_streams_whichever_front_end_they_came_through(pod):
    """One channel is one connection, so all its streams land on one front end: that front end still admits the
    pod's whole --max-streams (one counter shared by the front ends), and the pod refuses the next stream."""
    limit = 2 * STREAMS
    channel = grpc.insecure_channel(pod.address)
    held = [hold_stream(pod.address, f"one-connection-{i}", seconds=30, channel=channel) for i in range(limit)]
    try:
        with pytest.raises(grpc.RpcError) as refused:
            hold_stream(pod.address, "one-too-many")  # a new connection: either front end
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"max_streams: all {limit} streams are busy" in refused.value.details()
    finally:
        for _channel, call in held:
            call.cancel()
        channel.close()
    deadline = time.monotonic() + 10
    while metric(pod, "voiceagent_asr_active_streams") and time.monotonic() < deadline:
        time.sleep(0.1)
    again, call = hold_stream(pod.address, "after-the-others-left", seconds=5)  # the places were given back
    call.cancel()
    again.close()


def test_a_dead_engine_fails_the_streams_of_every_front_end_and_stops_the_pod():
    args = ["--preset", "tiny", "--frontends", "2", "--max-streams", "16", "--probe-ceilings", "false"]
    with running_service("services.asr", venv_python("asr"), [*args, "--threads", "1", "--grace-s", "2"]) as pod:
        held = [hold_stream(pod.address, f"orphan-{index}") for index in range(6)]  # 6 connections: both front ends
        # the supervisor's spawned children: the engine process (started first) and the front ends
        kill_engine(pod)
        assert_calls_end_unavailable(call for _channel, call in held)
        assert_pod_exits(pod)
