"""Model instances in worker processes, leased to one request at a time, with a bounded wait queue.

Why processes, not threads: VoxCPM draws its diffusion noise from torch's global generator, which threads
would share, so a seeded request would not be reproducible next to another one; and its Python-heavy decode
loop would fight over one GIL. Each worker owns a model, its RNG and its torch threads.

Protocol over a pipe, every message tagged with the lease's job number:
  parent → worker: ("begin", job, ...), ("segment", job, ...)*, ("end", job), or ("stop",)
  worker → parent: ("ready", payload) once; ("audio", job, ...)* ("segment_done", job, ...) per segment;
                   ("ended", job, ...) after "end"; ("error", job, message) instead of a reply on failure.
Cancelling a lease sets the worker's cancel event (checked after every patch) and sends "end"; the worker
clears the event on "end", so the worker is free again one patch step after the cancel.

A worker process that dies (killed, out of memory) fails only the request it was serving, with
WorkerDiedError (UNAVAILABLE); the pool starts a new process in its place at once, whether it died busy or
idle, and a dead idle worker still in the free queue is skipped when a request draws it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.tts.backend import WorkerDiedError
from services.tts.metrics import TtsMetrics
from voiceagent.serving.errors import QueueFull

log = logging.getLogger(__name__)


class Worker:
    """One model process and the parent's end of its pipe."""

    def __init__(self, index: int, target: Callable, spec: Any, on_exit: Callable[[Worker], None] | None = None):
        context = multiprocessing.get_context("spawn")  # fork would copy the parent's threads and torch state
        self.index = index
        self.conn, child_conn = context.Pipe()
        self.cancel = context.Event()
        self.process = context.Process(
            target=target, args=(spec, child_conn, self.cancel), name=f"tts-worker-{index}", daemon=True
        )
        self.process.start()
        child_conn.close()
        self.job = 0
        self.ready = False  # only a worker that started is replaced when it dies (no restart loop at start)
        self.exited = False
        self.on_exit = on_exit
        self.inbox: asyncio.Queue[tuple] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.conn.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                self.inbox.put_nowait(self.conn.recv())
        except (EOFError, OSError):
            self._loop.remove_reader(self.conn.fileno())
            self.exited = True
            self.inbox.put_nowait(("exit", None))
            if self.on_exit is not None:
                self.on_exit(self)

    def send(self, *message: Any) -> None:
        try:
            self.conn.send(message)
        except (OSError, ValueError) as exc:  # the pipe is broken or closed: the process is gone
            raise WorkerDiedError(f"worker {self.index} is gone ({type(exc).__name__})") from None

    async def receive(self, job: int | None = None) -> tuple:
        """The next message of `job` (replies to an earlier, abandoned job are dropped)."""
        while True:
            message = await self.inbox.get()
            if message[0] == "exit":
                self.inbox.put_nowait(message)
                raise WorkerDiedError(f"worker {self.index} exited with {self.process.exitcode}")
            if job is None or message[1] == job:
                return message

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError, WorkerDiedError):
            self._loop.remove_reader(self.conn.fileno())
            self.send("stop")
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
        self.conn.close()


class Lease:
    """A worker held by one request."""

    def __init__(self, worker: Worker, queue_s: float):
        self.worker = worker
        self.job = worker.job
        self.queue_s = queue_s
        self.end_sent = False

    def send(self, kind: str, *args: Any) -> None:
        self.end_sent = self.end_sent or kind == "end"
        self.worker.send(kind, self.job, *args)

    async def receive(self) -> tuple:
        message = await self.worker.receive(self.job)
        if message[0] == "error":
            raise RuntimeError(f"worker {self.worker.index}: {message[2]}")
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
        message = await worker.receive()
        if message[0] != "ready":
            raise RuntimeError(f"worker {index} failed to start: {message}")
        worker.ready = True
        return worker, message[1]

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
        worker.close()
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
            worker.close()
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
                lease.send("end")
            while (await worker.receive(lease.job))[0] != "ended":
                pass
        except WorkerDiedError:  # replaced by _worker_exited
            self.metrics.busy_workers.dec()
            return
        self._release(worker)
