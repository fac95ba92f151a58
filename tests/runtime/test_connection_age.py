"""`--max-connection-age-s`: the server sends GOAWAY when a connection reaches that age, which is when a client
re-resolves DNS and so reaches replicas added since it connected; calls in flight on the old connection finish."""

from __future__ import annotations

import threading
import time

import grpc

from tests.harness import running_service, venv_python
from voiceagent.serving.tls import open_channel
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc


def test_connections_are_closed_at_their_age_and_calls_in_flight_finish():
    args = ["--load-s", "0", "--probe-ceilings", "false", "--chunk-delay-s", "0.1", "--max-connection-age-s", "1"]
    with running_service("tests.runtime.paced_service", venv_python("dev"), args) as paced:
        states: list[grpc.ChannelConnectivity] = []
        went_idle = threading.Event()

        def watch(state: grpc.ChannelConnectivity) -> None:
            states.append(state)
            if state == grpc.ChannelConnectivity.IDLE and grpc.ChannelConnectivity.READY in states:
                went_idle.set()

        with grpc.insecure_channel(paced.address) as channel:  # pick_first: its state is the one connection's
            channel.subscribe(watch)
            stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
            started = time.monotonic()
            # 25 chunks 0.1 s apart: the stream outlives the connection's 1 s age and still completes
            chunks = list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="x" * 25), timeout=30))
            assert len(chunks) == 25 and chunks[-1].is_last and time.monotonic() - started > 2
            assert went_idle.wait(10), f"the server never closed the connection: states {states}"
            channel.unsubscribe(watch)
        with open_channel(paced.address) as channel:  # round_robin reconnects (re-resolving) and keeps serving
            stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
            for _ in range(3):
                assert stub.GetInfo(common_pb2.InfoRequest(), timeout=10).service == "paced"
                time.sleep(1)
