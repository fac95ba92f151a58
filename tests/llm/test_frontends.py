"""Several gRPC front ends on one vLLM engine core (`--frontends 2`), and coalesced deltas.

Two services of the tiny preset run side by side: `spread` has two front-end processes sharing one port and one
engine core, and sends every 4 tokens (`--stream-interval 4`); `single` is today's one process, sending each step's
tokens. Both greedy on the same synthetic weights, so their outputs must be the same token for token.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.harness import child_processes, sample_sum, scrape_samples, start_service, venv_python
from tests.llm.conftest import TEST_ARGS, TEST_ENV, generate, wait_idle
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

FRONTENDS = 2
INTERVAL = 4
GRACE_S = 3
STEP_TOKENS = 1024  # vLLM's token budget per step, set explicitly (its default is 2,048 on CPU)
STARTUP_S = 1200  # two engines and two front ends start at once; the shared 2-core machine can be very busy
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def pods():
    python = venv_python("llm")
    common = ["--preset", "tiny", "--max-in-flight", "32", "--max-num-batched-tokens", str(STEP_TOKENS), *TEST_ARGS]
    arguments = {
        "spread": [
            *common,
            "--frontends",
            str(FRONTENDS),
            "--stream-interval",
            str(INTERVAL),
            "--grace-s",
            str(GRACE_S),
        ],
        "single": common,
    }
    started = {}
    try:
        for name, args in arguments.items():
            started[name] = start_service("services.llm", python, args, TEST_ENV)
        for service in started.values():
            service.wait_serving(STARTUP_S)
        yield started
    finally:
        for service in started.values():
            service.terminate()


@pytest.fixture(scope="module")
def spread(pods):
    return pods["spread"]


@pytest.fixture(scope="module")
def single(pods):
    return pods["single"]


def fresh_stub(service):
    """A channel of its own (its own TCP connection: no shared subchannel), so the kernel picks a front end anew."""
    channel = grpc.insecure_channel(service.address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, llm_pb2_grpc.TextGeneratorStub(channel)


def call(service, **fields) -> list[llm_pb2.GenerateResponse]:
    channel, stub = fresh_stub(service)
    with channel:
        return generate(stub, **fields)


def frontend_pids(service) -> list[int]:
    return child_processes(service.proc.pid, lambda command: command.startswith(b"llm-frontend-"))


def ids_of(responses) -> list[int]:
    return [token for response in responses for token in response.token_ids]


def text_of(responses) -> str:
    return "".join(response.text for response in responses)


def test_one_engine_core_and_n_front_ends(spread):
    assert len(frontend_pids(spread)) == FRONTENDS
    engines = child_processes(spread.proc.pid, lambda command: command.startswith(b"VLLM::EngineCore"))
    assert len(engines) == 1, "the engine core is launched once, by the supervisor"
    for pid in frontend_pids(spread):
        assert not child_processes(pid, lambda command: command.startswith(b"VLLM::EngineCore"))


def test_every_front_end_and_a_single_one_run_the_engine_they_were_given(spread, single):
    """The step's budget is the service's setting, not a default that depends on how vLLM was started (an API
    server's differs from an in-process engine's on large GPUs): every front end of the pod and a one-front-end pod
    report the same engine limits."""
    seen = []
    for service in (spread, single, spread, spread):  # fresh connections: the kernel picks a front end each time
        channel, stub = fresh_stub(service)
        with channel:
            info = stub.GetInfo(common_pb2.InfoRequest(), timeout=30)
        seen.append((info.limits["max_num_batched_tokens"], info.limits["max_num_seqs"]))
    assert set(seen) == {(STEP_TOKENS, 32)}


def test_requests_spread_over_the_front_ends_and_metrics_add_up(spread):
    requests, max_tokens = 12, 6
    before = scrape_samples(spread.metrics_url)
    for index in range(requests):
        call(spread, text=f"spread {index}", sampling={"max_tokens": max_tokens, **GREEDY})
    after = scrape_samples(spread.metrics_url)

    def grew(name: str, **labels: str) -> float:
        return sample_sum(after, name, **labels) - sample_sum(before, name, **labels)

    per_frontend = [grew("voiceagent_llm_frontend_rpcs_total", frontend=str(i)) for i in range(FRONTENDS)]
    assert sum(per_frontend) == requests
    assert all(count > 0 for count in per_frontend), (
        f"the kernel sent every connection to one front end: {per_frontend}"
    )
    # One endpoint for the pod: each front end's counters summed.
    assert grew("voiceagent_llm_rpc_requests_total", method="Generate", code="OK") == requests
    assert grew("voiceagent_llm_generated_tokens_total") == requests * max_tokens
    assert grew("voiceagent_llm_time_to_first_token_seconds_count") == requests
    assert grew("voiceagent_llm_e2e_latency_seconds_count", finish_reason="length") == requests
    assert grew("vllm:generation_tokens_total") == requests * max_tokens
    # Engine steps counted once each, though two front ends hear from the engine: batch 1, one step per token.
    assert grew("voiceagent_llm_engine_steps_total") == requests * max_tokens
    assert sample_sum(after, "voiceagent_llm_rpc_in_flight", method="Generate") == 0


def test_the_running_count_is_the_one_engines(spread):
    streams, max_tokens = 6, 400
    seen: list[float] = []

    def long_request(index: int):
        return call(spread, text=f"long {index}", sampling={"max_tokens": max_tokens, **GREEDY}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(long_request, index) for index in range(streams)]
        while not all(future.done() for future in futures):
            samples = scrape_samples(spread.metrics_url)
            seen.append(sample_sum(samples, "voiceagent_llm_requests_running"))
            assert sample_sum(samples, "vllm:num_requests_running") <= streams
            time.sleep(0.05)
        results = [future.result() for future in futures]
    assert all(len(ids_of(responses)) == max_tokens for responses in results)
    assert max(seen) == streams, f"running counts seen: {sorted(set(seen))}"  # not 2x: one engine, one series
    deadline = time.monotonic() + 10
    while sample_sum(scrape_samples(spread.metrics_url), "voiceagent_llm_requests_running") != 0:
        assert time.monotonic() < deadline, "the running count did not return to 0"
        time.sleep(0.1)


def test_interval_coalesced_output_equals_the_per_step_output(spread, single):
    fields = {"text": "Coalesce these deltas, please.", "sampling": {"max_tokens": 30, **GREEDY}}
    per_step = call(single, **fields)
    coalesced = call(spread, **fields)
    assert ids_of(coalesced) == ids_of(per_step) and text_of(coalesced) == text_of(per_step)
    assert len(ids_of(per_step)) == 30
    assert len(per_step[0].token_ids) == 1 and len(coalesced[0].token_ids) == 1, "the first token is never held"
    # Then INTERVAL tokens a message (1 + 4 x 7 = 29) and the last token with the completion: [1, 4, ..., 4, 1]. A
    # front end that falls a step behind sends two intervals as one message, so what holds on a busy machine is
    # that every message ends on an interval's boundary.
    ends = list(itertools.accumulate(len(r.token_ids) for r in coalesced))
    assert set(ends) <= {1, *range(1 + INTERVAL, 30, INTERVAL), 30} and ends[-1] == 30, ends
    assert coalesced[-1].completion.usage.completion_tokens == 30


def test_deltas_a_stream_could_not_write_go_out_as_one_message(single):
    """The front end stopped (SIGSTOP) mid-stream cannot write: the engine's deltas wait and leave as one message
    when it resumes, in order, nothing lost; the first message still carries exactly the first token."""
    fields = {"text": "Back-pressure test", "sampling": {"max_tokens": 300, **GREEDY}}
    reference = call(single, **fields)
    channel, stub = fresh_stub(single)
    with channel:
        stream = stub.Generate(
            llm_pb2.GenerateRequest(text=fields["text"], sampling=llm_pb2.SamplingParams(**fields["sampling"])),
            timeout=120,
        )
        first = next(stream)
        os.kill(single.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(0.5)
        finally:
            os.kill(single.proc.pid, signal.SIGCONT)
        stalled = [first, *stream]
    assert len(first.token_ids) == 1
    assert ids_of(stalled) == ids_of(reference) and text_of(stalled) == text_of(reference)
    sizes = [len(response.token_ids) for response in stalled]
    assert max(sizes) > 1, f"no deltas were coalesced: {sizes}"
    assert len(stalled) < len(reference)


def test_max_in_flight_holds_for_the_pod_whichever_front_end_took_the_requests(spread):
    """One channel is one connection, so one front end: it holds the pod's whole --max-in-flight, and new
    connections, which the kernel may hand to the other front end, are refused (one counter for the pod)."""
    channel, stub = fresh_stub(spread)
    sampling = llm_pb2.SamplingParams(max_tokens=480, **GREEDY)  # held for ~480 engine steps of 32 requests
    held = [stub.Generate(llm_pb2.GenerateRequest(text=f"hold {i}", sampling=sampling), timeout=300) for i in range(32)]
    try:
        for call in held:
            next(call)  # admitted: its first tokens came
        refusals = []
        for index in range(4):
            other, other_stub = fresh_stub(spread)
            with other, pytest.raises(grpc.RpcError) as refused:
                generate(other_stub, text=f"one too many {index}", sampling={"max_tokens": 2})
            refusals.append(refused.value)
    finally:
        for call in held:
            call.cancel()
        channel.close()
    assert all(error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for error in refusals)
    assert all("max_in_flight" in error.details() and "the limit is 32" in error.details() for error in refusals)
    wait_idle(spread.metrics_url)


def test_a_dead_front_end_leaves_the_others_serving_then_the_pod_restarts(spread):
    victim, *survivors = frontend_pids(spread)
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.5)
    for index in range(4):  # new connections reach the front end still listening
        responses = call(spread, text=f"after {index}", sampling={"max_tokens": 4, **GREEDY})
        assert len(ids_of(responses)) == 4
    assert spread.health() == health_pb2.HealthCheckResponse.NOT_SERVING, "health reflects the whole pod"
    assert all(pid in frontend_pids(spread) for pid in survivors)
    assert spread.proc.wait(GRACE_S + 60) == 1, "the pod exits non-zero so that its orchestrator restarts it"
    assert "died" in spread.output()
