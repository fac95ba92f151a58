"""Streaming handlers that write with `context.write` (coroutines, not async generators) pass the shared runtime's
interceptors: grpc.health.v1's Watch is one. The RPC metrics interceptor wrapped every streaming handler as an
async generator, so Watch ended UNKNOWN ("'async for' requires an object with __aiter__ method, got coroutine")
in every service; the TTS service's audio is written that way now too. Over a real channel to the runtime's test
service."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.harness import sample_sum, scrape_samples

CORRUPT = b"\x0a\xff\xff\xff\xff\x0f"  # a length far past the message's end


def test_health_watch_streams_the_status_and_is_counted(paced):
    counted = "voiceagent_paced_rpc_requests_total"
    before = sample_sum(scrape_samples(paced.metrics_url), counted, 0.0, method="Watch")
    with grpc.insecure_channel(paced.address) as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(call).status == health_pb2.HealthCheckResponse.SERVING
        call.cancel()
    deadline = time.monotonic() + 5  # counted when it has ended (CANCELLED by the client)
    while sample_sum(scrape_samples(paced.metrics_url), counted, 0.0, method="Watch") < before + 1:
        assert time.monotonic() < deadline, "the Watch call was not counted"
        time.sleep(0.05)


def test_a_malformed_request_to_a_written_stream_is_invalid_argument(paced):
    with grpc.insecure_channel(paced.address) as channel:
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
        try:
            list(watch(CORRUPT, timeout=10))
            raise AssertionError("a corrupt request was served")
        except grpc.RpcError as refused:
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
            assert refused.details().startswith("request: not a valid message"), refused.details()
