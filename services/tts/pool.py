"""Model instances in worker processes, leased to one request at a time, with a bounded wait queue.

Why processes, not threads: VoxCPM draws its diffusion noise from torch's global generator, which threads
would share, so a seeded request would not be reproducible next to another one; and its Python-heavy decode
loop would fight over one GIL. Each worker owns a model, its RNG and its torch threads.

Messages travel over the shared channel (voiceagent/serving/channel.py) as the dataclasses below, each tagged
with the lease's job number:
  parent → worker: Begin, Segment*, End per job; Stop once
  worker → parent: Ready once; Audio* and SegmentDone per segment; Ended after End; WorkerFailed instead of a
                   reply when a job fails (the worker lives on)
Cancelling a lease sets the worker's cancel event (checked after every patch) and sends End; the worker
clears the event on End, so the worker is free again one patch step after the cancel.

A worker process that dies (killed, out of memory) fails only the request it was serving, with
WorkerDiedError (UNAVAILABLE); the pool starts a new process in its place at once, whether it died busy or
idle, and a dead idle worker still in the free queue is skipped when a request draws it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.tts.backend import WorkerDiedError
from services.tts.metrics import TtsMetrics
from voiceagent.serving.channel import Channel
from voiceagent.serving.errors import QueueFull
from voiceagent.serving.lifeline import start_process

log = logging.getLogger(__name__)


# -- parent → worker ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Begin:
    job: int
    seed: int
    sample_rate_hz: int
    pcm16: bool


@dataclasses.dataclass(frozen=True)
class Segment:
    job: int
    index: int
    text: str
    timesteps: int
    cfg_value: float


@dataclasses.dataclass(frozen=True)
class End:
    job: int


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


# -- worker → parent ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Ready:
    payload: dict  # what the model is (voxcpm.ready_payload)


@dataclasses.dataclass(frozen=True)
class Audio:
    """One patch in the requested format, and the model work it took."""

    job: int
    segment_index: int
    audio: bytes
    samples: int
    flops: float
    read_bytes: float


@dataclasses.dataclass(frozen=True)
class SegmentDone:
    job: int
    segment_index: int
    patches: int


@dataclasses.dataclass(frozen=True)
class Ended:
    """After End: whatever the resampler still held."""

    job: int
    tail: bytes
    samples: int


@dataclasses.dataclass(frozen=True)
class WorkerFailed:
    job: int
    message: str


@dataclasses.dataclass(frozen=True)
class _Exited:
    """Put in a worker's inbox (never sent) once its channel closed: the process is gone."""


class Worker:
    """One model process and the parent's end of its channel."""

    def __init__(self, index: int, target: Callable, spec: Any, on_exit: Callable[[Worker], None] | None = None):
        context = multiprocessing.get_context("spawn")  # the worker is spawned (start_process): its Event must be too
        self.index = index
        self.sock, theirs = socket.socketpair()
        self.cancel = context.Event()
        self.process = start_process(target, (spec, theirs, self.cancel), name=f"tts-worker-{index}", daemon=True)
        theirs.close()
        self.channel: Channel | None = None
        self.job = 0
        self.ready = False  # only a worker that started is replaced when it dies (no restart loop at start)
        self.exited = False
        self.on_exit = on_exit
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.reader: asyncio.Task | None = None

    async def open(self) -> None:
        self.channel = await Channel.open(self.sock)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (messages := await self.channel.receive()) is not None:
            for message in messages:
                self.inbox.put_nowait(message)
        self.exited = True
        self.inbox.put_nowait(_Exited())
        if self.on_exit is not None:
            self.on_exit(self)

    def send(self, message: Begin | Segment | End | Stop) -> None:
        if self.exited:
            raise WorkerDiedError(f"worker {self.index} is gone")
        self.channel.send(message)

    async def receive(self, job: int | None = None):
        """The next message of `job` (replies to an earlier, abandoned job are dropped)."""
        while True:
            message = await self.inbox.get()
            if isinstance(message, _Exited):
                self.inbox.put_nowait(message)
                raise WorkerDiedError(f"worker {self.index} exited with {self.process.exitcode}")
            if job is None or message.job == job:
                return message

    async def close(self) -> None:
        self.on_exit = None  # closing it is not a death to recover from
        with contextlib.suppress(WorkerDiedError, ConnectionError):
            self.send(Stop())
        if self.channel is not None:
            await self.channel.close()
        await asyncio.to_thread(self.process.join, 10)
        if self.process.is_alive():
            self.process.kill()
        if self.reader is not None:
            self.reader.cancel()


class Lease:
    """A worker held by one request."""

    def __init__(self, worker: Worker, queue_s: float):
        self.worker = worker
        self.job = worker.job
        self.queue_s = queue_s
        self.end_sent = False

    def begin(self, seed: int, sample_rate_hz: int, pcm16: bool) -> None:
        self.worker.send(Begin(self.job, seed, sample_rate_hz, pcm16))

    def segment(self, index: int, text: str, timesteps: int, cfg_value: float) -> None:
        self.worker.send(Segment(self.job, index, text, timesteps, cfg_value))

    def end(self) -> None:
        self.end_sent = True
        self.worker.send(End(self.job))

    async def receive(self) -> Audio | SegmentDone | Ended:
        message = await self.worker.receive(self.job)
        if isinstance(message, WorkerFailed):
            raise RuntimeError(f"worker {self.worker.index}: {message.message}")
        return message


class WorkerPool:
    def __init__(self, target: Callable, spec: Any, workers: int, max_queue: int, metrics: TtsMetrics):
        self.target, self.spec, self.size, self.max_queue = target, spec, workers, max_queue
        self.metrics = metrics
        self._free: asyncio.Queue[Worker] = asyncio.Queue()
        self._workers: list[Worker] = []
        self._waiting = 0
        self._recovering: set[asyncio.Task] = set()
        self._stopping = False

    async def _spawn(self, index: int) -> tuple[Worker, Any]:
        worker = Worker(index, self.target, self.spec, self._worker_exited)
        self._workers.append(worker)
        await worker.open()
        message = await worker.receive()
        if not isinstance(message, Ready):
            raise RuntimeError(f"worker {index} failed to start: {message}")
        worker.ready = True
        return worker, message.payload

    async def start(self) -> Any:
        """Start every worker (they load in parallel); returns the first one's ready payload."""
        started = await asyncio.gather(*(self._spawn(index) for index in range(self.size)))
        for worker, _ in started:
            self._free.put_nowait(worker)
        self.metrics.workers.set(self.size)
        return started[0][1]

    def _worker_exited(self, worker: Worker) -> None:
        if self._stopping or not worker.ready or worker not in self._workers:
            return
        log.error("tts worker %d exited with %s; starting a new one", worker.index, worker.process.exitcode)
        self.metrics.workers.dec()
        self._background(self._replace(worker))

    async def _replace(self, worker: Worker) -> None:
        self._workers.remove(worker)
        if worker.process.is_alive():  # it closed its pipe but hangs: make sure it is gone
            worker.process.kill()
        await asyncio.to_thread(worker.process.join, 10)
        await worker.close()
        try:
            replacement, _ = await self._spawn(worker.index)
        except Exception:
            log.exception("tts worker %d could not be replaced; serving with one fewer", worker.index)
            return
        self.metrics.workers.inc()
        self._free.put_nowait(replacement)

    def _background(self, work) -> None:
        task = asyncio.create_task(work)
        self._recovering.add(task)
        task.add_done_callback(self._recovering.discard)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._recovering):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)
        for worker in self._workers:
            await worker.close()
        self._workers.clear()

    @property
    def waiting(self) -> int:
        return self._waiting

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        """A free worker, waiting in line for one; QueueFull when `max_queue` already wait."""
        if self._free.empty() and self._waiting >= self.max_queue:
            raise QueueFull(f"all {self.size} workers busy and {self._waiting} requests queued (max_queue)")
        self._waiting += 1
        self.metrics.queued_requests.set(self._waiting)
        started = time.perf_counter()
        try:
            worker = await self._free.get()
            while worker.exited:  # died while idle: its replacement is on its way to the queue
                worker = await self._free.get()
        finally:
            self._waiting -= 1
            self.metrics.queued_requests.set(self._waiting)
        worker.job += 1
        lease = Lease(worker, time.perf_counter() - started)
        self.metrics.queue_seconds.observe(lease.queue_s)
        self.metrics.busy_workers.inc()
        finished = False
        try:
            yield lease
            finished = True
        finally:
            if finished:
                self._release(worker)
            else:  # cancelled or failed mid-request: stop the worker's generation without holding up the caller
                self._background(self._recover(lease))

    def _release(self, worker: Worker) -> None:
        self.metrics.busy_workers.dec()
        self._free.put_nowait(worker)

    async def _recover(self, lease: Lease) -> None:
        worker = lease.worker
        try:
            if not lease.end_sent:
                worker.cancel.set()
                lease.end()
            while not isinstance(await worker.receive(lease.job), Ended):
                pass
        except WorkerDiedError:  # replaced by _worker_exited
            self.metrics.busy_workers.dec()
            return
        self._release(worker)
