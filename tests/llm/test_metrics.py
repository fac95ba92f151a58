"""The service's metrics move with the work: latency histograms per request, and the per-step work counters
exactly as model_shape.py's formulas say for the tokens generated (computed here from GetInfo's shape facts)."""

from __future__ import annotations

import json

import pytest

from services.llm.config import PRESETS
from tests.harness import sample_sum, scrape_samples
from tests.llm.conftest import MAX_IN_FLIGHT, generate
from voiceagent.v1 import common_pb2, llm_pb2


@pytest.fixture(scope="module")
def info(stub):
    return stub.GetInfo(common_pb2.InfoRequest(), timeout=10)


def test_info_reports_the_preset_shape_and_limits(info):
    preset = json.loads((PRESETS / "tiny" / "config.json").read_text())
    shape = info.model.shape
    assert info.service == "llm" and info.model.backend == "vllm"
    assert info.model.preset == "tiny" and info.model.synthetic_weights
    assert shape["layers"] == preset["num_hidden_layers"] and shape["hidden_size"] == preset["hidden_size"]
    assert shape["heads"] == preset["num_attention_heads"] and shape["kv_heads"] == preset["num_key_value_heads"]
    assert shape["head_dim"] == preset["head_dim"] and shape["vocab_size"] == preset["vocab_size"]
    assert shape["kv_bytes_per_token"] == 2 * 2 * preset["num_hidden_layers"] * preset["num_key_value_heads"] * 64
    assert info.model.weight_bytes == info.model.parameter_count * shape["weight_bytes_per_param"]
    assert info.limits["max_in_flight"] == MAX_IN_FLIGHT and info.limits["max_model_len"] == 512
    assert info.ceilings.memory_bandwidth_bytes_per_s > 0 and info.ceilings.peak_flops_per_s > 0


def test_latency_histograms_and_token_counters_count_every_request(stub, tiny_llm):
    before = scrape_samples(tiny_llm.metrics_url)
    requests, max_tokens = 3, 6
    prompt_tokens = 0
    for index in range(requests):
        responses = generate(
            stub, text=f"request {index}", sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        )
        prompt_tokens += responses[-1].completion.usage.prompt_tokens
    after = scrape_samples(tiny_llm.metrics_url)

    def grew(name: str, **labels: str) -> float:
        return sample_sum(after, name, **labels) - sample_sum(before, name, **labels)

    assert grew("voiceagent_llm_time_to_first_token_seconds_count") == requests
    assert grew("voiceagent_llm_inter_token_latency_seconds_count") == requests * (max_tokens - 1)
    assert grew("voiceagent_llm_e2e_latency_seconds_count", finish_reason="length") == requests
    assert grew("voiceagent_llm_queue_time_seconds_count") == requests
    assert grew("voiceagent_llm_generated_tokens_total") == requests * max_tokens
    assert grew("voiceagent_llm_prompt_tokens_total") == prompt_tokens
    # vLLM's own metrics are re-exported on the same endpoint.
    assert grew("vllm:time_to_first_token_seconds_count") == requests
    assert grew("vllm:generation_tokens_total") == requests * max_tokens
    assert sample_sum(after, "voiceagent_llm_requests_running") == 0
    assert sample_sum(after, "voiceagent_llm_requests_waiting") == 0


def expected_work(shape, prompt: int, cached: int, generated: int) -> tuple[float, float]:
    """FLOPs and read bytes of one request alone in the engine: its prefill step, then one step per token."""
    per_token = shape["flops_per_token"]
    per_pair = shape["attention_flops_per_pair"]
    logits = shape["logits_flops_per_row"]
    embedding = shape["embedding_bytes_per_token"]
    kv = shape["kv_bytes_per_token"]
    new = prompt - cached
    pairs = sum(range(cached + 1, prompt + 1))
    flops = per_token * new + per_pair * pairs + logits
    read = shape["step_weight_bytes"] + embedding * new + kv * prompt
    for number in range(2, generated + 1):  # token `number` comes from feeding token number-1 back at prompt+number-1
        context = prompt + number - 1
        flops += per_token + per_pair * context + logits
        read += shape["step_weight_bytes"] + embedding + kv * context
    return flops, read


@pytest.mark.parametrize("max_tokens", [8, 40])
def test_work_counters_follow_the_tokens_generated(stub, tiny_llm, info, max_tokens):
    prompt = llm_pb2.TokenIds(ids=[1000 + max_tokens + index for index in range(20)])
    before = scrape_samples(tiny_llm.metrics_url)
    responses = generate(
        stub, token_ids=prompt, sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    )
    after = scrape_samples(tiny_llm.metrics_url)
    usage = responses[-1].completion.usage
    assert usage.completion_tokens == max_tokens
    flops, read = expected_work(info.model.shape, usage.prompt_tokens, usage.cached_tokens, max_tokens)

    def grew(name: str) -> float:
        return sample_sum(after, name) - sample_sum(before, name)

    steps = grew("voiceagent_llm_engine_steps_total")
    assert steps == max_tokens  # one prefill step, then one decode step per further token
    grew_flops = grew("voiceagent_llm_model_flops_total")
    grew_read = grew("voiceagent_llm_model_read_bytes_total")
    assert grew_flops == pytest.approx(flops, rel=1e-9)
    assert grew_read == pytest.approx(read, rel=1e-9)
    # At batch 1 each step reads all the weights: bytes grow in proportion to the tokens generated.
    assert grew_read / max_tokens == pytest.approx(info.model.shape["step_weight_bytes"], rel=0.01)
