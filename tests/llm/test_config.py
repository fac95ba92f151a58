"""Configuration and presets, without an engine: settings fail fast naming the flag; preset shapes are the
published Qwen3 shapes, and the parameter counts the service reports match the model cards."""

from __future__ import annotations

import json

import pytest

from services.llm.config import PRESETS, LlmConfig, bundled_tokenizer_dir, preset_names
from services.llm.model_shape import ModelShape
from voiceagent.serving.config import load_config

# Non-embedding parameters from the Qwen3 model cards (huggingface.co/Qwen/Qwen3-*), in billions.
PUBLISHED_NON_EMBEDDING = {"qwen3-0.6b": 0.44, "qwen3-1.7b": 1.4, "qwen3-4b": 3.6, "qwen3-8b": 6.95}


def test_presets_are_found_and_the_bundled_tokenizer_is_located():
    assert {"tiny", "cpu", *PUBLISHED_NON_EMBEDDING} <= set(preset_names())
    tokenizer_dir = bundled_tokenizer_dir()
    assert tokenizer_dir is not None and (tokenizer_dir / "tokenizer_config.json").is_file()
    assert "chat_template" in json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert LlmConfig().port == 50052 and LlmConfig().metrics_port == 9092


@pytest.mark.parametrize(("name", "billions"), sorted(PUBLISHED_NON_EMBEDDING.items()))
def test_preset_shapes_have_the_published_parameter_counts(name, billions):
    shape = ModelShape.from_hf_config(json.loads((PRESETS / name / "config.json").read_text()), 2, 2)
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tied_embeddings else 2)
    assert (shape.parameter_count - embeddings) / 1e9 == pytest.approx(billions, rel=0.03)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--preset", "qwen3-70b"], "--preset / LLM_PRESET"),
        (["--model", "/no/such/dir"], "--model / LLM_MODEL"),
        (["--dtype", "int3"], "--dtype / LLM_DTYPE"),
        (["--max-in-flight", "0"], "--max-in-flight / LLM_MAX_IN_FLIGHT"),
        (["--kv-cache-gib", "0"], "--kv-cache-gib / LLM_KV_CACHE_GIB"),
        (["--backend", "tgi"], "--backend / LLM_BACKEND"),
        (["--backend", "openai"], "--upstream-url / LLM_UPSTREAM_URL"),
        (["--backend", "openai", "--upstream-url", "host:8000/v1"], "--upstream-url / LLM_UPSTREAM_URL"),
        (
            ["--backend", "openai", "--upstream-url", "http://h/v1", "--upstream-read-timeout-s", "0"],
            "--upstream-read-timeout-s / LLM_UPSTREAM_READ_TIMEOUT_S",
        ),
    ],
)
def test_a_bad_setting_stops_start_up_naming_it(argv, named):
    with pytest.raises(SystemExit) as stopped:
        load_config(LlmConfig, "LLM", argv, environ={})
    assert named in str(stopped.value)


def test_environment_variables_configure_and_flags_win():
    config = load_config(
        LlmConfig, "LLM", ["--max-in-flight", "8"], environ={"LLM_PRESET": "tiny", "LLM_MAX_IN_FLIGHT": "4"}
    )
    assert config.preset == "tiny" and config.max_in_flight == 8 and config.resolved_dtype == "bfloat16"


def test_the_openai_backend_needs_no_model_and_probes_no_ceilings():
    config = load_config(LlmConfig, "LLM", [], environ={"LLM_BACKEND": "openai", "LLM_UPSTREAM_URL": "http://h/v1"})
    assert config.remote and config.probe_ceilings is False  # the upstream's device is not this machine's
    assert LlmConfig().probe_ceilings is True and not LlmConfig().remote


@pytest.mark.parametrize(("prompt", "first", "last"), [(64, 2, 2), (64, 2, 128), (7, 5, 9), (0, 2, 3), (10, 4, 3)])
def test_decode_work_in_closed_form_equals_the_sum_of_its_steps(prompt, first, last):
    shape = ModelShape.from_hf_config(json.loads((PRESETS / "qwen3-0.6b" / "config.json").read_text()), 2, 2)
    steps = [shape._tokens_work(1, prompt + number - 2, 1) for number in range(first, last + 1)]
    work = shape.decode_work(prompt, first, last)
    assert work.flops == sum(step.flops for step in steps)
    assert work.read_bytes == sum(step.read_bytes for step in steps)
