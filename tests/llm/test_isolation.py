"""One client's request never holds up another's: oversized prompts are refused on their length before any
tokenising, legal ones are tokenised off the event loop, a client deadline frees the engine, and an engine
core that dies fails its streams with UNAVAILABLE and takes the service down (non-zero) for a restart.

The module runs its own tiny-preset service; the engine-death test kills it, so it runs last.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import random
import signal
import statistics
import string
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from tests.harness import child_processes, proc_stat, running_service, sample_sum, scrape_samples, venv_python
from tests.llm.conftest import TEST_ARGS, TEST_ENV, generate, wait_idle
from voiceagent.serving.lanes import LOW_PRIORITY_NICE
from voiceagent.v1 import llm_pb2, llm_pb2_grpc

MAX_MODEL_LEN = 512  # TEST_ARGS
QWEN3_LONGEST_TOKEN_BYTES = 128
MAX_PROMPT_BYTES = MAX_MODEL_LEN * QWEN3_LONGEST_TOKEN_BYTES
# services/llm/servicer.py message_limits: twice the largest legal request, bounded at 256 bytes per token.
MAX_RECEIVE_BYTES = 2 * (MAX_MODEL_LEN * 256 + (1 << 20))


MAX_IN_FLIGHT = 2  # so that two clients of refused prompts could hold every place if refusing came after admission


@pytest.fixture(scope="module")
def llm():
    args = ["--preset", "tiny", "--max-in-flight", str(MAX_IN_FLIGHT), *TEST_ARGS]
    with running_service("services.llm", venv_python("llm"), args, TEST_ENV) as service:
        yield service


@pytest.fixture(scope="module")
def stub(llm):
    with grpc.insecure_channel(llm.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        yield llm_pb2_grpc.TextGeneratorStub(channel)


def _small(stub) -> tuple[float, list[float]]:
    """Time to first token of a 5-character prompt, and the gaps between its tokens (engine steps)."""
    started = time.perf_counter()
    arrivals = []
    request = llm_pb2.GenerateRequest(
        text="hello", sampling=llm_pb2.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    )
    for _ in stub.Generate(request, timeout=30):
        arrivals.append(time.perf_counter())
    return arrivals[0] - started, [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]


def test_an_oversized_text_prompt_is_refused_at_once_naming_the_limit(stub):
    size = MAX_PROMPT_BYTES + (1 << 20) + 1000  # larger than any legal request, within the receive limit
    started = time.perf_counter()
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, text="x" * size)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"max_prompt_bytes {MAX_PROMPT_BYTES}" in error.value.details()
    # Refused unparsed (servicer.OversizedRequest): named from the wire's length prefixes, exact to the byte.
    assert f"prompt.text: {size} bytes in a request of" in error.value.details()
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("megabytes", [8, 32])
def test_a_message_past_the_receive_limit_is_refused_by_grpc_before_our_process_copies_it(stub, megabytes):
    started = time.perf_counter()
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, text="x" * (megabytes << 20))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"vs. {MAX_RECEIVE_BYTES}" in error.value.details(), error.value.details()  # gRPC names both sizes
    assert time.perf_counter() - started < 2.0  # sending 32 MB over loopback included


def test_an_oversized_request_id_or_stop_string_is_refused_naming_the_field(stub):
    for fields, named in [
        ({"request_id": "r" * (2 << 20)}, "request_id"),
        ({"sampling": {"stop": ["s" * (2 << 20)]}}, "sampling"),
    ]:
        with pytest.raises(grpc.RpcError) as error:
            generate(stub, text="hi", **fields)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details().startswith(f"{named}: ") and "max_prompt_bytes" in error.value.details()


def test_chat_contents_count_together_and_token_ids_against_max_model_len(stub):
    half = "y" * (MAX_PROMPT_BYTES // 2 + 1)
    chat = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content=half)] * 2)
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, chat=chat)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt.chat.messages[1].content" in error.value.details() and "max_prompt_bytes" in error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, token_ids=llm_pb2.TokenIds(ids=[1] * (MAX_MODEL_LEN + 1)))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"exceed max_model_len {MAX_MODEL_LEN}" in error.value.details()


def test_a_prompt_under_the_byte_limit_but_too_many_tokens_is_refused_after_tokenising(stub):
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, text="word " * (MAX_PROMPT_BYTES // 5 - 1))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the model's max length" in error.value.details()
    # Counted on a prefix (~4 KB of its 64 KB): the rest is never tokenised (services/llm/backends/vllm.py _encode).
    assert "counted in its first" in error.value.details()


def test_a_long_prompt_that_fits_is_tokenised_whole_and_served(stub):
    """Past the prefix's length but within max_model_len: counted in full, served (a single token is far more than
    one character here: runs of 40 spaces and a letter, two tokens each)."""
    text = ("x" + " " * 40) * 250  # 10,250 characters and 500 tokens: longer than the probe (2 x 8 x 508)
    responses = generate(stub, text=text, sampling={"max_tokens": 4})
    assert 0 < responses[-1].completion.usage.prompt_tokens <= MAX_MODEL_LEN - 4


def test_prompts_the_model_refuses_never_hold_a_place_in_max_in_flight(stub, llm):
    """Tokenising is the expensive check, so it comes before admission: a prompt tokenised and then refused took a
    place for its ~25 ms of tokenising, and two clients sending such prompts (no whitespace: tokenised whole, then
    too long) kept a small request out of a limit of 2 in 27 of 30 tries (found by a probe)."""
    text = "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=32_000))  # < max_prompt_bytes
    stop = threading.Event()
    refused: list[grpc.StatusCode] = []

    def hostile() -> None:
        while not stop.is_set():
            try:
                generate(stub, text=text, sampling={"max_tokens": 4})
            except grpc.RpcError as error:
                refused.append(error.code())

    clients = [threading.Thread(target=hostile) for _ in range(MAX_IN_FLIGHT)]
    for client in clients:
        client.start()
    try:
        time.sleep(0.5)
        outcomes = []
        for _ in range(20):
            try:
                outcomes.append(len(generate(stub, text="hello", sampling={"max_tokens": 2})) > 0)
            except grpc.RpcError as error:
                outcomes.append(error.code())
    finally:
        stop.set()
        for client in clients:
            client.join()
    assert refused and set(refused) == {grpc.StatusCode.INVALID_ARGUMENT}, set(refused)
    assert outcomes == [True] * 20, outcomes


def test_a_prompt_longer_than_the_model_alone_is_blamed_on_the_prompt(stub):
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, token_ids=llm_pb2.TokenIds(ids=[1] * MAX_MODEL_LEN), sampling={"max_tokens": 4})
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"prompt: {MAX_MODEL_LEN} tokens"), error.value.details()
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, token_ids=llm_pb2.TokenIds(ids=[1] * (MAX_MODEL_LEN - 2)), sampling={"max_tokens": 4})
    assert error.value.details().startswith("sampling.max_tokens: "), error.value.details()


def hostile_client_ready(_: int) -> int:
    """Run in each hostile client process before measuring: by then it has imported this module (torch and
    transformers, through the conftest: seconds of CPU that landed in the measured window before)."""
    time.sleep(0.5)  # so that each of the two workers takes one
    return os.getpid()


def send_hostile(address: str, kind: str, duration_s: float) -> int:
    """Send one kind of hostile prompt for `duration_s`; each must be refused. Returns how many were sent."""
    text = "z" * (32 << 20) if kind == "huge" else "word " * (MAX_PROMPT_BYTES // 5 - 1)
    options = [("grpc.max_send_message_length", 64 << 20)]
    sent, deadline = 0, time.monotonic() + duration_s
    with grpc.insecure_channel(address, options=options) as channel:
        stub = llm_pb2_grpc.TextGeneratorStub(channel)
        while time.monotonic() < deadline:
            try:
                generate(stub, text=text)
            except grpc.RpcError as error:
                refused = grpc.StatusCode.RESOURCE_EXHAUSTED if kind == "huge" else grpc.StatusCode.INVALID_ARGUMENT
                assert error.code() == refused, error.details()
                sent += 1
    return sent


def test_hostile_prompts_do_not_delay_a_small_request(stub, llm):
    """Normal p95 time to first token of a small request, then the same request while other clients keep
    sending 32 MB prompts and prompts just under the byte limit (tokenised, then too long)."""
    for _ in range(3):
        _small(stub)  # warm
    normal, gaps = [], []
    for _ in range(20):
        ttft, step_gaps = _small(stub)
        normal.append(ttft)
        gaps += step_gaps
    p95 = statistics.quantiles(normal, n=20)[-1]
    engine_step = statistics.median(gaps)

    # Hostile clients in their own processes: building and sending 32 MB in this one would slow the measuring
    # client, not the service. At the lowest priority: on a 2-core machine two clients building and sending 32 MB
    # prompts back to back would otherwise take the cores from the service and the measuring client, and the test
    # would measure the clients' CPU use instead of what the service lets a hostile request do to a small one.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context, initializer=os.nice, initargs=(19,)) as pool:
        assert len(set(pool.map(hostile_client_ready, range(2)))) == 2, "both hostile clients up"
        running = [pool.submit(send_hostile, llm.address, kind, 6.0) for kind in ("huge", "just-under")]
        time.sleep(1.0)  # they begin sending
        during = [_small(stub)[0] for _ in range(20)]
        hostile_sent = [future.result() for future in running]
    assert all(hostile_sent), f"hostile requests refused per client: {hostile_sent}"
    # The target: normal p95 + one engine step, met by the median. The p95s, 45 samples per condition, are in
    # results/cpu/llm_hostile_ttft_2026-12-04b/: prompts past 4,096 characters are tokenised in a background lane at a
    # lower CPU priority (voiceagent/serving/lanes.py), which took the median with prompts just under the limit from
    # 13.3-13.7 to 9.2-11.5 ms (target 14.2-17.9) in interleaved runs on this 2-core machine, and from 32.6 to 15.2 ms
    # with clients and service on cores of their own. Here three runs of this test read 0.84, 0.98 and 0.56 of the
    # target (its p95 comes from 20 quiet requests, 7.9-18.1 ms), so it is asserted with a factor 1.5 for the shared
    # machine's noise (until the lane it was 2: 0.7-1.07 of the target then).
    target = p95 + engine_step
    print(f"normal p95 {p95 * 1000:.1f} ms + step {engine_step * 1000:.1f} ms = {target * 1000:.1f} ms; under hostile "
          f"prompts median {statistics.median(during) * 1000:.1f} ms, max {max(during) * 1000:.1f} ms")  # fmt: skip
    assert statistics.median(during) <= 1.5 * target, (
        f"small request TTFT under hostile prompts: median {statistics.median(during) * 1000:.1f} ms, "
        f"normal p95 {p95 * 1000:.1f} ms + one engine step {engine_step * 1000:.1f} ms = {target * 1000:.1f} ms"
    )
    niced = [nice for nice in thread_nices(llm.pid) if nice == LOW_PRIORITY_NICE]
    assert niced, f"no thread of the LLM process at nice {LOW_PRIORITY_NICE}: {thread_nices(llm.pid)}"


def thread_nices(pid: int) -> list[int]:
    """The nice value of each thread of `pid`."""
    nices = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            nices.append(int(proc_stat(pid, int(task.name))[16]))
    return nices


def test_a_client_deadline_stops_the_engine_request_and_frees_its_slot(stub, llm):
    before = scrape_samples(llm.metrics_url)
    request = llm_pb2.GenerateRequest(
        text="go on", sampling=llm_pb2.SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    )
    with pytest.raises(grpc.RpcError) as error:
        for _ in stub.Generate(request, timeout=0.5):
            pass
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    samples = wait_idle(llm.metrics_url)
    assert sample_sum(samples, "voiceagent_llm_requests_running") == 0
    assert sample_sum(samples, "voiceagent_llm_rpc_in_flight", method="Generate") == 0
    # The engine stopped generating for it: far fewer than its 400 tokens were made.
    generated = sample_sum(samples, "vllm:generation_tokens_total") - sample_sum(before, "vllm:generation_tokens_total")
    assert generated < 400


def test_a_dead_engine_core_fails_streams_with_unavailable_and_the_service_exits_non_zero(stub, llm):
    """Runs last: it ends the module's service."""
    request = llm_pb2.GenerateRequest(
        text="a long answer", sampling=llm_pb2.SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    )
    call = stub.Generate(request, timeout=60)
    next(call)  # streaming
    (core,) = child_processes(llm.proc.pid, lambda command: command.startswith(b"VLLM::EngineCore"))
    os.kill(core, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        for _ in call:
            pass
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "LLM engine" in error.value.details()
    seen_not_serving = False
    while llm.proc.poll() is None and time.monotonic() - killed_at < 20:
        with contextlib.suppress(grpc.RpcError):  # its port may be closing
            seen_not_serving |= llm.health() == health_pb2.HealthCheckResponse.NOT_SERVING
        time.sleep(0.05)
    assert llm.proc.poll() is not None, "the service kept running without its engine"
    assert llm.proc.returncode != 0
    assert time.monotonic() - killed_at < 15
    assert seen_not_serving or "draining" in llm.output()
    assert "exiting with status 1" in llm.output()
