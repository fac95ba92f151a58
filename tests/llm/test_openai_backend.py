"""The openai backend against a real `vllm serve`: the tiny preset with the engine arguments our vllm backend
builds for it (loadgen/processes.py's `peer_command`, as the side-by-side starts it) and the suite's test
settings. Same greedy tokens as the vllm backend (the tiny_llm service), deltas as vLLM streams them, and a
cancelled call that cancels vLLM's request. The service runs with deploy/compose.llm-openai.yaml's settings.
One `vllm serve` for the module: it starts slowly on two cores."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time

import grpc
import httpx
import pytest
import yaml

from loadgen.processes import PEER_PRIVATE_TMP, HttpProcess, peer_command
from tests.harness import REPO, sample_sum, scrape_samples, start_service, venv_python
from tests.llm.conftest import READY_TIMEOUT_S, TEST_ENV, generate
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

# The suite's TEST_ARGS (conftest.py) as `vllm serve` flags; given after peer_command's own, they win.
SERVE_TEST_ARGS = ["--enforce-eager", "--max-model-len", "512", "--kv-cache-memory-bytes", str(1 << 30)]
GREEDY = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_serve(tmp_path_factory):
    """`vllm serve` on the tiny preset; its base URL (no /v1)."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm-serve.log"
    process = HttpProcess("vllm serve", peer_command("tiny", port) + SERVE_TEST_ARGS, log, f"{base_url}/v1/models",
                          env=TEST_ENV, private_tmp=PEER_PRIVATE_TMP)  # fmt: skip
    try:
        process.wait_ready(READY_TIMEOUT_S)
        yield base_url
    finally:
        process.stop()


def compose_override_environment(upstream_url: str) -> dict[str, str]:
    """The LLM's settings in deploy/compose.llm-openai.yaml as compose interpolates them with LLM_UPSTREAM_URL
    set, and its API-key secret's default source (/dev/null: no key) in place of the mount."""
    llm = yaml.safe_load((REPO / "deploy" / "compose.llm-openai.yaml").read_text())["services"]["llm"]
    environ = {"LLM_UPSTREAM_URL": upstream_url}
    interpolate = lambda value: re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: environ.get(m[1], m[2]), str(value))
    settings = {name: interpolate(value) for name, value in llm["environment"].items()}
    assert settings.pop("LLM_UPSTREAM_API_KEY_FILE") == "/run/secrets/llm_upstream_api_key"
    return {**settings, "LLM_UPSTREAM_API_KEY_FILE": "/dev/null"}


@pytest.fixture(scope="module")
def remote_llm(vllm_serve):
    """Our LLM service with the openai backend in front of `vllm serve`, set up as the compose override does."""
    environ = compose_override_environment(f"{vllm_serve}/v1")
    assert environ["LLM_BACKEND"] == "openai"
    service = start_service("services.llm", venv_python("llm"), [], environ)
    try:
        service.wait_serving(60)
        yield service
    finally:
        service.terminate()


@pytest.fixture(scope="module")
def remote(remote_llm):
    with grpc.insecure_channel(remote_llm.address) as channel:
        yield llm_pb2_grpc.TextGeneratorStub(channel)


def ids_of(responses) -> list[int]:
    return [token for response in responses for token in response.token_ids]


def text_of(responses) -> str:
    return "".join(response.text for response in responses)


def chat(*turns: tuple[str, str]) -> llm_pb2.Chat:
    return llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role=role, content=content) for role, content in turns])


@pytest.mark.parametrize(
    "prompt",
    [
        {"text": "The quick brown fox jumps over the lazy dog."},
        {"token_ids": llm_pb2.TokenIds(ids=[785, 3974, 13876, 38835, 34208])},
        {"chat": chat(("system", "You are a helpful voice assistant."), ("user", "What's the weather in Lisbon?"))},
    ],
    ids=["text", "token_ids", "chat"],
)
def test_greedy_tokens_match_the_vllm_backend(stub, remote, prompt):
    local = generate(stub, **prompt, sampling=GREEDY)
    upstream = generate(remote, **prompt, sampling=GREEDY)
    assert len(ids_of(upstream)) == GREEDY["max_tokens"]
    assert ids_of(upstream) == ids_of(local)
    assert text_of(upstream) == text_of(local)
    done, expected = upstream[-1].completion, local[-1].completion
    assert done.finish_reason == llm_pb2.FINISH_REASON_LENGTH
    assert done.usage.prompt_tokens == expected.usage.prompt_tokens
    assert done.usage.completion_tokens == GREEDY["max_tokens"]
    assert 0 < done.timings.time_to_first_token_s <= done.timings.e2e_s


def test_a_stop_string_ends_the_text_as_in_the_vllm_backend(stub, remote):
    sampling = {**GREEDY, "max_tokens": 32}
    full = text_of(generate(stub, text="Count with me:", sampling=sampling))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    responses = generate(remote, text="Count with me:", sampling={**sampling, "stop": [stop]})
    assert text_of(responses) == text_of(generate(stub, text="Count with me:", sampling={**sampling, "stop": [stop]}))
    assert responses[-1].completion.finish_reason == llm_pb2.FINISH_REASON_STOP
    assert responses[-1].completion.stop == stop


def upstream_chunks(base_url: str, body: dict) -> list[list[int]]:
    """The token ids of each event `vllm serve` streams for `body`, read straight from it."""
    chunks = []
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for choice in json.loads(line[5:]).get("choices", []):
                    if choice.get("token_ids") or choice.get("text"):
                        chunks.append(choice.get("token_ids") or [])
    return chunks


def test_each_delta_is_one_upstream_event_sent_on_as_it_arrives(vllm_serve, remote, remote_llm):
    prompt, tokens = "Once upon a time", 48
    body = {"model": remote.GetInfo(common_pb2.InfoRequest()).model.preset, "prompt": prompt, "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
    direct = upstream_chunks(vllm_serve, body)
    started, arrivals, responses = time.perf_counter(), [], []
    call = remote.Generate(
        llm_pb2.GenerateRequest(text=prompt, sampling=llm_pb2.SamplingParams(**GREEDY | {"max_tokens": tokens})),
        timeout=60,
    )
    for response in call:
        arrivals.append(time.perf_counter() - started)
        responses.append(response)
    deltas = [list(response.token_ids) for response in responses[:-1]]
    assert deltas == direct, "one gRPC message per upstream event, with that event's token ids"
    assert not responses[-1].token_ids and responses[-1].HasField("completion")
    # Sent on as they arrive: the first delta reaches the client long before the last one is generated.
    assert arrivals[0] < 0.5 * arrivals[-2], arrivals


def vllm_counts(base_url: str) -> tuple[float, float]:
    samples = scrape_samples(f"{base_url}/metrics")
    return sample_sum(samples, "vllm:num_requests_running"), sample_sum(samples, "vllm:generation_tokens_total")


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_cancelling_the_call_cancels_the_upstream_request(vllm_serve, remote):
    max_tokens = 480  # + the prompt, within the 512-token model length
    _, generated_before = vllm_counts(vllm_serve)
    call = remote.Generate(
        llm_pb2.GenerateRequest(text="Tell me a long story", sampling=llm_pb2.SamplingParams(
            max_tokens=max_tokens, temperature=0, ignore_eos=True)),
        timeout=120,
    )  # fmt: skip
    received = []

    def read():
        with contextlib.suppress(grpc.RpcError):  # CANCELLED, once cancelled below
            received.extend(call)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: len(received) >= 3, 30, "three deltas")
    wait_for(lambda: vllm_counts(vllm_serve)[0] == 1, 5, "vLLM running the request")
    call.cancel()
    wait_for(lambda: vllm_counts(vllm_serve)[0] == 0, 5, "vLLM's running count back to 0")
    reader.join(5)
    assert call.code() == grpc.StatusCode.CANCELLED
    time.sleep(0.5)  # anything still generating would show in the counter now
    _, generated_after = vllm_counts(vllm_serve)
    assert 3 <= generated_after - generated_before < max_tokens, "vLLM stopped generating: it aborted the request"


def test_an_upstream_rejection_is_invalid_argument_with_its_message(remote):
    with pytest.raises(grpc.RpcError) as caught:
        # ~600 prompt tokens, over the 512-token model length: only the upstream, which tokenises, can tell
        # (a max_tokens over it is refused before the request leaves: tests/llm/test_validation.py)
        generate(remote, text="hello " * 600, sampling={"max_tokens": 8})
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "HTTP 400" in caught.value.details() and "512" in caught.value.details(), caught.value.details()


def test_info_names_the_upstream_and_leaves_what_it_cannot_know_empty(vllm_serve, remote):
    info = remote.GetInfo(common_pb2.InfoRequest(), timeout=10)
    model = info.model
    assert model.backend == "openai" and model.source == f"{vllm_serve}/v1" and model.device == "remote"
    assert model.preset == "tiny", "vllm serve gets our service's served model name (services.llm.serve_args)"
    assert model.weight_bytes == 0 and model.parameter_count == 0 and not model.dtype
    assert dict(model.shape) == {"max_model_len": 512.0}
    assert info.ceilings.device == "unmeasured" and info.ceilings.memory_bandwidth_bytes_per_s == 0
    assert info.limits["upstream_max_connections"] == info.limits["max_in_flight"] == 64
