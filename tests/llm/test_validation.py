"""Bad input gets INVALID_ARGUMENT naming the field; admission is bounded; cancelled streams free the engine."""

from __future__ import annotations

import grpc
import pytest

from tests.harness import sample_sum, scrape_samples
from tests.llm.conftest import MAX_IN_FLIGHT, generate, wait_idle
from voiceagent.v1 import llm_pb2

TINY_VOCAB = 151936
TEST_MAX_MODEL_LEN = 512


@pytest.mark.parametrize(
    ("fields", "field_named"),
    [
        ({}, "prompt"),
        ({"text": ""}, "prompt.text"),
        ({"chat": llm_pb2.Chat()}, "prompt.chat.messages"),
        ({"chat": llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="robot", content="hi")])}, "messages[0].role"),
        ({"token_ids": llm_pb2.TokenIds()}, "prompt.token_ids"),
        ({"token_ids": llm_pb2.TokenIds(ids=[1, TINY_VOCAB])}, "prompt.token_ids[1]"),
        ({"text": "hi", "sampling": {"max_tokens": 0}}, "sampling.max_tokens"),
        ({"text": "hi", "sampling": {"max_tokens": -3}}, "sampling.max_tokens"),
        ({"text": "hello there", "sampling": {"max_tokens": TEST_MAX_MODEL_LEN}}, "sampling.max_tokens"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "temperature": -0.5}}, "sampling.temperature"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "top_p": 0.0}}, "sampling.top_p"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "top_p": 1.5}}, "sampling.top_p"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "stop": [""]}}, "sampling.stop[0]"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "temperature": 2.5}}, "sampling.temperature"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "temperature": float("inf")}}, "sampling.temperature"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "seed": 1 << 32}}, "sampling.seed"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "seed": -1}}, "sampling.seed"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "stop": ["x"] * 33}}, "sampling.stop: 33 stop strings"),
        ({"text": "hi", "sampling": {"max_tokens": 4, "stop": ["x" * 1001]}}, "sampling.stop[0]: 1001 characters"),
        ({"text": "hi", "request_id": "r" * 129}, "request_id: 129 characters"),
        (  # more messages than tokens the model holds: refused before the template is applied
            {"chat": llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user")] * (TEST_MAX_MODEL_LEN + 1))},
            "prompt.chat.messages: 513 messages",
        ),
        (  # no room for any prompt: refused before tokenising (under max_prompt_bytes, 64 KiB here)
            {"text": "x" * 60_000, "sampling": {"max_tokens": TEST_MAX_MODEL_LEN}},
            "leaves no room for a prompt",
        ),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(stub, fields, field_named):
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, **fields)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field_named in error.value.details()


def test_prompt_plus_max_tokens_beyond_the_model_length_says_so(stub):
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, token_ids=llm_pb2.TokenIds(ids=[7] * 500), sampling={"max_tokens": 13})
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt (500 tokens) + max_tokens (13)" in error.value.details()
    assert str(TEST_MAX_MODEL_LEN) in error.value.details()
    # At the limit exactly it is served.
    responses = generate(stub, token_ids=llm_pb2.TokenIds(ids=[7] * 500), sampling={"max_tokens": 12})
    assert responses[-1].completion.usage.completion_tokens <= 12


def test_a_prompt_of_lines_without_spaces_is_refused_on_its_first_lines(stub):
    """Lines of no spaces (a chat template of empty messages looks so) are counted on a prefix cut at a newline."""
    lines = "\n".join(f"line{index}" for index in range(6_000))  # 46 KB: under max_prompt_bytes (64 KiB here)
    with pytest.raises(grpc.RpcError) as error:
        generate(stub, text=lines, sampling={"max_tokens": 4})
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "counted in its first" in error.value.details(), error.value.details()


def _long_request(index: int) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(
        token_ids=llm_pb2.TokenIds(ids=[100 + index, 200, 300]),
        sampling=llm_pb2.SamplingParams(max_tokens=400, temperature=0, ignore_eos=True),
    )


def test_more_in_flight_than_configured_is_resource_exhausted(stub, tiny_llm):
    calls = [stub.Generate(_long_request(index), timeout=60) for index in range(MAX_IN_FLIGHT)]
    try:
        for call in calls:
            next(call)  # each is admitted and streaming
        with pytest.raises(grpc.RpcError) as error:
            generate(stub, text="one too many")
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_in_flight" in error.value.details()
    finally:
        for call in calls:
            call.cancel()
    wait_idle(tiny_llm.metrics_url, also=("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert generate(stub, text="room again")[-1].completion.usage.completion_tokens > 0


def test_cancelled_streams_free_the_engine(stub, tiny_llm):
    before = scrape_samples(tiny_llm.metrics_url)
    cancelled_mid_stream = 0
    wave = 25
    for start in range(0, 500, wave):
        calls = [stub.Generate(_long_request(start + index), timeout=60) for index in range(wave)]
        for index, call in enumerate(calls):
            if index % 2 == 0:  # half mid-stream, half before their first token (queued or prefilling)
                next(call)
                cancelled_mid_stream += 1
        for call in calls:
            call.cancel()
    samples = wait_idle(tiny_llm.metrics_url, also=("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert sample_sum(samples, "vllm:num_requests_running") == 0
    assert sample_sum(samples, "vllm:num_requests_waiting") == 0
    assert sample_sum(samples, "voiceagent_llm_requests_running") == 0
    assert sample_sum(samples, "voiceagent_llm_requests_waiting") == 0
    assert sample_sum(samples, "voiceagent_llm_rpc_in_flight", method="Generate") == 0
    labels = dict(method="Generate", code="CANCELLED")
    cancelled = sample_sum(samples, "voiceagent_llm_rpc_requests_total", **labels) - sample_sum(
        before, "voiceagent_llm_rpc_requests_total", **labels
    )
    assert cancelled >= cancelled_mid_stream
    # The engine stopped generating for them (its own token counter), not just the streams.
    generated = sample_sum(samples, "vllm:generation_tokens_total") - sample_sum(before, "vllm:generation_tokens_total")
    assert generated < 500 * 400 / 4
    assert generate(stub, text="still serving")[-1].completion.usage.completion_tokens > 0
