"""SpeechSynthesizer over gRPC: protos ↔ SynthesisRequest / AudioPiece, input validation, admission errors;
also the `Service` the shared runtime starts and stops. Per-request metrics are recorded in metrics.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
from collections.abc import AsyncIterator

import grpc

from services.tts.backend import SpeechBackend, SynthesisRequest
from services.tts.config import (
    CFG_RANGE,
    NATIVE_SAMPLE_RATE_HZ,
    OUTPUT_SAMPLE_RATES_HZ,
    TIMESTEPS_RANGE,
    TtsConfig,
    closed_range,
)
from services.tts.metrics import measure_synthesis
from services.tts.phrases import PhraseSplitter, speakable
from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings
from voiceagent.serving.errors import EngineUnavailable, InvalidRequest, ServiceError, StreamIdle, abort
from voiceagent.serving.idle import next_message
from voiceagent.serving.info import info_response
from voiceagent.serving.request_ids import request_id
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

_ENCODINGS = (common_pb2.AUDIO_ENCODING_UNSPECIFIED, common_pb2.AUDIO_ENCODING_PCM16, common_pb2.AUDIO_ENCODING_FLOAT32)


class TtsService(tts_pb2_grpc.SpeechSynthesizerServicer):
    name = "tts"
    service_names = ("voiceagent.v1.SpeechSynthesizer",)
    methods = ("Synthesize", "StreamingSynthesize", "GetInfo")

    def __init__(self, config: TtsConfig, backend: SpeechBackend | None = None):
        self.config = config
        if backend is None:
            from services.tts.backends import load_backend

            backend = load_backend(config)
        self.backend = backend
        self.dtype = config.resolved_dtype  # the device ceilings' matmul peak is measured in it
        self.ceilings: DeviceCeilings = UNMEASURED
        self.ready = False

    # -- runtime lifecycle -------------------------------------------------
    def add_to_server(self, server: grpc.aio.Server) -> None:
        tts_pb2_grpc.add_SpeechSynthesizerServicer_to_server(self, server)

    @property
    def failure(self) -> str:
        """Why the engine is gone ("" while it runs): the runtime then exits non-zero after draining, so that a
        restart policy restarts the service (the batched engine; the pool replaces a dead worker itself)."""
        return getattr(self.backend, "failure", "")

    def message_limits(self) -> tuple[int, int]:
        """gRPC receive and send limits in bytes. Receive: 1 MiB plus 16 bytes per allowed character (4 times
        the longest legal text in UTF-8), so an oversized text still gets the INVALID_ARGUMENT naming
        max_text_chars. Send: one audio chunk is one 160 ms patch (30 KB of float32 at 48 kHz)."""
        return (1 << 20) + 16 * self.config.max_text_chars, 4 << 20

    async def start(self, ceilings: DeviceCeilings) -> None:
        self.ceilings = ceilings
        await self.backend.start()
        self.ready = True

    async def _require_ready(self, context) -> None:
        if not self.ready:  # the port is open while the model loads; health says NOT_SERVING meanwhile
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry when SERVING")

    async def stop(self) -> None:
        await self.backend.stop()

    # -- validation --------------------------------------------------------
    def _check_text_length(self, chars: int) -> None:
        if chars > self.config.max_text_chars:
            raise InvalidRequest("text", f"{chars} characters exceed max_text_chars {self.config.max_text_chars}")

    def _check_fits(self, text: str, where: str = "text") -> None:
        """The model can hold `text` as one segment (services/tts/context.py); checked before it waits for a slot."""
        budget = getattr(self.backend, "context", None)
        if budget is not None and (problem := budget.problem(text)):
            raise InvalidRequest(where, problem)

    def _request(self, config: tts_pb2.SynthesisConfig, segments: AsyncIterator[str]) -> SynthesisRequest:
        if config.sample_rate_hz not in (0, *OUTPUT_SAMPLE_RATES_HZ):
            raise InvalidRequest(
                "config.sample_rate_hz",
                f"{config.sample_rate_hz} not supported; use 0 (native) or {OUTPUT_SAMPLE_RATES_HZ}",
            )
        if config.encoding not in _ENCODINGS:
            raise InvalidRequest("config.encoding", f"{config.encoding} is not PCM16 or FLOAT32")
        if config.voice:
            raise InvalidRequest("config.voice", "only the default voice (empty) is served")
        timesteps = self.config.inference_timesteps
        if config.HasField("inference_timesteps"):
            timesteps = config.inference_timesteps
            if not TIMESTEPS_RANGE[0] <= timesteps <= TIMESTEPS_RANGE[1]:
                raise InvalidRequest(
                    "config.inference_timesteps", f"must be in {closed_range(TIMESTEPS_RANGE)}, got {timesteps}"
                )
        cfg_value = self.config.cfg_value
        if config.HasField("cfg_value"):
            cfg_value = config.cfg_value
            if not (math.isfinite(cfg_value) and CFG_RANGE[0] <= cfg_value <= CFG_RANGE[1]):
                raise InvalidRequest("config.cfg_value", f"must be in {closed_range(CFG_RANGE)}, got {cfg_value}")
        return SynthesisRequest(
            request_id=request_id(config.request_id, "config.request_id"),
            segments=segments,
            sample_rate_hz=config.sample_rate_hz or NATIVE_SAMPLE_RATE_HZ,
            pcm16=config.encoding == common_pb2.AUDIO_ENCODING_PCM16,
            inference_timesteps=timesteps,
            cfg_value=cfg_value,
            seed=config.seed if config.HasField("seed") else secrets.randbits(63),
        )

    # -- RPCs --------------------------------------------------------------
    async def Synthesize(self, request: tts_pb2.SynthesizeRequest, context) -> None:
        async def whole_text():
            yield request.text

        await self._require_ready(context)
        try:
            self._check_text_length(len(request.text))  # first: the length alone, before touching the text
            if not speakable(request.text):
                raise InvalidRequest("text", "must not be empty (it has no letter, digit, mark or symbol to speak)")
            self._check_fits(request.text)  # the whole text is one segment
            synthesis = self._request(request.config, whole_text())
        except InvalidRequest as exc:
            await abort(context, exc)
        await self._send(self._stream("Synthesize", synthesis, context), context)

    async def StreamingSynthesize(self, request_iterator, context) -> None:
        await self._require_ready(context)
        try:
            # InvalidRequest: it does not parse (malformed.py); StreamIdle: nothing came
            first = await next_message(
                aiter(request_iterator), self.config.stream_idle_timeout_s, "send the SynthesisConfig first"
            )
            if first is None or first.WhichOneof("request") != "config":
                raise InvalidRequest("config", "the first message must carry the SynthesisConfig")
            phrases: asyncio.Queue = asyncio.Queue()
            synthesis = self._request(first.config, self._phrases(phrases, self.config.stream_idle_timeout_s))
        except (InvalidRequest, StreamIdle) as exc:
            await abort(context, exc)
        reader = asyncio.create_task(self._read_text(request_iterator, phrases))
        try:
            await self._send(self._stream("StreamingSynthesize", synthesis, context, reader), context)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def GetInfo(self, request, context):
        await self._require_ready(context)
        return info_response(self.name, self.backend.facts(), self.ceilings, self.backend.limits())

    # -- text-in streaming -------------------------------------------------
    async def _read_text(self, request_iterator, phrases: asyncio.Queue) -> None:
        """Cut incoming text into phrases and queue them; an invalid message ends the request with its error."""
        splitter = PhraseSplitter(self.config.phrase_min_chars)
        chars, queued, messages = 0, 0, 0
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("request")
                if kind == "config":
                    raise InvalidRequest("config", "sent twice: every message after the first carries text")
                if kind is None:
                    raise InvalidRequest("request", "a message with neither config nor text set")
                messages += 1
                if messages > self.config.max_text_messages:
                    raise InvalidRequest(
                        "text", f"more than max_text_messages {self.config.max_text_messages} text messages"
                    )
                chars += len(message.text.text)
                self._check_text_length(chars)
                ready = splitter.feed(message.text.text)
                if message.text.flush:
                    ready += splitter.flush()
                queued += self._queue(ready, phrases, queued)
            queued += self._queue(splitter.flush(), phrases, queued)
            if not queued:
                raise InvalidRequest("text", "must not be empty: the stream ended without text")
            phrases.put_nowait(None)
        except Exception as exc:  # ends the RPC: at the next phrase, or at the next audio piece (see _stream)
            phrases.put_nowait(exc)
            raise

    def _queue(self, ready: list[str], phrases: asyncio.Queue, queued: int) -> int:
        """Queue the phrases with something to say (a lone "." or a zero-width space is skipped, not spoken as
        a segment of noise); how many."""
        count = 0
        for phrase in filter(speakable, ready):
            self._check_fits(phrase, f"text (phrase {queued + count})")
            phrases.put_nowait(phrase)
            count += 1
        return count

    @staticmethod
    async def _phrases(phrases: asyncio.Queue, idle_s: float) -> AsyncIterator[str]:
        """The phrases as the engine asks for them; StreamIdle once it has waited `idle_s` for the next (it holds a
        slot meanwhile: a client that stops sending text without half-closing would hold it for ever)."""
        while True:
            try:
                async with asyncio.timeout(idle_s or None):
                    item = await phrases.get()
            except TimeoutError:
                raise StreamIdle(
                    f"no text for {idle_s:g} s while the engine waited for it (stream_idle_timeout_s): send text as "
                    "it comes and half-close the stream at its end"
                ) from None
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    # -- audio out ---------------------------------------------------------
    async def _send(self, chunks: AsyncIterator[tts_pb2.AudioChunk], context) -> None:
        """Write each chunk as the client takes it. A request's slot is free once its text is spoken, while its
        audio waits here for the client: one that takes no chunk for stream_idle_timeout_s is ended OUT_OF_RANGE
        and the audio it left is dropped. Before, clients that never read kept their whole audio in this process
        for as long as they liked, and each freed its slot for the next (~15 MB per 2,000-character request)."""
        idle_s = self.config.stream_idle_timeout_s
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                try:
                    async with asyncio.timeout(idle_s or None):
                        await context.write(chunk)
                except TimeoutError:
                    # Returned, not aborted: the status goes out behind the chunk the client has not taken, and
                    # an abort would wait here for it (with the audio) until the client read or left.
                    context.set_code(grpc.StatusCode.OUT_OF_RANGE)
                    context.set_details(
                        f"the client took no audio for {idle_s:g} s (stream_idle_timeout_s): read it as it comes"
                    )
                    return

    async def _stream(
        self, method: str, request: SynthesisRequest, context, text_reader: asyncio.Task | None = None
    ) -> AsyncIterator[tts_pb2.AudioChunk]:
        def text_error() -> BaseException | None:  # bad text mid-stream stops the phrase being spoken
            return text_reader.exception() if text_reader is not None and text_reader.done() else None

        encoding = common_pb2.AUDIO_ENCODING_PCM16 if request.pcm16 else common_pb2.AUDIO_ENCODING_FLOAT32
        rate = request.sample_rate_hz
        index, offset = 0, 0
        try:
            async with contextlib.aclosing(measure_synthesis(self.backend, request, method, text_error)) as pieces:
                async for piece in pieces if text_reader is None else _until_failed(pieces, text_reader):
                    yield tts_pb2.AudioChunk(
                        request_id=request.request_id,
                        audio=piece.audio,
                        encoding=encoding,
                        sample_rate_hz=rate,
                        chunk_index=index,
                        sample_offset=offset,
                        offset_s=offset / rate,
                        duration_s=piece.samples / rate,
                        segment_index=piece.segment_index,
                        is_last=piece.is_last,
                        queue_s=piece.queue_s if index == 0 else 0.0,
                    )
                    index += 1
                    offset += piece.samples
        except EngineUnavailable as exc:  # the model process died under this request; the pool replaces it
            await abort(context, exc, "; retry")
        except ServiceError as exc:  # QueueFull, InvalidRequest (text read mid-stream)
            await abort(context, exc)
        except RuntimeError as exc:  # a worker failed
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))


async def _until_failed(pieces: AsyncIterator, reader: asyncio.Task) -> AsyncIterator:
    """`pieces`, cut short by the text reader's error the moment it fails: a request still waiting for a slot (or
    for its audio) leaves at once, instead of keeping its queue place and then a slot until its next piece."""
    while not reader.done():
        step = asyncio.ensure_future(anext(pieces))
        await asyncio.wait({step, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():  # the reader ended first: an error ends the request, the text's end changes nothing
            if not reader.cancelled() and (error := reader.exception()) is not None:
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await step
                raise error
            await asyncio.wait({step})
        try:
            piece = step.result()
        except StopAsyncIteration:
            return
        yield piece
    async for piece in pieces:
        yield piece
