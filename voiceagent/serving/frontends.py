"""Several gRPC front-end processes around one engine: the supervisor that spawns them, their shared port, one
health for the pod, one /metrics endpoint.

Why: one asyncio process turns every token (or audio chunk) into a gRPC message, and at tens of thousands of
messages a second that process is the limit, not the engine. vLLM's server meets the same limit with several
API-server processes feeding one engine core (`vllm serve --api-server-count N`); this is that layout for our
gRPC services, and the engine side is the engine's own (services/llm/backends/vllm_frontends.py hands vLLM's
engine-core client addresses to each front end).

- **One port, shared by SO_REUSEPORT.** The supervisor reserves the port (a bound socket with SO_REUSEPORT that
  never listens, so it takes no connections) and every front end binds it with `grpc.so_reuseport`; the kernel
  hashes each new connection to one of the listening front ends. No balancer process: a proxy would copy every
  message once more, which is the cost this removes. The unit spread is a connection: one client channel stays
  with one front end, many channels (load balancers, many callers) spread.
- **Health for the pod.** A front end turns SERVING only when the supervisor says every front end is up. When a
  front end dies, the supervisor turns the others NOT_SERVING at once, they keep serving (in-flight and new
  calls) for `grace_s` while load balancers drain the pod, then the pod exits with status 1 and its orchestrator
  starts a fresh one. A dead front end is not restarted: vLLM's engine core registers its clients once, at its
  start (a new client would never get the engine's ready message), and `vllm serve` itself stops when one of its
  API servers dies. The engine dying fails every front end's streams (UNAVAILABLE) and exits the pod.
- **One /metrics.** prometheus_client's multiprocess mode: the supervisor sets PROMETHEUS_MULTIPROC_DIR (a
  fresh directory) before the front ends start and serves their files merged: counters and histograms add up;
  gauges say how (`multiprocess_mode`): in-flight RPCs `livesum`, the engine's running/waiting `mostrecent` (the
  engine's latest report, whichever front end got it), ceilings `max`. `voiceagent_<svc>_frontend_rpcs_total
  {frontend}` counts the RPCs each front end took.

The supervisor and each front end talk over the shared Channel (channel.py) with the dataclasses below.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any, Protocol

from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings, measure_ceilings
from voiceagent.serving.channel import Channel
from voiceagent.serving.config import ServingConfig
from voiceagent.serving.lifeline import start_process, stop_with_launcher
from voiceagent.serving.tempdirs import private_folder

log = logging.getLogger(__name__)

WATCH_S = 0.2  # how often the supervisor looks at its processes
ENGINE_DEATH_GRACE_S = 1.0


class EngineLauncher(Protocol):
    """Starts the engine once for N front ends (in the supervisor) and says when it is gone."""

    def start(self, frontends: int) -> list[Any]:
        """Start the engine (blocks until it is up); one picklable handle per front end, to attach to it."""

    def failure(self) -> str:
        """Why the engine is gone; "" while it runs."""

    def stop(self) -> None: ...


class SpawnedEngine:
    """The part every service's EngineLauncher shares: its engine as one spawned process with a socket pair per
    front end (the engine serves every socket's requests from one model), its exit as the pod's failure, and its stop
    once each front end has told it to stop."""

    def __init__(self, name: str):
        self.name = name  # the service's: "asr", "tts"
        self.process: multiprocessing.Process | None = None

    def spawn(self, target: Callable, args: Callable[[list[socket.socket]], tuple], frontends: int,
              daemon: bool = False) -> list[socket.socket]:  # fmt: skip
        """Start `target(*args(their sockets))`; returns our end of each front end's socket pair."""
        pairs = [socket.socketpair() for _ in range(frontends)]
        theirs = [pair[1] for pair in pairs]
        self.process = start_process(target, args(theirs), name=f"{self.name}-engine", daemon=daemon)
        for sock in theirs:
            sock.close()
        log.info("%s engine process %d started for %d front ends", self.name, self.process.pid, frontends)
        return [ours for ours, _theirs in pairs]

    def failure(self) -> str:
        if self.process is None or self.process.exitcode is None:
            return ""
        return f"the {self.name.upper()} engine process exited (code {self.process.exitcode})"

    def stop(self) -> None:
        if self.process is not None:
            self.process.join(30)  # each front end's service told the engine to stop while stopping
            if self.process.is_alive():
                self.process.kill()
                self.process.join()


# Builds a front end's Service from (config, its engine handle, its index, the front-end count). A module-level
# function, so that a spawned process can unpickle it.
ServiceFactory = Callable[[ServingConfig, Any, int, int], Any]


# --- messages over the channel ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Ready:
    """Front end → supervisor: listening, engine attached."""

    index: int
    pid: int


@dataclasses.dataclass(frozen=True)
class Serve:
    """Supervisor → front end: every front end is ready; turn SERVING."""


@dataclasses.dataclass(frozen=True)
class Degrade:
    """Supervisor → front end: a sibling died; turn NOT_SERVING and keep serving until told to stop."""

    why: str


@dataclasses.dataclass(frozen=True)
class EngineLost:
    """Supervisor → front end: the engine is gone; fail open streams and exit non-zero."""

    why: str


@dataclasses.dataclass(frozen=True)
class FrontendSpec:
    """What a front-end process is started with."""

    name: str
    index: int
    count: int
    config: ServingConfig  # the pod's, with the shared port filled in
    build: ServiceFactory
    engine: Any  # this front end's handle from EngineLauncher.start
    ceilings: DeviceCeilings


# --- the supervisor -----------------------------------------------------------------------------------------
def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT that never listens: it holds the port (port 0: the OS
    picks one) for the front ends, which bind it too, and takes no connections itself."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


class Supervisor:
    """The pod's main process: holds the port and /metrics, starts the engine and the front ends, watches them."""

    def __init__(self, name: str, config: ServingConfig, count: int, launcher: EngineLauncher,
                 build: ServiceFactory, dtype: str):  # fmt: skip
        self.name, self.config, self.count = name, config, count
        self.launcher, self.build, self.dtype = launcher, build, dtype
        self.processes: list[multiprocessing.Process] = []
        self.channels: list[Channel] = []
        self.receivers: list[asyncio.Task] = []
        self.ready: set[int] = set()
        self.all_ready = asyncio.Event()
        self.stopping = asyncio.Event()
        self.failure = ""
        # Removed on stop. In the process's temp folder: the LLM's own (tempdirs.use_as_temp), which any next start of
        # the service sweeps if this one is SIGKILLed; elsewhere the shared one, swept by the next supervisor's start.
        self.metrics_dir = str(private_folder(f"voiceagent-{name}-metrics-", base=tempfile.gettempdir()))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir  # before any front end starts

    def listen(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        self.port_holder = reserve_port(self.config.host, self.config.port)
        self.port = self.port_holder.getsockname()[1]
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.metrics_dir)
        self.metrics_server, _ = start_http_server(self.config.metrics_port, addr=self.config.host, registry=registry)
        transport = ("mutual TLS" if self.config.tls_client_ca else "TLS") if self.config.tls_cert else "plaintext"
        print(
            f"{self.name}: gRPC listening on {self.config.host}:{self.port}, metrics on "
            f"http://{self.config.host}:{self.metrics_server.server_port}/metrics ({transport}, "
            f"{self.count} front ends sharing the port)",
            flush=True,
        )

    async def start(self) -> None:
        ceilings = UNMEASURED
        if self.config.probe_ceilings:  # once for the pod, before the engine loads, as a single server does
            ceilings = await asyncio.to_thread(measure_ceilings, self.config.device, self.dtype)
        handles = await asyncio.to_thread(self.launcher.start, self.count)
        config = dataclasses.replace(self.config, port=self.port, metrics_port=0)
        for index, handle in enumerate(handles):
            ours, theirs = socket.socketpair()
            spec = FrontendSpec(self.name, index, self.count, config, self.build, handle, ceilings)
            process = start_process(run_frontend, (spec, theirs), name=f"{self.name}-frontend-{index}")
            theirs.close()
            self.processes.append(process)
            channel = await Channel.open(ours)
            self.channels.append(channel)
            self.receivers.append(asyncio.create_task(self._receive(channel)))
        await self.all_ready.wait()
        self._broadcast(Serve())
        print(f"{self.name}: SERVING ({self.count} front ends, pids {[p.pid for p in self.processes]})", flush=True)

    async def started(self) -> bool:
        """Start; False if a SIGTERM or a front end's death came first (start-up errors raise)."""
        starting = asyncio.create_task(self.start())
        try:
            while not starting.done():
                dead = [process for process in self.processes if process.exitcode is not None]
                if dead:
                    self.failure = f"front end {dead[0].name} exited with {dead[0].exitcode} while starting"
                if dead or self.stopping.is_set():
                    return False
                await asyncio.wait({starting}, timeout=WATCH_S)
            starting.result()
            return True
        finally:
            starting.cancel()

    async def _receive(self, channel: Channel) -> None:
        while (messages := await channel.receive()) is not None:
            for (message,) in messages:
                if isinstance(message, Ready):
                    self.ready.add(message.index)
                    if len(self.ready) == self.count:
                        self.all_ready.set()

    def _broadcast(self, message) -> None:
        for process, channel in zip(self.processes, self.channels, strict=True):
            if process.exitcode is None:
                channel.send((message,))

    async def watch(self) -> None:
        """Until SIGTERM, a front end's death (drain `grace_s` on the others, then out) or the engine's."""
        from prometheus_client import multiprocess

        while not self.stopping.is_set():
            if why := self.launcher.failure():
                self.failure = f"the engine is gone ({why})"
                self._broadcast(EngineLost(self.failure))
                return
            dead = [process for process in self.processes if process.exitcode is not None]
            if dead:
                for process in dead:
                    multiprocess.mark_process_dead(process.pid, self.metrics_dir)
                names = ", ".join(f"{p.name} (pid {p.pid}, exit {p.exitcode})" for p in dead)
                self.failure = f"front end {names} died"
                log.error("%s: the others turn NOT_SERVING, drain %g s, then the pod exits", self.failure,
                          self.config.grace_s)  # fmt: skip
                self._broadcast(Degrade(self.failure))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.config.grace_s)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), WATCH_S)

    async def stop(self) -> None:
        """SIGTERM to every front end (each drains its streams), then the engine."""
        from prometheus_client import multiprocess

        try:
            for process in self.processes:
                if process.exitcode is None:
                    os.kill(process.pid, signal.SIGTERM)
            deadline = time.monotonic() + self.config.grace_s + 30
            for process in self.processes:
                await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
                if process.exitcode is None:
                    process.kill()
                    await asyncio.to_thread(process.join)
                multiprocess.mark_process_dead(process.pid, self.metrics_dir)
            for channel in self.channels:
                await channel.close()
            await asyncio.to_thread(self.launcher.stop)
            self.port_holder.close()
            if getattr(self, "metrics_server", None) is not None:
                self.metrics_server.shutdown()
                self.metrics_server.server_close()
        finally:  # the metrics folder goes whatever failed above
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        print(f"{self.name}: stopped", flush=True)


def run_pod(name: str, config: ServingConfig, count: int, launcher: EngineLauncher, build: ServiceFactory,
            dtype: str) -> None:  # fmt: skip
    """Entry point of `python -m services.<name> --frontends N` (N > 1): the supervisor, logging as a service does."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(supervise(name, config, count, launcher, build, dtype))


async def supervise(name: str, config: ServingConfig, count: int, launcher: EngineLauncher, build: ServiceFactory,
                    dtype: str) -> None:  # fmt: skip
    """Run `count` front ends of one engine until SIGTERM or SIGINT (or a death), then stop them all."""
    stop_with_launcher()
    supervisor = Supervisor(name, config, count, launcher, build, dtype)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.stopping.set)
    supervisor.listen()
    try:
        if await supervisor.started():
            await supervisor.watch()
    finally:
        print(f"{name}: draining", flush=True)
        await supervisor.stop()
    if supervisor.failure:
        raise SystemExit(f"{name}: exiting with status 1: {supervisor.failure}")


# --- a front-end process ------------------------------------------------------------------------------------
def frontend_rpcs(name: str):
    """Per front end, the RPCs it took (how the kernel spread the connections)."""
    from prometheus_client import Counter

    return Counter(f"voiceagent_{name}_frontend_rpcs", "RPCs taken, by front-end process index", ["frontend"])


def counting_interceptor(name: str, index: int):
    import grpc

    counter = frontend_rpcs(name).labels(str(index))

    class FrontendRpcCounter(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation, handler_call_details):
            counter.inc()
            return await continuation(handler_call_details)

    return FrontendRpcCounter()


def run_frontend(spec: FrontendSpec, sock: socket.socket) -> None:
    """Entry point of a spawned front-end process."""
    os.environ["VOICEAGENT_FRONTEND"] = f"{spec.index}/{spec.count}"  # e.g. not to serve metrics of its own
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {spec.name}[{spec.index}] %(message)s")
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"{spec.name}-frontend-{spec.index}")
    asyncio.run(_frontend(spec, sock))


async def _frontend(spec: FrontendSpec, sock: socket.socket) -> None:
    from voiceagent.serving.server import Server

    channel = await Channel.open(sock)
    service = spec.build(spec.config, spec.engine, spec.index, spec.count)
    server = Server(service, spec.config, reuse_port=True, interceptors=(counting_interceptor(spec.name, spec.index),))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)

    async def control() -> None:
        while (messages := await channel.receive()) is not None:
            for (message,) in messages:
                if isinstance(message, Serve):
                    await server.serve()
                elif isinstance(message, Degrade):
                    log.error("%s: NOT_SERVING, still serving until the pod stops", message.why)
                    await server.not_serving()
                elif isinstance(message, EngineLost):
                    lost = getattr(service, "engine_lost", None)
                    if lost is not None:
                        lost(message.why)
                    stopping.set()
        stopping.set()  # the supervisor is gone

    async def start() -> None:
        await server.listen(metrics_endpoint=False)
        await server.load(spec.ceilings)
        channel.send((Ready(spec.index, os.getpid()),))

    controlling = asyncio.create_task(control())
    starting = asyncio.create_task(start())
    waiting = asyncio.create_task(stopping.wait())
    done, _ = await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if starting in done:
        starting.result()
        await waiting
    else:
        starting.cancel()
    failure = getattr(service, "failure", "")
    grace_s = min(spec.config.grace_s, ENGINE_DEATH_GRACE_S) if failure else spec.config.grace_s
    await server.stop(grace_s)
    controlling.cancel()
    if failure:
        raise SystemExit(f"{spec.name} front end {spec.index}: exiting with status 1: {failure}")
