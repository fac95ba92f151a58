"""The TextGenerator RPCs: protos ↔ backend types, validation that names the field at fault, admission.

Also the `Service` the shared runtime serves: it starts the backend once the server is listening.
"""

from __future__ import annotations

import contextlib
import uuid

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
from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings
from voiceagent.serving.info import info_response
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

CHAT_ROLES = ("system", "user", "assistant", "tool")
FINISH_REASONS = {
    "stop": llm_pb2.FINISH_REASON_STOP,
    "length": llm_pb2.FINISH_REASON_LENGTH,
    "abort": llm_pb2.FINISH_REASON_ABORT,
}


def to_sampling(proto: llm_pb2.SamplingParams) -> Sampling:
    if proto.max_tokens <= 0:
        raise InvalidRequest("sampling.max_tokens", f"must be > 0, got {proto.max_tokens}")
    temperature = proto.temperature if proto.HasField("temperature") else 1.0
    if not temperature >= 0:  # also catches NaN
        raise InvalidRequest("sampling.temperature", f"must be >= 0, got {temperature}")
    top_p = proto.top_p if proto.HasField("top_p") else 1.0
    if not 0 < top_p <= 1:
        raise InvalidRequest("sampling.top_p", f"must be in (0, 1], got {top_p}")
    for index, stop in enumerate(proto.stop):
        if not stop:
            raise InvalidRequest(f"sampling.stop[{index}]", "must not be empty")
    return Sampling(
        max_tokens=proto.max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=proto.seed if proto.HasField("seed") else None,
        stop=tuple(proto.stop),
        ignore_eos=proto.ignore_eos,
    )


def to_prompt(request: llm_pb2.GenerateRequest, vocab_size: int):
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequest("prompt", "set one of text, chat, token_ids")
    if kind == "text":
        if not request.text:
            raise InvalidRequest("prompt.text", "is empty")
        return request.text
    if kind == "chat":
        if not request.chat.messages:
            raise InvalidRequest("prompt.chat.messages", "is empty")
        for index, message in enumerate(request.chat.messages):
            if message.role not in CHAT_ROLES:
                raise InvalidRequest(
                    f"prompt.chat.messages[{index}].role", f"must be one of {list(CHAT_ROLES)}, got {message.role!r}"
                )
        return tuple(ChatTurn(message.role, message.content) for message in request.chat.messages)
    ids = request.token_ids.ids
    if not ids:
        raise InvalidRequest("prompt.token_ids", "is empty")
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
                ),
            )
        )
    return response


class LlmService(llm_pb2_grpc.TextGeneratorServicer):
    name = "llm"
    service_names = ("voiceagent.v1.TextGenerator",)
    methods = ("Generate", "GetInfo")

    def __init__(self, config: LlmConfig, generator: TextGenerator | None = None):
        self.config = config
        self.dtype = config.resolved_dtype
        if generator is None:
            from services.llm.backends import load_backend

            generator = load_backend(config)
        self.generator = generator
        self.ceilings: DeviceCeilings = UNMEASURED
        self.ready = False
        self.in_flight = 0

    def add_to_server(self, server: grpc.aio.Server) -> None:
        llm_pb2_grpc.add_TextGeneratorServicer_to_server(self, server)

    async def start(self, ceilings: DeviceCeilings) -> None:
        # A remote engine's device is not this machine's: its ceilings stay unmeasured (the config skips the probe).
        self.ceilings = UNMEASURED if self.config.remote else ceilings
        await self.generator.start()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        await self.generator.stop()

    async def Generate(self, request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is still loading")
        try:
            generation = GenerationRequest(
                request_id=request.request_id or uuid.uuid4().hex,
                prompt=to_prompt(request, self.generator.vocab_size),
                sampling=to_sampling(request.sampling),
            )
        except InvalidRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        if self.in_flight >= self.config.max_in_flight:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"max_in_flight: {self.in_flight} requests in flight, the limit is {self.config.max_in_flight}",
            )
        self.in_flight += 1
        try:
            # aclosing: a cancelled call closes the backend's stream at once, which aborts the engine request.
            async with contextlib.aclosing(self.generator.generate(generation)) as deltas:
                async for delta in deltas:
                    yield to_response(generation.request_id, delta)
        except InvalidRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except EngineFailure as error:
            await context.abort(grpc.StatusCode[error.status], str(error))
        finally:
            self.in_flight -= 1

    async def GetInfo(self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        if not self.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is still loading")
        limits = {"max_in_flight": self.config.max_in_flight, **self.generator.limits()}
        return info_response(self.name, self.generator.facts(), self.ceilings, limits)
