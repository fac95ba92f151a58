"""Prometheus metrics shared by every service, and the endpoint that serves them.

Names follow `voiceagent_<service>_<what>_<unit>`, so the three services expose one schema that differs only
in the service part. Latency buckets resolve voice latencies from 1 ms to 10 s (vLLM's start at 0.3 s).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Iterable

import grpc
import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from voiceagent.serving.ceilings import DeviceCeilings

NAMESPACE = "voiceagent"

LATENCY_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
)  # fmt: skip

# Grid of status codes every RPC label set is initialised with, so rates exist before the first error.
_INITIAL_CODES = ("OK", "CANCELLED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "INTERNAL")


class ServiceMetrics:
    """Metrics every service has: RPCs, device ceilings and the model work (FLOPs, bytes) its engine does.

    The work counters are what make live utilisation readable: rate(flops_total) / peak_flops_per_second is
    model FLOP utilisation, rate(read_bytes_total) / memory_bandwidth_bytes_per_second is bandwidth utilisation.
    """

    def __init__(self, service: str):
        self.service = service
        prefix = f"{NAMESPACE}_{service}"
        self.rpc_requests = Counter(
            f"{prefix}_rpc_requests", "RPCs finished, by method and status code", ["method", "code"]
        )
        self.rpc_duration = Histogram(
            f"{prefix}_rpc_duration_seconds",
            "Wall time of an RPC from start to its last message, by method and status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS_S,
        )
        # multiprocess_mode: how a pod of several front-end processes (frontends.py) adds up; unused otherwise.
        self.rpc_in_flight = Gauge(
            f"{prefix}_rpc_in_flight", "RPCs in progress, by method", ["method"], multiprocess_mode="livesum"
        )
        self.memory_bandwidth = Gauge(
            f"{prefix}_device_memory_bandwidth_bytes_per_second",
            "Measured read bandwidth of the serving device",
            ["device"],
            multiprocess_mode="max",
        )
        self.peak_flops = Gauge(
            f"{prefix}_device_peak_flops_per_second",
            "Measured dense matmul peak of the serving device in the serving dtype",
            ["device", "dtype"],
            multiprocess_mode="max",
        )
        self.model_flops = Counter(f"{prefix}_model_flops", "FLOPs the engine's steps must do (model-derived)")
        self.model_read_bytes = Counter(
            f"{prefix}_model_read_bytes", "Bytes the engine's steps must read: weights, caches (model-derived)"
        )
        self.engine_steps = Counter(f"{prefix}_engine_steps", "Engine steps (forward passes) executed")

    def init_methods(self, methods: Iterable[str]) -> None:
        for method in methods:
            self.rpc_in_flight.labels(method)
            for code in _INITIAL_CODES:
                self.rpc_requests.labels(method, code)
                self.rpc_duration.labels(method, code)

    def set_ceilings(self, ceilings: DeviceCeilings) -> None:
        self.memory_bandwidth.labels(ceilings.device).set(ceilings.memory_bandwidth_bytes_per_s)
        self.peak_flops.labels(ceilings.device, ceilings.dtype).set(ceilings.peak_flops_per_s)

    def record_work(self, flops: float, read_bytes: float, steps: int = 1) -> None:
        self.model_flops.inc(flops)
        self.model_read_bytes.inc(read_bytes)
        self.engine_steps.inc(steps)


@functools.cache
def service_metrics(service: str) -> ServiceMetrics:
    """The process-wide metrics of `service` (declared once, however many servers a process builds)."""
    return ServiceMetrics(service)


def start_metrics_endpoint(host: str, port: int) -> tuple[object, int]:
    """Serve the default registry at http://host:port/metrics; returns (server, bound port)."""
    server, _thread = prometheus_client.start_http_server(port, addr=host)
    return server, server.server_port


def _code_name(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    code = context.code()
    if code is None or code == grpc.StatusCode.OK:
        if error is None:
            return "OK"
        if not isinstance(error, (GeneratorExit, asyncio.CancelledError)):
            return "UNKNOWN"
        # gRPC cancels the handler both when the client goes away and when the call's deadline passes
        remaining = context.time_remaining()
        return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts every RPC and times it from start to its last message, by method and final status code."""

    def __init__(self, metrics: ServiceMetrics):
        self.metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method.rsplit("/", 1)[-1]
        metrics = self.metrics

        def finish(context, started: float, error: BaseException | None) -> None:
            code = _code_name(context, error)
            metrics.rpc_requests.labels(method, code).inc()
            metrics.rpc_duration.labels(method, code).observe(time.perf_counter() - started)
            metrics.rpc_in_flight.labels(method).dec()

        behavior = handler.stream_stream or handler.unary_stream or handler.stream_unary or handler.unary_unary
        if inspect.isasyncgenfunction(behavior):  # streamed responses, yielded (else returned, or written)

            async def streaming(request_or_iterator, context):
                started, error = time.perf_counter(), None
                metrics.rpc_in_flight.labels(method).inc()
                try:
                    async for response in behavior(request_or_iterator, context):
                        yield response
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(context, started, error)

            wrapped = streaming
        else:

            async def unary(request_or_iterator, context):
                started, error = time.perf_counter(), None
                metrics.rpc_in_flight.labels(method).inc()
                try:
                    return await behavior(request_or_iterator, context)
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    finish(context, started, error)

            wrapped = unary

        factory = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(handler.request_streaming, handler.response_streaming)]
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
