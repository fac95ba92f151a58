"""The TextGenerator RPCs: protos ↔ backend types, validation that names the field at fault, admission.

Also the `Service` the shared runtime serves: it starts the backend once the server is listening.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path

import grpc

from services.llm.backend import (
    ChatTurn,
    EngineFailure,
    GenerationRequest,
    InvalidRequest,
    Sampling,
    TextGenerator,
    TokenDelta,
)
from services.llm.config import LlmConfig
from voiceagent.serving.admission import Admission
from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings
from voiceagent.serving.info import info_response
from voiceagent.serving.request_ids import request_id
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_TEMPERATURE = 2.0  # vLLM's own bound
SEED_RANGE = (0, (1 << 32) - 1)  # vLLM seeds its generators with 32 bits: seeds 2**32 apart sampled alike
# Each stop string is searched for in every new piece of text: many or long ones cost every step of the request.
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 1000
MAX_MESSAGE_BYTES = 64 << 20
REST_OF_REQUEST_BYTES = 1 << 20  # request id, sampling (stop strings) and framing, beside a prompt at its limit
# Before the engine loads, max_prompt_bytes is bounded with this many bytes per token: twice Qwen3's longest token
# (128 bytes). The gRPC receive limit is set from it (message_limits), the exact bound once the tokenizer is read.
TOKEN_BYTES_BOUND = 256

log = logging.getLogger(__name__)
FIELDS = {1: "request_id", 2: "prompt.text", 3: "prompt.chat", 4: "prompt.token_ids", 5: "sampling"}
FINISH_REASONS = {
    "stop": llm_pb2.FINISH_REASON_STOP,
    "length": llm_pb2.FINISH_REASON_LENGTH,
    "abort": llm_pb2.FINISH_REASON_ABORT,
}


def to_sampling(proto: llm_pb2.SamplingParams, max_model_len: int = 0) -> Sampling:
    """The request's sampling, checked against what the engine accepts (and `max_model_len` when known)."""
    if proto.max_tokens <= 0:
        raise InvalidRequest("sampling.max_tokens", f"must be > 0, got {proto.max_tokens}")
    if max_model_len and proto.max_tokens >= max_model_len:  # refused before the prompt is tokenised
        raise InvalidRequest(
            "sampling.max_tokens",
            f"{proto.max_tokens} leaves no room for a prompt within the model's max length of {max_model_len} tokens",
        )
    temperature = proto.temperature if proto.HasField("temperature") else 1.0
    if not 0 <= temperature <= MAX_TEMPERATURE:  # also catches NaN
        raise InvalidRequest("sampling.temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {temperature}")
    top_p = proto.top_p if proto.HasField("top_p") else 1.0
    if not 0 < top_p <= 1:
        raise InvalidRequest("sampling.top_p", f"must be in (0, 1], got {top_p}")
    if proto.HasField("seed") and not SEED_RANGE[0] <= proto.seed <= SEED_RANGE[1]:
        raise InvalidRequest(
            "sampling.seed", f"must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (the engine seeds with 32 bits), "
            f"got {proto.seed}"
        )  # fmt: skip
    if len(proto.stop) > MAX_STOP_STRINGS:
        raise InvalidRequest("sampling.stop", f"{len(proto.stop)} stop strings, more than {MAX_STOP_STRINGS}")
    for index, stop in enumerate(proto.stop):
        if not stop:
            raise InvalidRequest(f"sampling.stop[{index}]", "must not be empty")
        if len(stop) > MAX_STOP_CHARS:
            raise InvalidRequest(f"sampling.stop[{index}]", f"{len(stop)} characters, more than {MAX_STOP_CHARS}")
    return Sampling(
        max_tokens=proto.max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=proto.seed if proto.HasField("seed") else None,
        stop=tuple(proto.stop),
        ignore_eos=proto.ignore_eos,
    )


@dataclasses.dataclass(frozen=True)
class PromptLimits:
    """What a prompt may be, checked before any tokenising: cheap length checks, not model work."""

    vocab_size: int
    max_model_len: int  # tokens
    max_prompt_bytes: int  # UTF-8 bytes of text (or of chat contents, summed)


def _check_bytes(field: str, text: str, used: int, limits: PromptLimits) -> int:
    """`used` + the UTF-8 length of `text`; InvalidRequest once past max_prompt_bytes. A character is at
    least one byte, so a text longer in characters than the limit is rejected without encoding it."""
    limit = limits.max_prompt_bytes
    size = used + len(text) if used + len(text) > limit else used + len(text.encode("utf-8"))
    if size > limit:
        raise InvalidRequest(
            field,
            f"{size} bytes or more exceed max_prompt_bytes {limit} (what max_model_len {limits.max_model_len} "
            "tokens can hold); shorten the prompt",
        )
    return size


def _largest_field(raw: bytes) -> tuple[str, int]:
    """The GenerateRequest field with the most bytes on the wire and their count, read from the length prefixes
    alone (nothing is copied or decoded); ("request", len(raw)) when the bytes are not a well-formed message."""
    position, largest = 0, ("request", 0)

    def varint() -> int:
        nonlocal position
        value = shift = 0
        while True:
            byte = raw[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    try:
        while position < len(raw):
            key = varint()
            wire_type, size = key & 7, {0: 0, 1: 8, 5: 4}.get(key & 7)
            if wire_type == 0:
                varint()
            elif wire_type == 2:
                size = varint()
            elif size is None:
                raise ValueError(wire_type)
            position += size
            if size > largest[1]:
                largest = (FIELDS.get(key >> 3, f"field {key >> 3}"), size)
    except (IndexError, ValueError):
        return "request", len(raw)
    return largest


class OversizedRequest:
    """A GenerateRequest larger than any legal one, left unparsed: parsing and decoding a 32 MB prompt held the
    event loop ~10 ms (every stream's tokens wait meanwhile); Generate refuses it naming the limit."""

    def __init__(self, raw: bytes, limits: PromptLimits):
        field, size = _largest_field(raw)
        self.reason = (
            f"{field}: {size} bytes in a request of {len(raw)} bytes, more than a legal one holds: max_prompt_bytes "
            f"{limits.max_prompt_bytes} (what max_model_len {limits.max_model_len} tokens can hold) + "
            f"{REST_OF_REQUEST_BYTES >> 20} MiB for the rest; shorten {field}"
        )


def to_prompt(request: llm_pb2.GenerateRequest, limits: PromptLimits):
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequest("prompt", "set one of text, chat, token_ids")
    if kind == "text":
        if not request.text:
            raise InvalidRequest("prompt.text", "is empty")
        _check_bytes("prompt.text", request.text, 0, limits)
        return request.text
    if kind == "chat":
        if not request.chat.messages:
            raise InvalidRequest("prompt.chat.messages", "is empty")
        if limits.max_model_len and len(request.chat.messages) > limits.max_model_len:  # each is a token or more
            raise InvalidRequest(
                "prompt.chat.messages",
                f"{len(request.chat.messages)} messages cannot fit the model's max length of {limits.max_model_len} "
                "tokens (the chat template marks each with tokens of its own)",
            )
        used = 0
        for index, message in enumerate(request.chat.messages):
            if message.role not in CHAT_ROLES:
                raise InvalidRequest(
                    f"prompt.chat.messages[{index}].role", f"must be one of {list(CHAT_ROLES)}, got {message.role!r}"
                )
            used = _check_bytes(f"prompt.chat.messages[{index}].content", message.content, used, limits)
        return tuple(ChatTurn(message.role, message.content) for message in request.chat.messages)
    ids = request.token_ids.ids
    vocab_size = limits.vocab_size
    if not ids:
        raise InvalidRequest("prompt.token_ids", "is empty")
    if limits.max_model_len and len(ids) > limits.max_model_len:
        raise InvalidRequest(
            "prompt.token_ids", f"{len(ids)} ids exceed max_model_len {limits.max_model_len}; shorten the prompt"
        )
    largest = max(ids)
    if largest >= vocab_size:
        index = list(ids).index(largest)
        raise InvalidRequest(f"prompt.token_ids[{index}]", f"{largest} is outside the vocabulary (0..{vocab_size - 1})")
    return tuple(ids)


def to_response(request_id: str, delta: TokenDelta) -> llm_pb2.GenerateResponse:
    response = llm_pb2.GenerateResponse(request_id=request_id, text=delta.text, token_ids=delta.token_ids)
    done = delta.completion
    if done is not None:
        timings = done.timings
        response.completion.CopyFrom(
            llm_pb2.Completion(
                finish_reason=FINISH_REASONS.get(done.finish_reason, llm_pb2.FINISH_REASON_UNSPECIFIED),
                stop=done.stop,
                usage=llm_pb2.Usage(
                    prompt_tokens=done.prompt_tokens,
                    completion_tokens=done.completion_tokens,
                    cached_tokens=done.cached_tokens,
                ),
                timings=llm_pb2.GenerateTimings(
                    queue_s=timings.queue_s,
                    time_to_first_token_s=timings.time_to_first_token_s,
                    decode_s=timings.decode_s,
                    e2e_s=timings.e2e_s,
                    engine_decode_s=timings.engine_decode_s,
                ),
            )
        )
    return response


class LlmService(llm_pb2_grpc.TextGeneratorServicer):
    name = "llm"
    service_names = ("voiceagent.v1.TextGenerator",)
    methods = ("Generate", "GetInfo")

    def __init__(self, config: LlmConfig, generator: TextGenerator | None = None, admission: Admission | None = None):
        self.config = config
        self.dtype = config.resolved_dtype
        if generator is None:
            from services.llm.backends import load_backend

            generator = load_backend(config)
        self.generator = generator
        self.ceilings: DeviceCeilings = UNMEASURED
        self.ready = False
        self.admission = admission or Admission(config.max_in_flight)  # shared by a pod's front ends
        self.prompt_limits = PromptLimits(0, 0, 0)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """The generated stubs' handlers, but Generate's requests pass `_parse_generate` (refused unparsed when
        larger than a legal one)."""
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.Generate, self._parse_generate, llm_pb2.GenerateResponse.SerializeToString
            ),
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self.GetInfo, common_pb2.InfoRequest.FromString, common_pb2.InfoResponse.SerializeToString
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(self.service_names[0], handlers),))
        server.add_registered_method_handlers(self.service_names[0], handlers)

    def _parse_generate(self, raw: bytes) -> llm_pb2.GenerateRequest | OversizedRequest:
        """gRPC calls this on the event loop with the request's bytes: one larger than any legal request is not
        parsed (OversizedRequest); the rest are."""
        limits = self.prompt_limits
        if limits.max_prompt_bytes and len(raw) > limits.max_prompt_bytes + REST_OF_REQUEST_BYTES:
            return OversizedRequest(raw, limits)
        return llm_pb2.GenerateRequest.FromString(raw)

    async def start(self, ceilings: DeviceCeilings) -> None:
        # A remote engine's device is not this machine's: its ceilings stay unmeasured (the config skips the probe).
        self.ceilings = UNMEASURED if self.config.remote else ceilings
        await self.generator.start()
        generator = self.generator
        # A backend that cannot say how many bytes a token holds (0) leaves the bound to max_prompt_bytes alone.
        derived = generator.max_model_len * getattr(generator, "longest_token_bytes", 0)
        self.prompt_limits = PromptLimits(
            generator.vocab_size,
            generator.max_model_len,
            self.config.max_prompt_bytes or derived or MAX_MESSAGE_BYTES,
        )
        largest_legal = self.prompt_limits.max_prompt_bytes + REST_OF_REQUEST_BYTES
        known = self.prompt_limits.max_prompt_bytes < MAX_MESSAGE_BYTES
        if known and largest_legal > getattr(self, "max_receive_bytes", MAX_MESSAGE_BYTES):
            log.warning("a legal request may reach %d bytes, past the gRPC receive limit %d: set --max-prompt-bytes",
                        largest_legal, self.max_receive_bytes)  # fmt: skip
        self.ready = True

    @property
    def failure(self) -> str:
        """Why the engine is gone ("" while it runs): the runtime then exits non-zero after draining."""
        return getattr(self.generator, "failure", "")

    def engine_lost(self, why: str) -> None:
        """A supervisor saw the engine die (several front ends share it): fail open streams, then exit."""
        lost = getattr(self.generator, "engine_lost", None)
        if lost is not None:
            lost(why)

    def message_limits(self) -> tuple[int, int]:
        """gRPC receive and send limits in bytes, fixed before the engine loads. Receive: twice the largest legal
        request (max_prompt_bytes, bounded with TOKEN_BYTES_BOUND per token of max_model_len, + 1 MiB for the
        rest), as the ASR and TTS services do: a request somewhat over it still reaches the check that names
        max_prompt_bytes; a larger one gets gRPC's own RESOURCE_EXHAUSTED ("Received message larger than max")
        before our process copies it. gRPC's copy of a 32 MB message into bytes held the event loop 30-300 ms on
        this machine, every stream's tokens waiting (results/cpu/README.md). 64 MiB where no bound is known
        before start (a remote engine, a model named by its hub id). Send: deltas are a few tokens."""
        self.max_receive_bytes = MAX_MESSAGE_BYTES
        if bound := self.config.max_prompt_bytes or self._max_model_len_before_start() * TOKEN_BYTES_BOUND:
            self.max_receive_bytes = min(MAX_MESSAGE_BYTES, 2 * (bound + REST_OF_REQUEST_BYTES))
        return self.max_receive_bytes, 4 << 20

    def _max_model_len_before_start(self) -> int:
        """max_model_len as configured, or the model's own from its config.json; 0 where neither is known here."""
        config = self.config
        if config.remote:
            return 0
        if config.max_model_len:
            return config.max_model_len
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            facts = json.loads((Path(config.model_dir) / "config.json").read_text())
            return int(facts.get("text_config", facts)["max_position_embeddings"])
        return 0

    async def stop(self) -> None:
        self.ready = False
        await self.generator.stop()

    async def Generate(self, request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        if isinstance(request, OversizedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is still loading")
        try:
            generation = GenerationRequest(
                request_id=request_id(request.request_id, "request_id"),
                prompt=to_prompt(request, self.prompt_limits),
                sampling=to_sampling(request.sampling, self.prompt_limits.max_model_len),
            )
            # Tokenised and checked against the model before admission: a prompt the model refuses never holds a
            # place in max_in_flight (two clients sending such prompts locked a good one out of a limit of 2).
            generation = await self.generator.prepare(generation)
        except InvalidRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if not self.admission.try_enter():
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"max_in_flight: {self.admission.held} requests in flight, the limit is {self.config.max_in_flight}",
            )
        try:
            # aclosing: a cancelled call closes the backend's stream at once, which aborts the engine request.
            async with contextlib.aclosing(self.generator.generate(generation)) as deltas:
                async for delta in deltas:
                    yield to_response(generation.request_id, delta)
        except InvalidRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except EngineFailure as error:  # EngineUnavailable (the engine died) among them
            await context.abort(grpc.StatusCode[error.status], str(error))
        finally:
            self.admission.leave()

    async def GetInfo(self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is still loading")
        limits = {
            "max_in_flight": self.config.max_in_flight,
            "max_prompt_bytes": self.prompt_limits.max_prompt_bytes,
            "frontends": self.config.frontends,
            "stream_interval": self.config.stream_interval,
            **self.generator.limits(),
        }
        return info_response(self.name, self.generator.facts(), self.ceilings, limits)
