"""What the sweep asks the services themselves: their GetInfo facts once, and their work counters per level."""

from __future__ import annotations

import dataclasses

from loadgen.results import ServerCounters, ServiceFacts
from voiceagent.serving.launcher import read_metrics
from voiceagent.serving.tls import PLAINTEXT, ClientTls, open_channel
from voiceagent.v1 import asr_pb2_grpc, common_pb2, llm_pb2_grpc, tts_pb2_grpc

_STUBS = {
    "asr": asr_pb2_grpc.SpeechRecognizerStub,
    "llm": llm_pb2_grpc.TextGeneratorStub,
    "tts": tts_pb2_grpc.SpeechSynthesizerStub,
}
scrape = read_metrics  # every sample of a Prometheus endpoint, by name with its labels
# Counter families every service exports (voiceagent/serving/metrics.py), by ServerCounters field.
_WORK = {"flops_per_s": "model_flops", "read_bytes_per_s": "model_read_bytes", "steps_per_s": "engine_steps"}


def service_facts(service: str, address: str, timeout_s: float = 10, tls: ClientTls = PLAINTEXT) -> ServiceFacts:
    with open_channel(address, tls) as channel:
        info = _STUBS[service](channel).GetInfo(common_pb2.InfoRequest(), timeout=timeout_s)
    return ServiceFacts.from_info(info)


def combined_facts(name: str, parts: list[ServiceFacts]) -> ServiceFacts:
    """Facts of several services sharing one device (the voice turn): weights add up, ceilings are the device's;
    each part's shape and limits are kept under its service's name."""
    first = parts[0]
    return dataclasses.replace(
        first,
        service=name,
        backend="+".join(part.backend for part in parts),
        preset="+".join(part.preset for part in parts),
        parameter_count=sum(part.parameter_count for part in parts),
        weight_bytes=sum(part.weight_bytes for part in parts),
        shape={f"{part.service}.{key}": value for part in parts for key, value in part.shape.items()},
        limits={f"{part.service}.{key}": value for part in parts for key, value in part.limits.items()},
    )


def counters(service: str, before: dict[str, float], after: dict[str, float], duration_s: float) -> ServerCounters:
    """Rates of the work counters over a level, plus per-step work and each domain counter's rate as extras."""

    def rate(name: str) -> float:
        return (after.get(name, 0.0) - before.get(name, 0.0)) / duration_s if duration_s > 0 else 0.0

    prefix = f"voiceagent_{service}_"
    work = {field: rate(f"{prefix}{metric}_total") for field, metric in _WORK.items()}
    extra: dict[str, float] = {}
    if work["steps_per_s"]:
        extra["flops_per_step"] = work["flops_per_s"] / work["steps_per_s"]
        extra["read_bytes_per_step"] = work["read_bytes_per_s"] / work["steps_per_s"]
    # Unlabelled domain counters and histogram sums (tokens, audio seconds, batch sizes ...) as rates.
    known = {f"{prefix}{metric}_total" for metric in _WORK.values()}
    for name in after:
        domain = name.startswith(prefix) and "{" not in name and name not in known
        if domain and name.endswith(("_total", "_sum", "_count")):
            extra[name.removeprefix(prefix) + "_per_s"] = rate(name)
    return ServerCounters(**work, extra=extra)


def sum_counters(parts: dict[str, ServerCounters]) -> ServerCounters:
    """One device's counters when several services share it; each part stays visible in the extras."""
    total = ServerCounters(
        flops_per_s=sum(part.flops_per_s for part in parts.values()),
        read_bytes_per_s=sum(part.read_bytes_per_s for part in parts.values()),
        steps_per_s=sum(part.steps_per_s for part in parts.values()),
    )
    for service, part in parts.items():
        total.extra.update(
            {f"{service}.flops_per_s": part.flops_per_s, f"{service}.read_bytes_per_s": part.read_bytes_per_s}
        )
    return total
