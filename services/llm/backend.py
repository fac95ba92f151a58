"""The engine boundary of the LLM service: one streaming method and the plain types that cross it.

The servicer turns protos into a `GenerationRequest`, checks what it can without the model, and streams
the `TokenDelta`s a backend yields back as protos. Backends (backends/<engine>.py) do the rest: tokenise,
apply the chat template, check the prompt against the model's length, generate, abort on cancellation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

# The errors a backend raises are the services' shared vocabulary, named here as part of this boundary.
from voiceagent.serving.errors import EngineFailure, EngineUnavailable, InvalidRequest
from voiceagent.serving.info import ModelFacts

__all__ = ["EngineFailure", "EngineUnavailable", "InvalidRequest"]  # and the types below

FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str


# Raw text, chat turns (the template is applied) or token ids.
Prompt = str | tuple[ChatTurn, ...] | tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: Prompt
    sampling: Sampling
    received_at: float = 0.0  # time.perf_counter() when a backend's `prepare` began with it (0: not prepared)


@dataclasses.dataclass(frozen=True)
class Timings:
    queue_s: float  # queued in the engine -> first scheduled
    time_to_first_token_s: float  # received by the backend -> first token
    decode_s: float  # first token -> last token
    e2e_s: float  # received -> finished
    engine_decode_s: float = 0.0  # first token -> last token in the engine itself, where it says (vLLM's core)


@dataclasses.dataclass(frozen=True)
class Completion:
    finish_reason: str  # one of FINISH_REASONS
    stop: str  # the stop string that matched, if any
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    timings: Timings


@dataclasses.dataclass(frozen=True)
class TokenDelta:
    """New text and token ids since the previous delta; the last delta of a request carries `completion`."""

    text: str
    token_ids: tuple[int, ...]
    completion: Completion | None = None


class TextGenerator(Protocol):
    """A chat LLM engine."""

    vocab_size: int  # token ids must be below this
    max_model_len: int  # prompt + completion tokens
    # The most prompt bytes one token can stand for (its longest vocabulary entry): max_model_len of them bound
    # the bytes a prompt that fits can have, so a larger one is rejected without tokenising it.
    longest_token_bytes: int
    failure: str  # why the engine is gone ("" while it runs); the service then drains and exits non-zero

    async def start(self) -> None:
        """Load the model and warm the engine up."""

    async def stop(self) -> None:
        """Release the engine."""

    def facts(self) -> ModelFacts: ...

    def limits(self) -> Mapping[str, float]: ...

    async def prepare(self, request: GenerationRequest) -> GenerationRequest:
        """What the model has to check before the request is admitted, done off the event loop: tokenise it
        (with the chat template) and check it against the model's length; the request returned carries its
        prompt as token ids, ready for `generate`. Raises InvalidRequest. The servicer calls it before taking a
        place in max_in_flight, so a prompt the model refuses never holds one a good request needs. A backend
        that cannot check without its engine (a remote one) returns the request as it is."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        """Stream deltas as the engine produces them. Raises InvalidRequest before the first delta when the
        model cannot serve the request, EngineFailure when the engine fails it (EngineUnavailable when it died).
        Tokenising runs off the event loop. Closing the iterator early aborts the engine request."""
        ...
