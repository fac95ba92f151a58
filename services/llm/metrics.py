"""The LLM service's own metrics (the shared RPC, ceiling and work metrics come from voiceagent.serving).

Latencies are measured by the service from the moment a request passes validation, with voice-latency
buckets; queue time and the running/waiting gauges come from vLLM's scheduler once per engine step. vLLM's
own `vllm:*` metrics are exported on the same endpoint (`export_engine_metrics`).
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from services.llm.backend import FINISH_REASONS
from voiceagent.serving.metrics import LATENCY_BUCKETS_S

time_to_first_token = Histogram(
    "voiceagent_llm_time_to_first_token_seconds",
    "From a request passing validation to its first generated token",
    buckets=LATENCY_BUCKETS_S,
)
inter_token_latency = Histogram(
    "voiceagent_llm_inter_token_latency_seconds",
    "Between consecutive generated tokens of a request (a delta of n tokens counts n gaps of 1/n)",
    buckets=LATENCY_BUCKETS_S,
)
e2e_latency = Histogram(
    "voiceagent_llm_e2e_latency_seconds",
    "From a request passing validation to its last token, by finish reason",
    ["finish_reason"],
    buckets=LATENCY_BUCKETS_S,
)
queue_time = Histogram(
    "voiceagent_llm_queue_time_seconds",
    "Time a request waited in the engine's queue before its first scheduling",
    buckets=LATENCY_BUCKETS_S,
)
# The engine's own state, reported once per step to one of the front ends (vLLM sends a step's scheduler stats to
# one client): with several front-end processes the pod shows the most recent report, not one series each.
requests_running = Gauge(
    "voiceagent_llm_requests_running", "Requests in the engine's running batch", multiprocess_mode="mostrecent"
)
requests_waiting = Gauge(
    "voiceagent_llm_requests_waiting",
    "Requests queued in the engine, not yet scheduled",
    multiprocess_mode="mostrecent",
)
kv_cache_usage = Gauge(
    "voiceagent_llm_kv_cache_usage_ratio", "Share of the KV cache blocks in use (0-1)", multiprocess_mode="mostrecent"
)
prompt_tokens = Counter("voiceagent_llm_prompt_tokens", "Prompt tokens of admitted requests")
generated_tokens = Counter("voiceagent_llm_generated_tokens", "Tokens generated and streamed")
cached_prompt_tokens = Counter("voiceagent_llm_cached_prompt_tokens", "Prompt tokens served from the prefix cache")

for _reason in FINISH_REASONS:
    e2e_latency.labels(_reason)


def export_engine_metrics(engine_registry: CollectorRegistry) -> None:
    """Serve vLLM's `vllm:*` metrics on our endpoint. They already live in the default registry unless
    vLLM runs with PROMETHEUS_MULTIPROC_DIR, in which case its registry is added as one collector; but not in a
    front end of several (voiceagent/serving/frontends.py), whose supervisor serves every process's files."""
    if engine_registry is not REGISTRY and not os.environ.get("VOICEAGENT_FRONTEND"):
        REGISTRY.register(engine_registry)
