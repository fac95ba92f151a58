"""What every load-generating user shares: the run's context, gRPC channels, and how a request is reported.

A user is one closed-loop client: it sends a request, waits for the whole answer, and sends the next, so the
number of users is the concurrency. A streaming call is reported to Locust as two events — its first chunk
and the whole call — and as one `RequestRecord` to the sink (a JSONL file on the master).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

import gevent
import grpc
import grpc.experimental.gevent
from locust import User, constant, task

from loadgen.results import RequestRecord
from loadgen.workload import Workload
from voiceagent.serving.tls import open_channel

grpc.experimental.gevent.init_gevent()  # before any channel exists: gRPC's threads become greenlets

# gRPC's default message cap (4 MB) is below a long utterance or reply as float32 audio.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


class LoadContext:
    """Per process: the workload, where records go, and whether users may start new requests.

    The sweep closes the gate at the end of a level's measuring window and waits for in-flight requests to
    finish (`drain`), so every measured request ran to completion under the level's load.
    """

    def __init__(self, workload: Workload, sink: Callable[[RequestRecord], None]):
        self.workload = workload
        self.sink = sink
        self.accepting = False
        self.in_flight = 0
        self._channels: dict[str, grpc.Channel] = {}

    def channel(self, address: str) -> grpc.Channel:
        """One channel per address per process: HTTP/2 multiplexes every user's streams over it; an address that
        resolves to several replicas (dns:///NAME:PORT) gets a connection to each, used round-robin."""
        if address not in self._channels:
            self._channels[address] = open_channel(address, self.workload.endpoints.tls, CHANNEL_OPTIONS)
        return self._channels[address]

    def drain(self, timeout_s: float) -> bool:
        """Stop new requests and wait for in-flight ones; False when some were still running at the timeout."""
        self.accepting = False
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.02)
        return self.in_flight == 0

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()


def failed(record: RequestRecord, error: BaseException) -> RequestRecord:
    """Errors are recorded, not raised: a level's error count is part of its verdict."""
    if isinstance(error, grpc.RpcError):
        message = f"{error.code().name}: {error.details()}"
    else:
        message = f"{type(error).__name__}: {error}"
    return dataclasses.replace(record, ok=False, error=message[:300])


class StreamingUser(User):
    """Base of the users: one request per task iteration, reported as two Locust events and one record."""

    abstract = True
    wait_time = constant(0)
    target = ""  # RequestRecord.target
    method = ""  # Locust event name of the whole call; the first chunk is "<method> first"

    def on_start(self) -> None:
        self.context: LoadContext = self.environment.loadgen
        self.workload = self.context.workload
        self.rng = random.Random()  # seeded from the OS: distinct prompts across users and workers

    def request(self) -> RequestRecord:
        raise NotImplementedError

    @task
    def one_request(self) -> None:
        if not self.context.accepting:
            gevent.sleep(0.02)
            return
        self.context.in_flight += 1
        try:  # reported before it stops counting as in flight: a drain then finds every record delivered
            self.report(self.request())
        finally:
            self.context.in_flight -= 1

    def report(self, record: RequestRecord) -> None:
        fire = self.environment.events.request.fire
        exception = RuntimeError(record.error) if not record.ok else None
        if record.first_s is not None:
            fire(
                request_type="grpc" if self.target != "openai" else "http",
                name=f"{self.method} first",
                response_time=record.first_s * 1000,
                response_length=0,
                exception=None,
            )
        fire(
            request_type="grpc" if self.target != "openai" else "http",
            name=self.method,
            response_time=record.latency_s * 1000,
            response_length=int(record.units),
            exception=exception,
        )
        self.context.sink(record)

    def timed(self, call: Callable[[RequestRecord, float], object]) -> RequestRecord:
        """Run `call(record, started)`; its latency is to the end of the call, its errors are recorded."""
        record = RequestRecord(target=self.target, concurrency=0, started_s=time.time(), ok=True)
        started = time.perf_counter()
        try:
            call(record, started)
        except Exception as error:  # noqa: BLE001 — recorded, not raised
            record = failed(record, error)
        record.latency_s = time.perf_counter() - started
        return record
