"""One batched TTS engine behind two gRPC front-end processes (`--frontends 2`): requests that came through either
front end share the engine's steps and sound as they do alone, the pod admits max_batch + max_queue whichever front
end the requests came through, the one /metrics merges the front ends' and the engine's counters, and the engine's
death fails every front end's requests and stops the pod."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from services.tts.config import TtsConfig
from tests.harness import running_service, sample_sum, scrape_samples, venv_python
from tests.pods import assert_calls_end_unavailable, assert_pod_exits, kill_engine
from tests.tts.conftest import LONG_TEXT, TEXT, synthesize, together
from voiceagent.serving.config import load_config
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

MAX_BATCH, MAX_QUEUE = 4, 2
ARGS = ["--preset", "tiny", "--backend", "batched", "--frontends", "2", "--probe-ceilings", "false"]
ARGS += ["--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE)]


@pytest.fixture(scope="module")
def pod():
    with running_service("services.tts", venv_python("tts"), ARGS) as service:
        yield service


def _metric(service, name: str, **labels) -> float:
    return sample_sum(scrape_samples(service.metrics_url), name, default=0.0, **labels)


def _rpcs(service) -> list[float]:
    return [_metric(service, "voiceagent_tts_frontend_rpcs_total", frontend=str(index)) for index in (0, 1)]


def _one_channel_per_front_end(service, tries: int = 40) -> list[grpc.Channel]:
    """A channel (one connection) landed on front end 0 and one on front end 1: the kernel hashes each new
    connection to either, so channels are opened until each front end has taken one (told by its RPC count)."""
    found: dict[int, grpc.Channel] = {}
    for _ in range(tries):  # a local subchannel pool: its own connection (gRPC shares one between same-target channels)
        channel = grpc.insecure_channel(service.address, options=[("grpc.use_local_subchannel_pool", 1)])
        before = _rpcs(service)
        tts_pb2_grpc.SpeechSynthesizerStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=30)
        took = [index for index, (a, b) in enumerate(zip(_rpcs(service), before, strict=True)) if a > b]
        if len(took) == 1 and took[0] not in found:
            found[took[0]] = channel
        else:
            channel.close()
        if len(found) == 2:
            return [found[0], found[1]]
    raise AssertionError(f"{tries} connections did not reach both front ends: {sorted(found)}")


def test_requests_through_two_front_ends_share_steps_and_sound_as_alone(pod):
    first, second = _one_channel_per_front_end(pod)
    try:
        for channel in (first, second):  # both front ends say what the pod is
            info = tts_pb2_grpc.SpeechSynthesizerStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=30)
            assert info.limits["frontends"] == 2 and info.limits["max_batch"] == MAX_BATCH
        alone = synthesize(tts_pb2_grpc.SpeechSynthesizerStub(first), TEXT, seed=42).audio
        steps = "voiceagent_tts_step_requests_count"
        single = "voiceagent_tts_step_requests_bucket"
        before_steps, before_single = _metric(pod, steps), _metric(pod, single, le="1.0")
        rpcs = _rpcs(pod)
        # two requests on each front end, at once: one engine steps them together
        one, other = (tts_pb2_grpc.SpeechSynthesizerStub(channel) for channel in (first, second))
        calls = [(one, TEXT, {"seed": 42}), (other, TEXT, {"seed": 42}), (one, LONG_TEXT, {"seed": 7})]
        responses = together([*calls, (other, LONG_TEXT, {"seed": 8})])
        for response in responses:
            assert not isinstance(response, grpc.RpcError), response
            assert response.chunks[-1].is_last
        # the same seed and text, through either front end, inside a batch of four: the audio it has alone
        for response in responses[:2]:
            assert response.audio.shape == alone.shape
            np.testing.assert_allclose(response.audio, alone, atol=1e-5)  # float rounding of batched matmuls only
        # the engine's step counters reach the one /metrics (through front end 0), and steps carried more than one
        # request: requests of both front ends shared them
        grown = _metric(pod, steps) - before_steps
        assert grown > 0 and _metric(pod, single, le="1.0") - before_single < grown
        assert all(after - before >= 2 for after, before in zip(_rpcs(pod), rpcs, strict=True))
    finally:
        first.close()
        second.close()


def test_the_pod_admits_max_batch_and_its_queue_whichever_front_end_the_requests_came_through(pod):
    """Every request on one connection lands on one front end: it still admits the pod's max_batch + max_queue
    (one counter shared by the front ends; the engine queues past its slots), and the other front end refuses the
    next one."""
    first, second = _one_channel_per_front_end(pod)
    try:
        one, places = tts_pb2_grpc.SpeechSynthesizerStub(first), MAX_BATCH + MAX_QUEUE
        out: list = []
        calls = [(one, LONG_TEXT, {"seed": index}) for index in range(places)]
        runner = threading.Thread(target=lambda: out.extend(together(calls)))
        runner.start()
        deadline = time.monotonic() + 30  # every one admitted: the pod's gauge of requests holding a place
        while _metric(pod, "voiceagent_tts_busy_workers") < places:
            assert time.monotonic() < deadline, "the requests were not all admitted"
            time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as refused:
            synthesize(tts_pb2_grpc.SpeechSynthesizerStub(second), "One too many.")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_queue" in refused.value.details() and "2 front ends" in refused.value.details()
        runner.join(200)
        assert len(out) == places
        for response in out:  # the queued ones too: the engine held them until a slot was free
            assert not isinstance(response, grpc.RpcError), response
            assert response.chunks[-1].is_last
        again = synthesize(tts_pb2_grpc.SpeechSynthesizerStub(second), "The places were given back.")
        assert again.chunks[-1].is_last
    finally:
        first.close()
        second.close()


def test_a_dead_engine_fails_the_requests_of_every_front_end_and_stops_the_pod():
    with running_service("services.tts", venv_python("tts"), [*ARGS, "--grace-s", "2"]) as pod:
        first, second = _one_channel_per_front_end(pod)
        stubs = [tts_pb2_grpc.SpeechSynthesizerStub(channel) for channel in (first, second)]
        calls = [
            stub.Synthesize(tts_pb2.SynthesizeRequest(text=LONG_TEXT, config=tts_pb2.SynthesisConfig(seed=1)))
            for stub in stubs
        ]
        for call in calls:  # both are speaking
            next(iter(call))
        kill_engine(pod)
        assert_calls_end_unavailable(calls)
        assert_pod_exits(pod)
        first.close()
        second.close()


@pytest.mark.parametrize(
    "argv", [["--frontends", "2", "--backend", "pool"], ["--frontends", "0"], ["--frontends", "65"]]
)
def test_bad_front_end_settings_stop_start_up_naming_the_setting(argv):
    with pytest.raises(SystemExit, match="--frontends / TTS_FRONTENDS"):
        load_config(TtsConfig, "TTS", argv=argv, environ={})
