"""Server bootstrap shared by the three services: one asyncio gRPC server with health, reflection,
metrics and graceful shutdown around whatever servicer a service registers.

Lifecycle: bind and listen (health NOT_SERVING) → measure device ceilings → load and warm the engine →
SERVING. On SIGTERM or SIGINT: NOT_SERVING, refuse new RPCs, give in-flight streams `grace_s` to finish,
then close the engine.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from voiceagent.serving.ceilings import UNMEASURED, DeviceCeilings, measure_ceilings
from voiceagent.serving.config import ServingConfig
from voiceagent.serving.lifeline import stop_with_launcher
from voiceagent.serving.malformed import MalformedRequestInterceptor
from voiceagent.serving.metrics import RpcMetricsInterceptor, service_metrics, start_metrics_endpoint
from voiceagent.serving.tls import server_credentials

log = logging.getLogger(__name__)

ENGINE_DEATH_GRACE_S = 1.0
MAX_MESSAGE_BYTES = 64 << 20  # for a service that does not set its own (`message_limits`)


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


def add_reflection(service_names: tuple[str, ...], server: grpc.aio.Server) -> None:
    """Server reflection under both of its names: v1alpha, which grpcio-reflection implements, and v1, which newer
    clients ask for first (some without falling back). The two protocols are the same messages under another
    package (the same fields and numbers), so one servicer of grpcio-reflection answers both."""
    names = (*service_names, reflection.SERVICE_NAME, REFLECTION_V1)
    reflection.enable_server_reflection(names, server)
    answer = reflection.aio.ReflectionServicer(names).ServerReflectionInfo
    handler = grpc.stream_stream_rpc_method_handler(
        answer,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


class Service(Protocol):
    """What a service gives the runtime: its servicers, and an engine to start and stop."""

    name: str  # "asr", "llm" or "tts": metric names and log lines
    service_names: tuple[str, ...]  # full proto service names, for health and reflection
    methods: tuple[str, ...]  # RPC method names, for metric label initialisation
    dtype: str  # dtype the engine computes in; the matmul peak is measured in it

    def add_to_server(self, server: grpc.aio.Server) -> None: ...

    async def start(self, ceilings: DeviceCeilings) -> None:
        """Load the engine and warm it up; the service turns SERVING when this returns."""

    async def stop(self) -> None:
        """Release the engine after the server stopped taking RPCs."""

    # Optional: `message_limits() -> (receive_bytes, send_bytes)`, the gRPC message size limits the service
    # chose for its largest legal request; `failure: str`, set when its engine is gone (the process then
    # exits non-zero after draining, so that its orchestrator restarts it).


class Server:
    """One service's gRPC server, health, reflection and metrics endpoint."""

    def __init__(self, service: Service, config: ServingConfig, reuse_port: bool = False, interceptors: tuple = ()):
        """`reuse_port` and `interceptors`: for a front end that shares its port with others (frontends.py)."""
        self.service = service
        self.config = config
        self.metrics = service_metrics(service.name)
        self.metrics.init_methods(service.methods)
        limits = getattr(service, "message_limits", None)
        self.max_receive_bytes, self.max_send_bytes = limits() if limits else (MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES)
        options = [
            ("grpc.max_receive_message_length", self.max_receive_bytes),
            ("grpc.max_send_message_length", self.max_send_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
        ]
        if config.max_connection_age_s:
            # GOAWAY at this age (in-flight calls still finish): a round_robin client re-resolves DNS on it, which is
            # how it learns of replicas added since it connected (grpc does not re-resolve while connections live).
            options.append(("grpc.max_connection_age_ms", round(config.max_connection_age_s * 1000)))
        self.grpc = grpc.aio.server(
            interceptors=[RpcMetricsInterceptor(self.metrics), MalformedRequestInterceptor(), *interceptors],
            options=options,
        )
        service.add_to_server(self.grpc)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        add_reflection((*service.service_names, health.SERVICE_NAME), self.grpc)
        address = f"{config.host}:{config.port}"
        if config.tls_cert:
            credentials = server_credentials(config.tls_cert, config.tls_key, config.tls_client_ca)
            self.port = self.grpc.add_secure_port(address, credentials)
        else:
            self.port = self.grpc.add_insecure_port(address)
        self.transport = ("mutual TLS" if config.tls_client_ca else "TLS") if config.tls_cert else "plaintext"
        self.metrics_port = 0
        self._metrics_server = None
        self.ceilings = UNMEASURED

    async def _set_health(self, status: int) -> None:
        for name in ("", *self.service.service_names):
            await self.health.set(name, status)

    async def start(self) -> None:
        await self.listen()
        await self.load()
        await self.serve()

    async def listen(self, metrics_endpoint: bool = True) -> None:
        """Take RPCs (health NOT_SERVING) and, unless a supervisor serves them, metrics."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.grpc.start()
        if not metrics_endpoint:
            return
        self._metrics_server, self.metrics_port = start_metrics_endpoint(self.config.host, self.config.metrics_port)
        print(
            f"{self.service.name}: gRPC listening on {self.config.host}:{self.port}, "
            f"metrics on http://{self.config.host}:{self.metrics_port}/metrics ({self.transport})",
            flush=True,
        )

    async def load(self, ceilings: DeviceCeilings | None = None) -> None:
        """Measure the device ceilings (unless given: a supervisor measured them) and start the engine."""
        if ceilings is not None:
            self.ceilings = ceilings
            self.metrics.set_ceilings(ceilings)
        elif self.config.probe_ceilings:
            self.ceilings = await asyncio.to_thread(measure_ceilings, self.config.device, self.service.dtype)
            self.metrics.set_ceilings(self.ceilings)
            log.info(
                "%s ceilings: %.1f GB/s read, %.1f GFLOP/s %s (ridge %.1f FLOP/byte); %.2f CPU cores busy elsewhere%s",
                self.ceilings.device_name,
                self.ceilings.memory_bandwidth_bytes_per_s / 1e9,
                self.ceilings.peak_flops_per_s / 1e9,
                self.ceilings.dtype,
                self.ceilings.ridge_flops_per_byte,
                self.ceilings.background_cores,
                "" if self.ceilings.quiet else ": MEASURED UNDER LOAD, ceilings too low",
            )
        await self.service.start(self.ceilings)
        # The engines (torch, NeMo, vLLM, VoxCPM) leave millions of long-lived objects; every full collection
        # walks them all, and serving many streams allocates fast enough to trigger collections often (they
        # took half of the ASR event loop's time at a few hundred streams). Freezing takes what start-up made
        # out of the collector's sight; what requests allocate afterwards is still collected.
        gc.freeze()

    async def serve(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        print(f"{self.service.name}: SERVING", flush=True)

    async def not_serving(self) -> None:
        """Health NOT_SERVING while RPCs are still taken (a sibling front end died and the pod drains)."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def stop(self, grace_s: float | None = None) -> None:
        grace_s = self.config.grace_s if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        await self.grpc.stop(grace_s)
        await self.service.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        print(f"{self.service.name}: stopped", flush=True)


async def serve(service: Service, config: ServingConfig) -> None:
    """Run `service` until SIGTERM or SIGINT, then drain in-flight streams and stop."""
    server = Server(service, config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    starting = asyncio.create_task(server.start())
    waiting = asyncio.create_task(stopping.wait())
    done, _ = await asyncio.wait({starting, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if starting in done:
        starting.result()  # start-up errors surface here
        await waiting
    else:
        starting.cancel()
    failure = getattr(service, "failure", "")
    # After an engine death the open streams have already failed: a short drain, then out.
    grace_s = min(config.grace_s, ENGINE_DEATH_GRACE_S) if failure else config.grace_s
    print(f"{service.name}: draining (grace {grace_s:g} s)", flush=True)
    await server.stop(grace_s)
    if failure:
        raise SystemExit(f"{service.name}: exiting with status 1: {failure}")


def run(service: Service, config: ServingConfig) -> None:
    """Entry point of `python -m services.<name>`."""
    stop_with_launcher()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(service, config))
