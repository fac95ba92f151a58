"""Batched VoxCPM2 backend, the gRPC process's half: admission, a request's segments in, its patches out.

The model and its step loop live in the engine process (`batched_engine`). Here a request waits for one of
`max_batch` slots (at most `max_queue` wait; more get RESOURCE_EXHAUSTED), joins the engine, hands it
its text segments one by one and turns each patch into the requested format as it arrives. Closing the
stream early (a cancelled RPC) sends Leave: the engine drops the request at its next step boundary. If the
engine process dies, open streams fail (UNAVAILABLE) and the service shuts down so that its orchestrator
restarts it, as the ASR service does.

With `--frontends N` (batched_frontends.py) N gRPC processes share one engine process, each over its own socket
(`attached`): the pod admits `max_batch + max_queue` requests with one counter shared by the front ends, and the
engine, the one place that knows its slots, queues those beyond `max_batch` until a slot is free.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import AsyncIterator

from services.tts.audio import AudioFormatter
from services.tts.backend import AudioPiece, SynthesisRequest, UnfitTextError, WorkerDiedError
from services.tts.backends.batched_engine import (
    EngineSpec,
    Failed,
    Join,
    Leave,
    Patches,
    Ready,
    SegmentDone,
    Shutdown,
    Speak,
    StartFailed,
    Stepped,
    engine_main,
)
from services.tts.backends.voxcpm import WorkerSpec, segment_max_len
from services.tts.config import TtsConfig
from services.tts.context import SegmentBudget
from services.tts.metrics import tts_metrics
from voiceagent.serving.admission import Admission
from voiceagent.serving.channel import Channel
from voiceagent.serving.device_fault import exit_cause
from voiceagent.serving.errors import QueueFull
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.lifeline import start_process
from voiceagent.serving.metrics import service_metrics

log = logging.getLogger(__name__)


def engine_spec(config: TtsConfig) -> EngineSpec:
    return EngineSpec(
        WorkerSpec.from_config(config),
        config.max_batch,
        config.cache_positions,
        config.cuda_graphs,
        config.vae_dtype,
        config.solver_attention,
        config.prefill_graphs,
        config.compiled_parts,
    )


class BatchedBackend:
    def __init__(self, config: TtsConfig, attached: socket.socket | None = None, pod: Admission | None = None):
        """`attached`: this front end's socket to an engine process started by the pod's supervisor, instead of a
        child process of its own; `pod`: the admission counter the front ends share (max_batch + max_queue)."""
        self.config = config
        self.spec = engine_spec(config)
        self.attached, self.pod = attached, pod
        self.metrics = tts_metrics()
        self.work = service_metrics("tts")
        self._facts: ModelFacts | None = None
        self.context: SegmentBudget | None = None  # set at start, from the engine's tokenizer
        self._limits = {
            "max_batch": config.max_batch,
            "max_queue": config.max_queue,
            "frontends": config.frontends,  # gRPC processes on this engine (the pod's; each reports the same)
            "max_text_chars": config.max_text_chars,
            "threads_per_worker": config.threads_per_worker,
        }
        self.slots = asyncio.Semaphore(config.max_batch)
        self.in_flight = 0
        self.waiting = 0
        self.ids = itertools.count()
        self.inboxes: dict[int, asyncio.Queue] = {}
        self.process: multiprocessing.Process | None = None
        self.channel: Channel | None = None
        self.receiver: asyncio.Task | None = None
        self.ready: asyncio.Future | None = None
        self.failure = ""
        self.stopping = False

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        from importlib.metadata import version

        if self.attached is not None:
            ours = self.attached
        else:
            ours, theirs = socket.socketpair()
            self.process = start_process(engine_main, (self.spec, [theirs]), name="tts-engine", daemon=True)
            theirs.close()
        self.channel = await Channel.open(ours)
        self.ready = asyncio.get_running_loop().create_future()
        self.receiver = asyncio.create_task(self._receive())
        ready = await self.ready
        model = self.spec.model
        self._facts = ModelFacts(
            backend="voxcpm",
            engine_version=version("voxcpm"),
            preset="checkpoint" if model.checkpoint else model.preset,
            source=model.source,
            synthetic_weights=not model.checkpoint,
            parameter_count=ready["parameter_count"],
            weight_bytes=ready["weight_bytes"],
            dtype=ready["dtype"],
            device=self.config.device,
            shape=ready["shape"] | {"max_batch": self.config.max_batch},
        )
        positions = ready["shape"]["cache_positions"]
        self.context = SegmentBudget(ready["tokenizer"], positions, f"cache_positions {positions}",
                                     functools.partial(segment_max_len, model))  # fmt: skip
        self.metrics.workers.set(1)

    async def stop(self) -> None:
        self.stopping = True
        if self.channel is not None:
            self.channel.send(Shutdown())
            await self.channel.close()
        if self.process is not None:
            await asyncio.to_thread(self.process.join, 10)
            if self.process.is_alive():
                self.process.kill()
        if self.receiver is not None:
            self.receiver.cancel()

    def facts(self) -> ModelFacts:
        return self._facts

    def limits(self) -> dict[str, float]:
        return self._limits

    # -- what the engine sends ---------------------------------------------------------------------------
    async def _receive(self) -> None:
        while (messages := await self.channel.receive()) is not None:
            for message in messages:
                if isinstance(message, Stepped):
                    self._record_step(message)
                elif isinstance(message, Patches):
                    for patch in message.split():
                        if (inbox := self.inboxes.get(patch.request_id)) is not None:
                            inbox.put_nowait(patch)
                elif isinstance(message, SegmentDone | Failed):
                    if (inbox := self.inboxes.get(message.request_id)) is not None:
                        inbox.put_nowait(message)
                elif isinstance(message, Ready):
                    self.ready.set_result(message.payload)
                elif isinstance(message, StartFailed):
                    self.ready.set_exception(RuntimeError(f"the TTS engine failed to start: {message.message}"))
        if self.process is not None:
            await asyncio.to_thread(self.process.join, 5)  # its exit code says why, once it has one
            code = self.process.exitcode
            self.failure = f"the TTS engine process exited (code {code}){exit_cause(code)}"
        else:  # the pod's engine (--frontends): the supervisor sees its exit code
            self.failure = "the TTS engine process is gone (its channel closed)"
        if not self.ready.done():
            self.ready.set_exception(RuntimeError(self.failure))
        for inbox in self.inboxes.values():
            inbox.put_nowait(Failed(-1, self.failure))
        if self._facts is not None and not self.stopping:  # started: as the ASR service does, drain and exit
            log.error("%s; failing %d open streams and shutting down", self.failure, len(self.inboxes))
            os.kill(os.getpid(), signal.SIGTERM)

    def _record_step(self, step: Stepped) -> None:
        self.metrics.batch_requests.observe(step.requests)
        self.metrics.step_batch.set(step.requests if self._busy else 0)  # a step reported after the last left
        self.metrics.step_seconds.observe(step.seconds)
        self.metrics.step_launch_seconds.observe(step.launch_seconds)
        self.metrics.step_pass_wait_seconds.observe(step.pass_wait_seconds)
        if step.prefill_seconds:
            self.metrics.prefill_seconds.observe(step.prefill_seconds)
        if step.hidden_prefill_seconds:
            self.metrics.hidden_prefill_seconds.observe(step.hidden_prefill_seconds)
        self.work.record_work(step.flops, step.read_bytes)

    # -- requests ----------------------------------------------------------------------------------------
    @property
    def _busy(self) -> int:
        """Requests holding a place: this process's, or the pod's (its steps come to front end 0)."""
        return self.pod.held if self.pod is not None else self.in_flight

    @contextlib.asynccontextmanager
    async def _slot(self):
        """One of the engine's slots, waiting in line for it; QueueFull when `max_queue` already wait. In a pod of
        front ends, a place among the pod's `max_batch + max_queue` (the engine queues past its slots)."""
        queue_s = await (self._pod_place() if self.pod is not None else self._wait_for_slot())
        self.in_flight += 1
        self.metrics.busy_workers.set(self.in_flight)
        try:
            yield queue_s
        finally:
            self.in_flight -= 1
            self.metrics.busy_workers.set(self.in_flight)
            if self.pod is not None:
                self.pod.leave()
            else:
                self.slots.release()
            if not self._busy:
                self.metrics.step_batch.set(0)  # at rest: no step advances anyone

    async def _pod_place(self) -> float:
        if not self.pod.try_enter():
            raise QueueFull(
                f"all {self.config.max_batch} batch slots busy and {self.config.max_queue} requests queued "
                f"(max_queue) in the pod's {self.config.frontends} front ends"
            )
        return 0.0  # a wait for a slot happens in the engine

    async def _wait_for_slot(self) -> float:
        if self.in_flight >= self.config.max_batch and self.waiting >= self.config.max_queue:
            raise QueueFull(
                f"all {self.config.max_batch} batch slots busy and {self.waiting} requests queued (max_queue)"
            )
        self.waiting += 1
        self.metrics.queued_requests.set(self.waiting)
        started = time.perf_counter()
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
            self.metrics.queued_requests.set(self.waiting)
        queue_s = time.perf_counter() - started
        self.metrics.queue_seconds.observe(queue_s)
        return queue_s

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioPiece]:
        """The request's audio, patch by patch. Its engine work runs in a task of its own that holds the slot
        while the engine speaks and hands the pieces over as they come: a client that reads slowly or stops
        reading then holds its audio (bounded by max_text_chars), never the slot. (Holding the slot until the
        client had read everything let two stalled readers keep every other request out.)"""
        if self.failure:
            raise RuntimeError(self.failure)
        pieces: asyncio.Queue = asyncio.Queue()
        speaking = asyncio.create_task(self._speak(request, pieces))
        try:
            while (piece := await pieces.get()) is not None:
                if isinstance(piece, BaseException):
                    raise piece
                yield piece
        finally:
            speaking.cancel()  # the client left, or the request failed: the slot is given back at once
            with contextlib.suppress(asyncio.CancelledError):
                await speaking

    async def _speak(self, request: SynthesisRequest, pieces: asyncio.Queue) -> None:
        """Every segment of `request` in one engine slot, its pieces into `pieces`; then None (or the error)."""
        try:
            segments = aiter(request.segments)
            text = await anext(segments, None)
            if text is None:
                pieces.put_nowait(None)
                return
            formatter = AudioFormatter(self._facts.shape["sample_rate"], request.sample_rate_hz, request.pcm16)
            async with self._slot() as queue_s:
                request_id = next(self.ids)
                self.inboxes[request_id] = inbox = asyncio.Queue()
                self.channel.send(Join(request_id, request.seed, request.inference_timesteps, request.cfg_value))
                index, generation_s = 0, 0.0
                try:
                    while text is not None:
                        started = time.perf_counter()
                        self.channel.send(Speak(request_id, index, text))
                        while not isinstance(message := await inbox.get(), SegmentDone):
                            if isinstance(message, Failed) and message.request_id == -1:  # the engine died
                                raise WorkerDiedError(message.message)
                            if isinstance(message, Failed) and message.invalid:
                                raise UnfitTextError(message.message)
                            if isinstance(message, Failed):
                                raise RuntimeError(f"TTS engine: {message.message}")
                            if message.waited_steps:
                                self.metrics.first_patch_steps.observe(message.waited_steps)
                            audio, samples = formatter.convert(message.audio)
                            pieces.put_nowait(AudioPiece(audio, samples, index, 1, queue_s))
                        generation_s += time.perf_counter() - started
                        text = await anext(segments, None)
                        index += 1
                finally:
                    del self.inboxes[request_id]
                    if not self.failure:
                        self.channel.send(Leave(request_id))
            tail, samples = formatter.flush()
            pieces.put_nowait(AudioPiece(tail, samples, index - 1, 0, queue_s, is_last=True, generation_s=generation_s))
            pieces.put_nowait(None)
        except Exception as exc:  # QueueFull, bad text read mid-stream, the engine's failure: the reader raises it
            pieces.put_nowait(exc)
