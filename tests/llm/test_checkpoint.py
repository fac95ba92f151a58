"""A real checkpoint loads for real: a small random Qwen3 saved by transformers (float32, tokenizer files
beside it; the `checkpoint` fixture) is served by our service, and vLLM's greedy tokens equal transformers'
own greedy tokens on the same checkpoint and prompt."""

from __future__ import annotations

import grpc
import torch

from tests.llm.conftest import generate
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

CONVERSATION = [{"role": "user", "content": "Book me a table for two at eight, please."}]
NEW_TOKENS = 24


def test_greedy_tokens_equal_transformers_greedy_tokens(checkpoint, checkpoint_llm):
    _, model, tokenizer = checkpoint
    prompt_ids = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=None
        )
    expected = output[0, len(prompt_ids) :].tolist()

    chat = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(**turn) for turn in CONVERSATION])
    with grpc.insecure_channel(checkpoint_llm.address) as channel:
        stub = llm_pb2_grpc.TextGeneratorStub(channel)
        responses = generate(stub, chat=chat, sampling={"max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        info = stub.GetInfo(common_pb2.InfoRequest(), timeout=10)
    served = [token for response in responses for token in response.token_ids]
    assert responses[-1].completion.usage.prompt_tokens == len(prompt_ids)
    # transformers stops at end-of-sequence; up to there (and at least 16 tokens) the two engines agree.
    assert len(expected) >= 16
    assert served[: len(expected)] == expected

    assert info.model.preset == "checkpoint" and not info.model.synthetic_weights
    assert info.model.dtype == "float32"
    assert info.model.parameter_count == model.num_parameters()
