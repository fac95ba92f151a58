"""The recognizer in its own process: the gRPC process forwards audio to it and relays its hypotheses.

Why a process and not a thread: the batched step is thousands of small torch calls, and it drops and
retakes the GIL around each one. In one process with the gRPC server, every message the event loop
handles takes the GIL from the step, and a step thread that loses the GIL waits for the loop's whole
turn plus a cross-core wake-up. On this 2-core CPU a thread holding the GIL 5 % of the time slowed a
batched step ~7 %, 20 % of the time ~37 %. In its own process the step has an interpreter to itself
(vLLM splits its engine core from its API server for the same reason).

The engine process runs the configured in-process backend unchanged (`load_in_process`) on its own event
loop; the two talk over the shared channel in the dataclasses of engine_messages.py. Audio is stamped with
its arrival time here, so latencies still count from when the gRPC server received it.
Metric calls in the engine process are forwarded and applied to this process's Prometheus registry: one
endpoint, the same series. If the engine process dies, open streams fail with EngineUnavailable and the
service shuts down, so that its orchestrator restarts it.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

import numpy as np

from services.asr import metrics
from services.asr.backend import OfflineResult, StreamSettings, step_failure
from services.asr.backends.engine_messages import (
    CancelStream,
    CancelTranscribe,
    EndStream,
    EngineReady,
    MetricCall,
    OpenStream,
    StartFailed,
    StopEngine,
    StreamAudio,
    StreamFailed,
    StreamUpdate,
    Transcribe,
    Transcribed,
)
from services.asr.config import AsrConfig
from voiceagent.serving.channel import Channel
from voiceagent.serving.device_fault import exit_cause
from voiceagent.serving.errors import EngineFailure, EngineUnavailable
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.lifeline import start_process
from voiceagent.serving.metrics import service_metrics

if TYPE_CHECKING:
    from services.asr.engine.stream import Stream

log = logging.getLogger(__name__)
OBSERVE_ALL = "observe_all"  # a MetricCall's method: observe each of its values


class EngineProcess:
    """A RecognizerBackend whose model runs in a child process."""

    def __init__(self, config: AsrConfig, attached: socket.socket | None = None):
        """`attached`: this front end's socket to an engine process started by others (`--frontends`), instead
        of a child process of its own."""
        self.config = config
        self.attached = attached
        self.name = ""  # the engine's backend name, known once it is ready
        self.chunk_ms_choices: tuple[int, ...] = ()
        self._facts: ModelFacts | None = None
        self._limits: Mapping[str, float] = {}
        self.process: multiprocessing.Process | None = None
        self.channel: Channel | None = None
        self.receiver: asyncio.Task | None = None
        self.ids = itertools.count()
        self.streams: dict[int, asyncio.Queue] = {}
        self.offline: dict[int, asyncio.Future] = {}
        self.ready: asyncio.Future | None = None
        self.failure = ""
        self.started = False
        self.stopping = False
        self.targets = {"work": service_metrics("asr")}

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.attached is not None:
            ours = self.attached
        else:
            ours, theirs = socket.socketpair()
            self.process = start_process(_engine_main, (self.config, [theirs]), name="asr-engine")
            theirs.close()
        self.channel = await Channel.open(ours)
        self.ready = asyncio.get_running_loop().create_future()
        self.receiver = asyncio.create_task(self._receive())
        ready = await self.ready
        self.name, self.chunk_ms_choices = ready.name, ready.chunk_ms_choices
        self._facts, self._limits = ready.facts, ready.limits
        self.started = True

    async def stop(self) -> None:
        self.stopping = True
        if self.channel is not None:
            self.channel.send(StopEngine())
            await self.channel.close()
        if self.process is not None:
            await asyncio.to_thread(self.process.join, 30)
            if self.process.is_alive():
                self.process.kill()
                await asyncio.to_thread(self.process.join)
        if self.receiver is not None:
            self.receiver.cancel()

    def facts(self) -> ModelFacts:
        return self._facts

    def limits(self) -> Mapping[str, float]:
        return {**self._limits, "engine_process": 1}

    # --- streams -----------------------------------------------------------------------------------------
    async def recognize(self, settings: StreamSettings, audio: AsyncIterator[np.ndarray]):
        self._check()
        stream_id = next(self.ids)
        updates: asyncio.Queue = asyncio.Queue()
        self.streams[stream_id] = updates
        self.channel.send(OpenStream(stream_id, settings))
        pump = asyncio.create_task(self._pump(stream_id, audio, updates))
        final = False
        try:
            while True:
                update = await updates.get()
                if isinstance(update, BaseException):
                    raise update
                yield update
                if update.is_final:
                    final = True
                    return
        finally:
            pump.cancel()
            del self.streams[stream_id]
            if not final and not self.failure:
                self.channel.send(CancelStream(stream_id))  # the client left (or its audio was bad): free the slot

    async def _pump(self, stream_id: int, audio: AsyncIterator[np.ndarray], updates: asyncio.Queue) -> None:
        try:
            async for piece in audio:
                self.channel.send(StreamAudio(stream_id, piece, time.perf_counter()))
        except Exception as exc:  # malformed audio: hand it to the stream's reader
            updates.put_nowait(exc)
            return
        self.channel.send(EndStream(stream_id, time.perf_counter()))

    async def transcribe(self, settings: StreamSettings, audio: np.ndarray) -> OfflineResult:
        self._check()
        request_id = next(self.ids)
        self.offline[request_id] = result = asyncio.get_running_loop().create_future()
        self.channel.send(Transcribe(request_id, settings, audio))
        try:
            return await result
        finally:
            del self.offline[request_id]
            # Cancelled (client gone, deadline; awaiting the future cancelled it too): stop the engine's work.
            if (result.cancelled() or not result.done()) and not self.failure:
                self.channel.send(CancelTranscribe(request_id))

    def _check(self) -> None:
        if self.failure:
            raise EngineUnavailable(self.failure)

    # --- what the engine process sends -------------------------------------------------------------------
    async def _receive(self) -> None:
        while (messages := await self.channel.receive()) is not None:
            for message in messages:
                self._dispatch(message)
        await self._engine_lost()

    def _dispatch(self, message) -> None:
        if isinstance(message, StreamUpdate):
            if (updates := self.streams.get(message.stream_id)) is not None:
                updates.put_nowait(message.update)
        elif isinstance(message, StreamFailed):
            if (updates := self.streams.get(message.stream_id)) is not None:
                updates.put_nowait(EngineFailure("INTERNAL", message.message))
        elif isinstance(message, MetricCall):
            target = self.targets.get(message.metric) or getattr(metrics, message.metric)
            bound = target.labels(*message.labels) if message.labels else target
            if message.method == OBSERVE_ALL:
                for value in message.args[0]:
                    bound.observe(value)
            else:
                getattr(bound, message.method)(*message.args)
        elif isinstance(message, Transcribed):
            if (future := self.offline.get(message.request_id)) is not None and not future.done():
                if isinstance(message.result, str):
                    future.set_exception(EngineFailure("INTERNAL", message.result))
                else:
                    future.set_result(message.result)
        elif isinstance(message, EngineReady):
            self.ready.set_result(message)
        elif isinstance(message, StartFailed):
            self.ready.set_exception(EngineUnavailable(f"the ASR engine failed to start: {message.message}"))

    async def _engine_lost(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.join, 5)
            code = self.process.exitcode
            self.failure = f"the ASR engine process exited (code {code}){exit_cause(code)}"
        else:
            self.failure = "the ASR engine process is gone (its channel closed)"
        if not self.started:  # start() raises: the service fails to start, nothing to drain
            if not self.ready.done():
                self.ready.set_exception(EngineUnavailable(self.failure))
            return
        if self.stopping:
            return
        log.error("%s; failing %d open streams and shutting down", self.failure, len(self.streams))
        for updates in self.streams.values():
            updates.put_nowait(EngineUnavailable(self.failure))
        for future in self.offline.values():
            if not future.done():
                future.set_exception(EngineUnavailable(self.failure))
        os.kill(os.getpid(), signal.SIGTERM)  # drain and exit; the orchestrator starts a new one


# --- the engine process ----------------------------------------------------------------------------------
class _Forwarded:
    """Stands in for a metric in the engine process: records `metric.labels(...).method(args)` as a message."""

    def __init__(self, channel: Channel, name: str, labels: tuple = ()):
        self.channel, self.name, self.label_values = channel, name, labels

    def labels(self, *labels) -> _Forwarded:
        return _Forwarded(self.channel, self.name, labels)

    def __getattr__(self, method: str):
        return lambda *args: self.channel.send(MetricCall(self.name, self.label_values, method, args))

    def forward_observations(self, values) -> None:
        """A histogram's observations as one message (metrics.observe_all)."""
        self.channel.send(MetricCall(self.name, self.label_values, OBSERVE_ALL, (tuple(values),)))


def _engine_main(config: AsrConfig, socks: list[socket.socket]) -> None:
    """The engine process: one model for the gRPC processes at the other ends of `socks` (one, or one per
    front end with `--frontends`)."""
    # SIGINT from a terminal reaches the whole process group; the gRPC process drains and then stops this one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s (engine): %(message)s")
    asyncio.run(_serve_engine(config, socks))


async def _serve_engine(config: AsrConfig, socks: list[socket.socket]) -> None:
    from services.asr.backends.in_process import load_in_process

    channels = [await Channel.open(sock) for sock in socks]
    # Metric calls go to the first gRPC process; with several, their registries are merged (multiprocess mode).
    for name in metrics.FORWARDED:  # before the backend looks any of them up
        setattr(metrics, name, _Forwarded(channels[0], name))
    try:
        backend = await asyncio.to_thread(load_in_process, config)
        backend.work = _Forwarded(channels[0], "work")
        await backend.start()
    except Exception as exc:
        log.exception("the ASR engine failed to start")
        for channel in channels:
            channel.send(StartFailed(f"{type(exc).__name__}: {exc}"))
            await channel.close()
        return
    gc.freeze()  # as the gRPC process does after start-up: keep the collector off the model's objects
    ready = EngineReady(backend.name, backend.chunk_ms_choices, backend.facts(), dict(backend.limits()))
    for channel in channels:
        channel.send(ready)
    await asyncio.gather(*(_serve_channel(_Engine(backend, channel)) for channel in channels))
    await backend.stop()  # every gRPC process has stopped it or is gone


async def _serve_channel(engine: _Engine) -> None:
    """One gRPC process's streams and Recognize calls, until it stops the engine or goes away."""
    while (messages := await engine.channel.receive()) is not None:
        for message in messages:
            if isinstance(message, StopEngine):
                await engine.stop()
                await engine.channel.close()
                return
            engine.dispatch(message)
    await engine.stop()  # the gRPC process is gone


class _Engine:
    """The engine process's side of one channel: its messages drive the backend's live streams by call (no task,
    queue or async iterator per stream: each hop through them is event-loop work with the interpreter lock that the
    step thread needs, twice per stream per chunk), and each stream's updates go straight onto the channel, so a
    step's updates leave in one frame."""

    def __init__(self, backend, channel: Channel):
        self.backend = backend
        self.channel = channel
        self.streams: dict[int, Stream] = {}
        self.waiting: dict[int, list] = {}  # streams waiting for a slot: the messages that came for them meanwhile
        self.openings: dict[int, asyncio.Task] = {}  # their waits (the loop keeps only weak references to tasks)
        self.transcribing: dict[int, asyncio.Task] = {}

    def dispatch(self, message) -> None:
        if isinstance(message, StreamAudio):  # by far the most frequent
            if (stream := self.streams.get(message.stream_id)) is not None:
                self.backend.feed(stream, message.piece, message.arrived_at)
            elif (backlog := self.waiting.get(message.stream_id)) is not None:
                backlog.append(message)
        elif isinstance(message, OpenStream):
            self._open(message.stream_id, message.settings)
        elif isinstance(message, EndStream):
            if (stream := self.streams.get(message.stream_id)) is not None:
                self.backend.end_audio(stream, message.ended_at)
            elif (backlog := self.waiting.get(message.stream_id)) is not None:
                backlog.append(message)
        elif isinstance(message, CancelStream):
            self._cancel(message.stream_id)
        elif isinstance(message, Transcribe):
            request_id = message.request_id
            work = self._transcribe(request_id, message.settings, message.audio)
            self.transcribing[request_id] = task = asyncio.create_task(work)
            task.add_done_callback(lambda _, forget=request_id: self.transcribing.pop(forget, None))
        elif isinstance(message, CancelTranscribe) and (task := self.transcribing.get(message.request_id)) is not None:
            task.cancel()

    def _open(self, stream_id: int, settings: StreamSettings) -> None:
        if self.backend.free_slots and not self.waiting:  # streams that wait for a slot get one in turn
            self._join(stream_id, settings)
            return
        self.waiting[stream_id] = []
        self.openings[stream_id] = asyncio.create_task(self._open_when_free(stream_id, settings))

    async def _open_when_free(self, stream_id: int, settings: StreamSettings) -> None:
        await self.backend.slot_free()
        del self.openings[stream_id]
        backlog = self.waiting.pop(stream_id)
        self._join(stream_id, settings)
        for message in backlog:
            self.dispatch(message)

    def _join(self, stream_id: int, settings: StreamSettings) -> None:
        channel, loop = self.channel, asyncio.get_running_loop()

        def deliver(update) -> None:
            if isinstance(update, BaseException):
                channel.send(StreamFailed(stream_id, str(step_failure(update))))
            else:
                channel.send(StreamUpdate(stream_id, update))
                if not update.is_final:
                    return
            # Not now: the batching loop that delivered may be iterating the backend's list of streams.
            loop.call_soon(self._cancel, stream_id)

        self.streams[stream_id] = self.backend.join(settings, deliver)

    def _cancel(self, stream_id: int) -> None:
        """The stream is done, failed, or its client left: it leaves the backend (once)."""
        if (stream := self.streams.pop(stream_id, None)) is not None:
            self.backend.leave(stream)
        elif (opening := self.openings.pop(stream_id, None)) is not None:
            opening.cancel()
            del self.waiting[stream_id]

    async def _transcribe(self, request_id: int, settings: StreamSettings, audio: np.ndarray) -> None:
        try:
            result: OfflineResult | str = await self.backend.transcribe(settings, audio)
        except Exception as exc:
            result = str(step_failure(exc))
        self.channel.send(Transcribed(request_id, result))

    async def stop(self) -> None:
        """End this channel's streams and Recognize calls (the backend is stopped once all channels are done)."""
        for stream_id in [*self.streams, *self.openings]:
            self._cancel(stream_id)
        running = list(self.transcribing.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
