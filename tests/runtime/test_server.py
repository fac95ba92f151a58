"""The shared runtime over real channels: health lifecycle, reflection, metrics, SIGTERM drain, info."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.harness import sample_sum, scrape_samples, start_service, venv_python
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_is_not_serving_until_the_engine_has_loaded():
    service = start_service("tests.runtime.paced_service", venv_python("dev"), ["--load-s", "4"])
    try:
        assert service.health() == NOT_SERVING
        assert service.health("voiceagent.v1.SpeechSynthesizer") == NOT_SERVING
        service.wait_serving(60)
        assert service.health() == SERVING
        assert service.health("voiceagent.v1.SpeechSynthesizer") == SERVING
    finally:
        assert service.terminate() == 0


def test_reflection_lists_the_services(paced):
    with grpc.insecure_channel(paced.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {service.name for service in next(responses).list_services_response.service}
    assert {
        "voiceagent.v1.SpeechSynthesizer",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


def test_reflection_answers_as_v1_too(paced):
    """grpc.reflection.v1 is v1alpha's messages under another package: v1alpha's classes speak it on the wire."""
    with grpc.insecure_channel(paced.address) as channel:
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="voiceagent.v1.SpeechSynthesizer"),
        ]
        listed, described = list(info(iter(requests), timeout=10))
    names = {service.name for service in listed.list_services_response.service}
    assert {"voiceagent.v1.SpeechSynthesizer", "grpc.reflection.v1.ServerReflection"} <= names
    (first, *_) = described.file_descriptor_response.file_descriptor_proto
    assert b"SpeechSynthesizer" in first


def test_metrics_endpoint_serves_rpc_histograms_with_voice_buckets(paced):
    before = scrape_samples(paced.metrics_url)
    assert sample_sum(before, "voiceagent_paced_rpc_requests_total", method="Synthesize", code="INVALID_ARGUMENT") == 0
    count_before = sample_sum(before, "voiceagent_paced_rpc_duration_seconds_count", method="Synthesize", code="OK")
    with grpc.insecure_channel(paced.address) as channel:
        chunks = list(tts_pb2_grpc.SpeechSynthesizerStub(channel).Synthesize(tts_pb2.SynthesizeRequest(text="abc")))
    assert len(chunks) == 3
    after = scrape_samples(paced.metrics_url)
    assert sample_sum(after, "voiceagent_paced_rpc_duration_seconds_count", method="Synthesize", code="OK") == (
        count_before + 1
    )
    bounds = sorted(
        {
            float(sample.labels["le"])
            for sample in after
            if sample.name == "voiceagent_paced_rpc_duration_seconds_bucket"
            and sample.labels.get("method") == "Synthesize"
            and sample.labels["le"] != "+Inf"
        }
    )
    assert bounds[0] == 0.001 and bounds[-1] == 10.0
    # Three chunks 100 ms apart: the observation lands in the 0.3-0.5 s bucket, not the first one.
    bucket = dict(method="Synthesize", code="OK", le="0.2")
    assert sample_sum(after, "voiceagent_paced_rpc_duration_seconds_bucket", **bucket) == (
        sample_sum(before, "voiceagent_paced_rpc_duration_seconds_bucket", **bucket)
    )
    assert sample_sum(after, "voiceagent_paced_device_memory_bandwidth_bytes_per_second") > 0


def test_sigterm_drains_an_in_flight_stream_and_refuses_new_ones():
    service = start_service("tests.runtime.paced_service", venv_python("dev"), ["--load-s", "0", "--grace-s", "20"])
    service.wait_serving(60)
    received: list[tts_pb2.AudioChunk] = []
    errors: list[grpc.RpcError] = []
    channel = grpc.insecure_channel(service.address)
    stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)

    def consume():
        try:
            for chunk in stub.Synthesize(tts_pb2.SynthesizeRequest(text="x" * 20), timeout=30):
                received.append(chunk)
        except grpc.RpcError as error:
            errors.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    while len(received) < 3:
        time.sleep(0.02)
    started_stop = time.monotonic()
    service.proc.send_signal(15)
    time.sleep(0.3)
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetInfo(common_pb2.InfoRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    consumer.join(30)
    assert service.proc.wait(30) == 0
    assert not errors, errors
    assert [chunk.chunk_index for chunk in received] == list(range(20))
    assert received[-1].is_last
    assert time.monotonic() - started_stop < 10
    assert "paced: engine closed" in service.output()
    channel.close()


def test_info_reports_device_ceilings_within_physical_limits(paced):
    with grpc.insecure_channel(paced.address) as channel:
        info = tts_pb2_grpc.SpeechSynthesizerStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=5)
    ceilings = info.ceilings
    assert ceilings.device == "cpu" and ceilings.device_name
    # A CPU socket reads well under 1 TB/s and multiplies well under 100 TFLOP/s; a real probe is above 1 GB/s.
    assert 1e9 < ceilings.memory_bandwidth_bytes_per_s < 1e12
    assert 1e9 < ceilings.peak_flops_per_s < 1e14
    assert ceilings.ridge_flops_per_byte == pytest.approx(
        ceilings.peak_flops_per_s / ceilings.memory_bandwidth_bytes_per_s
    )
    assert 0 < ceilings.probe_s < 15
    assert info.service == "paced" and info.limits["max_streams"] == 1


def test_a_call_past_its_deadline_is_counted_as_deadline_exceeded_and_a_cancelled_one_as_cancelled(paced):
    def count(code: str) -> float:
        samples = scrape_samples(paced.metrics_url)
        try:
            return sample_sum(samples, "voiceagent_paced_rpc_requests_total", method="Synthesize", code=code)
        except LookupError:  # no such call yet
            return 0.0

    before = {code: count(code) for code in ("DEADLINE_EXCEEDED", "CANCELLED")}
    with grpc.insecure_channel(paced.address) as channel:
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        with pytest.raises(grpc.RpcError) as late:
            list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="x" * 50), timeout=0.35))  # 0.1 s per chunk
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        call = stub.Synthesize(tts_pb2.SynthesizeRequest(text="x" * 50))
        next(call)
        call.cancel()
    deadline = time.monotonic() + 10
    while count("CANCELLED") < before["CANCELLED"] + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert count("DEADLINE_EXCEEDED") == before["DEADLINE_EXCEEDED"] + 1
    assert count("CANCELLED") == before["CANCELLED"] + 1
