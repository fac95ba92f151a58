"""Fixtures of the LLM suite and helpers to call the service and read its metrics.

Two services run for the whole suite, started side by side because a vLLM start costs 20-80 s on two cores:
the tiny preset (synthetic weights), and a real checkpoint that transformers saves from a random Qwen3.
"""

from __future__ import annotations

import signal
import time

import grpc
import pytest
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from services.llm.config import bundled_tokenizer_dir
from tests.harness import sample_sum, scrape_samples, start_service, venv_python
from voiceagent.v1 import llm_pb2, llm_pb2_grpc

# Small KV cache, no hub look-ups, no compile warm-up: what keeps the suite inside its time budget.
TEST_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TEST_ARGS = ["--kv-cache-gib", "1", "--enforce-eager", "true", "--max-model-len", "512"]
MAX_IN_FLIGHT = 32


READY_TIMEOUT_S = 400


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A random Qwen3 in the real on-disk format: config.json, model.safetensors, tokenizer files."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    directory = tmp_path_factory.mktemp("qwen3-random")
    model.save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    tokenizer.save_pretrained(directory)
    return directory, model, tokenizer


@pytest.fixture(scope="session")
def services(checkpoint):
    """Both services, started at once; stopped at once when the suite ends."""
    directory, _, _ = checkpoint
    python = venv_python("llm")
    arguments = {
        "tiny": ["--preset", "tiny", "--max-in-flight", str(MAX_IN_FLIGHT), *TEST_ARGS],
        "checkpoint": ["--model", str(directory), "--dtype", "float32", *TEST_ARGS],
    }
    started = {}
    try:
        for name, args in arguments.items():
            started[name] = start_service("services.llm", python, args, TEST_ENV)
        yield started
    finally:
        for service in started.values():
            if service.proc.poll() is None:
                service.proc.send_signal(signal.SIGTERM)
        for service in started.values():
            service.terminate()


def wait_serving(service, timeout_s: float = READY_TIMEOUT_S):
    service.wait_serving(timeout_s)
    return service


@pytest.fixture(scope="session")
def tiny_llm(services):
    """The LLM service on the tiny preset, SERVING, in its own process (llm environment)."""
    return wait_serving(services["tiny"])


@pytest.fixture(scope="session")
def checkpoint_llm(services):
    """The LLM service on the saved random checkpoint (float32), SERVING."""
    return wait_serving(services["checkpoint"])


@pytest.fixture(scope="module")
def stub(tiny_llm):
    with grpc.insecure_channel(tiny_llm.address) as channel:
        yield llm_pb2_grpc.TextGeneratorStub(channel)


def generate(stub, timeout: float = 60, **fields) -> list[llm_pb2.GenerateResponse]:
    """One Generate call: `fields` are GenerateRequest fields, `sampling` a dict of SamplingParams fields."""
    sampling = llm_pb2.SamplingParams(**fields.pop("sampling", {"max_tokens": 8}))
    return list(stub.Generate(llm_pb2.GenerateRequest(sampling=sampling, **fields), timeout=timeout))


def wait_idle(url: str, timeout_s: float = 20, also: tuple[str, ...] = ()) -> list:
    """The service's metrics once no request runs, waits or is in flight (or after `timeout_s`); `also`: more
    gauges that must read 0 (vLLM's own, say)."""
    gauges = ("voiceagent_llm_requests_running", "voiceagent_llm_requests_waiting", *also)
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape_samples(url)
        busy = [sample_sum(samples, name) for name in gauges]
        busy.append(sample_sum(samples, "voiceagent_llm_rpc_in_flight", method="Generate"))
        if not any(busy) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)
