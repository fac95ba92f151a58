"""The main job's start-up: each service measures its device ceilings while no other service is starting, and
says when and how it measured them."""

from __future__ import annotations

import contextlib

import grpc

from loadgen.main_job import start_services
from voiceagent.v1 import asr_pb2_grpc, common_pb2, tts_pb2_grpc

STUBS = {"asr": asr_pb2_grpc.SpeechRecognizerStub, "tts": tts_pb2_grpc.SpeechSynthesizerStub}


def test_no_ceiling_probe_overlaps_another_services_start_up(tmp_path):
    services = {}
    with contextlib.ExitStack() as stack:
        stack.callback(lambda: [service.stop() for service in services.values()])
        start_services(tmp_path, {"asr": "tiny", "tts": "tiny"}, services)
        probes = {}
        for name, service in services.items():
            with grpc.insecure_channel(service.address) as channel:
                ceilings = STUBS[name](channel).GetInfo(common_pb2.InfoRequest(), timeout=10).ceilings
            assert ceilings.method.startswith("start-up probe") and ceilings.background_cores >= 0
            assert service.started_at < ceilings.measured_at_unix_s < service.serving_at
            probes[name] = (ceilings.measured_at_unix_s - ceilings.probe_s, ceilings.measured_at_unix_s)

    for name, (probe_start, probe_end) in probes.items():
        for other, service in services.items():
            if other != name:  # another service loading its engine while this one probed would load the device
                overlap = min(probe_end, service.serving_at) - max(probe_start, service.started_at)
                assert overlap <= 0, f"{name}'s probe overlapped {other}'s start-up by {overlap:.1f} s"
