"""Generation over a real channel against the real engine (tiny preset): streaming, prompts, sampling."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from services.llm.config import bundled_tokenizer_dir
from tests.llm.conftest import generate
from voiceagent.v1 import llm_pb2

CHAT = [("system", "You are a helpful voice assistant."), ("user", "What's the weather like in Lisbon?")]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(bundled_tokenizer_dir())


def chat(*turns: tuple[str, str]) -> llm_pb2.Chat:
    return llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role=role, content=content) for role, content in turns])


def ids_of(responses) -> list[int]:
    return [token for response in responses for token in response.token_ids]


def text_of(responses) -> str:
    return "".join(response.text for response in responses)


def test_streamed_deltas_concatenate_to_the_final_text(stub, tokenizer):
    responses = generate(
        stub, request_id="turn-1", chat=chat(*CHAT), sampling={"max_tokens": 24, "temperature": 0, "ignore_eos": True}
    )
    assert len(responses) > 1, "tokens must stream as they are produced, not arrive in one message"
    assert all(response.request_id == "turn-1" for response in responses)
    assert [r.HasField("completion") for r in responses] == [False] * (len(responses) - 1) + [True]
    ids = ids_of(responses)
    assert len(ids) == 24
    assert text_of(responses) == tokenizer.decode(ids, skip_special_tokens=True)
    completion = responses[-1].completion
    assert completion.finish_reason == llm_pb2.FINISH_REASON_LENGTH
    assert completion.usage.completion_tokens == 24
    # The chat template was applied: the prompt is the templated conversation, generation prompt included.
    messages = [{"role": role, "content": content} for role, content in CHAT]
    templated = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert completion.usage.prompt_tokens == len(tokenizer.encode(templated, add_special_tokens=False))
    timings = completion.timings
    assert 0 < timings.time_to_first_token_s <= timings.e2e_s
    assert timings.decode_s > 0 and timings.queue_s >= 0
    # the same span as vLLM's engine core stamped it: there, not counting the way to the front end
    assert 0 < timings.engine_decode_s <= timings.decode_s + 0.05


def test_text_and_token_id_prompts_are_the_same_prompt(stub, tokenizer):
    text = "The quick brown fox jumps over the lazy dog."
    greedy = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    from_text = generate(stub, text=text, sampling=greedy)
    from_ids = generate(stub, token_ids=llm_pb2.TokenIds(ids=tokenizer.encode(text)), sampling=greedy)
    assert ids_of(from_text) == ids_of(from_ids)
    assert from_text[-1].completion.usage.prompt_tokens == len(tokenizer.encode(text))


def test_greedy_and_seeded_sampling_are_deterministic(stub):
    prompt = {"text": "Once upon a time"}
    greedy = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
    assert ids_of(generate(stub, **prompt, sampling=greedy)) == ids_of(generate(stub, **prompt, sampling=greedy))
    seeded = {"max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7, "ignore_eos": True}
    first = ids_of(generate(stub, **prompt, sampling=seeded))
    assert first == ids_of(generate(stub, **prompt, sampling=seeded))
    # Random weights spread probability over the whole vocabulary: another seed samples other tokens.
    assert first != ids_of(generate(stub, **prompt, sampling={**seeded, "seed": 8}))


def test_a_stop_string_ends_the_stream_before_it(stub):
    greedy = {"max_tokens": 32, "temperature": 0, "ignore_eos": True}
    full = text_of(generate(stub, text="Count with me:", sampling=greedy))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop, f"greedy text too short to cut: {full!r}"
    responses = generate(stub, text="Count with me:", sampling={**greedy, "stop": [stop]})
    assert text_of(responses) == full[: full.index(stop)]
    completion = responses[-1].completion
    assert completion.finish_reason == llm_pb2.FINISH_REASON_STOP
    assert completion.stop == stop


def test_max_tokens_bounds_the_completion(stub):
    for max_tokens in (1, 5):
        responses = generate(stub, text="Hi", sampling={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        assert len(ids_of(responses)) == max_tokens
        assert responses[-1].completion.usage.completion_tokens == max_tokens
