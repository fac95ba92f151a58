"""SpeechRecognizer over gRPC: protos ↔ backend types, input validation, admission (max_streams).

Input rules: 16 kHz mono PCM16 or float32 (other rates are rejected, not resampled); the config comes
first; a malformed payload, an unknown encoding or a chunk size the model does not have is
INVALID_ARGUMENT naming the field; more than `max_streams` concurrent streams is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np

from services.asr import metrics
from services.asr.backend import RecognizerBackend, StreamSettings
from services.asr.config import LANGUAGE_TAG, AsrConfig
from voiceagent.serving.admission import Admission
from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings
from voiceagent.serving.errors import EngineFailure, InvalidRequest, QueueFull, ServiceError, abort
from voiceagent.serving.idle import next_message
from voiceagent.serving.info import info_response
from voiceagent.serving.request_ids import request_id
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2

SAMPLE_RATE_HZ = 16000
_SAMPLE_BYTES = {common_pb2.AUDIO_ENCODING_PCM16: 2, common_pb2.AUDIO_ENCODING_FLOAT32: 4}
# Full scale is ±1; float audio overshoots it a little (a gain, a resampler's ringing) and is accepted as it is. Far
# past it is not audio in this convention: PCM16 values sent as FLOAT32, or garbage.
MAX_FLOAT32_MAGNITUDE = 4.0


def decode_audio(payload: bytes, encoding: int) -> np.ndarray:
    """16 kHz mono samples as float32 (full scale ±1); InvalidRequest says what is wrong with a payload."""
    width = _SAMPLE_BYTES[encoding]
    if len(payload) % width:
        name = common_pb2.AudioEncoding.Name(encoding)
        raise InvalidRequest("audio", f"{len(payload)} bytes is not a whole number of {width}-byte {name} samples")
    if encoding == common_pb2.AUDIO_ENCODING_PCM16:
        return np.frombuffer(payload, dtype="<i2").astype(np.float32) / 32768.0
    samples = np.frombuffer(payload, dtype="<f4").astype(np.float32)
    peak = np.abs(samples).max() if samples.size else 0.0
    if not peak <= MAX_FLOAT32_MAGNITUDE:  # NaN fails this too
        raise InvalidRequest(
            "audio",
            f"FLOAT32 samples must be finite and within ±{MAX_FLOAT32_MAGNITUDE:g} (full scale is ±1; found {peak}: "
            "PCM16 values sent as FLOAT32?)",
        )
    return samples


class Backlog:
    """The audio a stream has sent that the engine has not processed yet. Its reader waits while that is over the
    limit, so a client sending faster than the engine steps it is held back by gRPC's flow control instead of
    having the service keep whatever it sends (a probe's 16 MB messages, 500 s of audio each, took the gRPC
    process from 82 MB to 1.4 GB and the engine to 1.7 GB)."""

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.sent_s = self.processed_s = 0.0
        self.progress = asyncio.Event()

    def processed(self, seconds: float) -> None:
        self.processed_s = max(self.processed_s, seconds)
        self.progress.set()

    async def room(self) -> None:
        """Return once the stream's unprocessed audio is within the limit."""
        if self.sent_s - self.processed_s <= self.limit_s:
            return
        started = time.perf_counter()
        while self.sent_s - self.processed_s > self.limit_s:
            self.progress.clear()
            await self.progress.wait()
        metrics.backpressure.inc(time.perf_counter() - started)

    def add(self, samples: int) -> None:
        seconds = samples / SAMPLE_RATE_HZ
        if seconds > self.limit_s:
            raise InvalidRequest(
                "audio", f"{seconds:.1f} s in one message; send at most max_stream_backlog_s {self.limit_s:g} s at once"
            )
        self.sent_s += seconds


class AsrService(asr_pb2_grpc.SpeechRecognizerServicer):
    name = "asr"
    service_names = ("voiceagent.v1.SpeechRecognizer",)
    methods = ("StreamingRecognize", "Recognize", "GetInfo")

    def __init__(
        self,
        config: AsrConfig,
        backend: RecognizerBackend | None = None,
        admission: Admission | None = None,
        offline_admission: Admission | None = None,
    ):
        self.config = config
        self.dtype = config.dtype  # the device ceilings' matmul peak is measured in it
        self.backend = backend
        self.ceilings: DeviceCeilings = UNMEASURED
        # Streams and Recognize calls, each counted for the pod when its front ends share them (frontends.py)
        self.admission = admission or Admission(config.max_streams)
        self.offline_admission = offline_admission or Admission(config.max_offline_requests)
        self.ready = False

    def add_to_server(self, server: grpc.aio.Server) -> None:
        asr_pb2_grpc.add_SpeechRecognizerServicer_to_server(self, server)

    def message_limits(self) -> tuple[int, int]:
        """gRPC receive and send limits in bytes. Receive: twice the longest Recognize clip in float32 plus
        1 MiB, so a clip somewhat over max_offline_audio_s still gets the INVALID_ARGUMENT that names it
        (further over, gRPC's own RESOURCE_EXHAUSTED); streaming pieces are far smaller. Send: transcripts."""
        clip_bytes = int(self.config.max_offline_audio_s * SAMPLE_RATE_HZ * 4)
        return 2 * clip_bytes + (1 << 20), 4 << 20

    @property
    def failure(self) -> str:
        """Why the engine is gone ("" while it runs): the runtime then exits non-zero after draining."""
        return getattr(self.backend, "failure", "")

    async def start(self, ceilings: DeviceCeilings) -> None:
        self.ceilings = ceilings
        if self.backend is None:
            from services.asr.backends import load_backend

            # off the event loop: an in-process backend builds its model here (the engine process in start)
            self.backend = await asyncio.to_thread(load_backend, self.config)
        await self.backend.start()
        self.ready = True

    async def stop(self) -> None:
        if self.backend is not None:
            await self.backend.stop()

    def _settings(self, config: asr_pb2.RecognitionConfig) -> StreamSettings:
        if config.sample_rate_hz != SAMPLE_RATE_HZ:
            raise InvalidRequest(
                "config.sample_rate_hz",
                f"{config.sample_rate_hz} Hz is not supported; "
                f"send {SAMPLE_RATE_HZ} Hz mono audio (no resampling is done)",
            )
        if config.encoding not in _SAMPLE_BYTES:
            raise InvalidRequest(
                "config.encoding", f"{config.encoding} is not AUDIO_ENCODING_PCM16 or AUDIO_ENCODING_FLOAT32"
            )
        self._check_language(config.language_code)
        choices = self.backend.chunk_ms_choices
        if config.chunk_ms not in choices:
            raise InvalidRequest("config.chunk_ms", f"{config.chunk_ms} is not one of {list(choices)} ms")
        return StreamSettings(
            request_id(config.request_id, "config.request_id"), config.chunk_ms, config.interim_results
        )

    def _check_language(self, code: str) -> None:
        """Empty, or a BCP-47 tag of a language the model transcribes: a model asked for a language it does not
        have would still answer, in its own (an English model given German audio writes English-looking words)."""
        if not code:
            return
        languages = self.config.language_set
        if len(code) > 35 or not LANGUAGE_TAG.fullmatch(code):
            raise InvalidRequest("config.language_code", f"{code[:40]!r} is not a BCP-47 language tag such as en-US")
        if code.split("-")[0].lower() not in languages:
            raise InvalidRequest(
                "config.language_code",
                f"{code} is not a language this model transcribes ({', '.join(sorted(languages))}); "
                "leave it empty for the model's own",
            )

    def _check_offline_length(self, payload_bytes: int, encoding: int) -> None:
        """Before decoding: a clip longer than max_offline_audio_s is refused on its byte count alone."""
        seconds = payload_bytes / _SAMPLE_BYTES[encoding] / SAMPLE_RATE_HZ
        if seconds > self.config.max_offline_audio_s:
            raise InvalidRequest(
                "audio",
                f"{seconds:.1f} s exceeds max_offline_audio_s {self.config.max_offline_audio_s:g} s; "
                "split the clip or stream it with StreamingRecognize",
            )

    async def _next(self, requests: AsyncIterator):
        """The stream's next message (None at its end); StreamIdle once none came for stream_idle_timeout_s."""
        hint = "send audio in real time, silence included, or half-close the stream"
        return await next_message(requests, self.config.stream_idle_timeout_s, hint)

    async def _audio(self, requests: AsyncIterator, encoding: int, backlog: Backlog) -> AsyncIterator[np.ndarray]:
        while True:
            await backlog.room()  # the next message is read once the engine has caught up enough
            if (request := await self._next(requests)) is None:
                return
            kind = request.WhichOneof("request")
            if kind == "config":
                raise InvalidRequest("config", "only the first message may be a config; the rest must be audio")
            if kind is None:
                raise InvalidRequest("request", "a message with neither config nor audio set")
            if request.audio:
                samples = decode_audio(request.audio, encoding)
                backlog.add(len(samples))
                yield samples

    async def _require_ready(self, context) -> None:
        if not self.ready:  # the port is open while the model loads; health says NOT_SERVING meanwhile
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry when SERVING")

    async def StreamingRecognize(self, request_iterator, context):
        await self._require_ready(context)
        requests = aiter(request_iterator)
        try:
            first = await self._next(requests)
        except ServiceError as exc:  # idle, or a message that does not parse (voiceagent/serving/malformed.py)
            await abort(context, exc)
        if first is None or first.WhichOneof("request") != "config":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "config must come first: send a config message")
        try:
            settings = self._settings(first.config)
        except InvalidRequest as exc:
            await abort(context, exc)
        if not self.admission.try_enter():
            await abort(context, QueueFull(f"max_streams: all {self.config.max_streams} streams are busy; retry later"))
        backlog = Backlog(self.config.max_stream_backlog_s)
        try:
            # Every update comes here, interim ones too: they tell the backlog what the engine has processed.
            updates = self.backend.recognize(settings, self._audio(requests, first.config.encoding, backlog))
            async for update in updates:
                backlog.processed(update.audio_processed_s)
                if not (settings.interim_results or update.is_final):
                    continue
                yield asr_pb2.StreamingRecognizeResponse(
                    request_id=settings.request_id,
                    transcript=update.transcript,
                    is_final=update.is_final,
                    audio_processed_s=update.audio_processed_s,
                    processing_latency_s=update.processing_latency_s,
                    chunk_index=update.chunk_index,
                    chunk_ms=settings.chunk_ms,
                    encoder_frames=update.encoder_frames,
                    batch_size=update.batch_size,
                )
        except ServiceError as exc:  # bad or idle input, the engine gone
            await abort(context, exc)
        finally:
            self.admission.leave()

    async def Recognize(self, request, context):
        await self._require_ready(context)
        try:
            settings = self._settings(request.config)
            self._check_offline_length(len(request.audio), request.config.encoding)
            if not request.audio:
                raise InvalidRequest("audio", "is empty: send the clip to transcribe")
            audio = decode_audio(request.audio, request.config.encoding)
        except InvalidRequest as exc:
            await abort(context, exc)
        if not self.offline_admission.try_enter():
            limit = self.config.max_offline_requests
            await abort(context, QueueFull(f"max_offline_requests: {limit} Recognize calls are in; retry later"))
        try:
            result = await self.backend.transcribe(settings, audio)
        except EngineFailure as exc:  # the engine gone (UNAVAILABLE) or its step failed (INTERNAL)
            await abort(context, exc)
        finally:
            self.offline_admission.leave()
        return asr_pb2.RecognizeResponse(
            request_id=settings.request_id,
            transcript=result.transcript,
            audio_s=result.audio_s,
            processing_s=result.processing_s,
        )

    async def GetInfo(self, request, context):
        await self._require_ready(context)
        limits = {**self.backend.limits(), "max_offline_audio_s": self.config.max_offline_audio_s}
        return info_response(self.name, self.backend.facts(), self.ceilings, limits)
