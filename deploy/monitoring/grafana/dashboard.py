"""Build the Grafana dashboard `dashboards/voiceagent.json` from the panel lists below.

`python deploy/monitoring/grafana/dashboard.py` rewrites the JSON; tests/deploy checks that the committed file
is up to date and that every PromQL expression in it returns data from the real services. One row per service:
traffic, latency, concurrency, batching, and live bandwidth / FLOP utilisation against the device ceilings
the service measured at start-up (model-derived work counters over the measured ceilings).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent / "dashboards" / "voiceagent.json"
RATE = "$__rate_interval"  # Grafana's window: at least four scrape intervals
QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    max_value: float | None = None


@dataclass(frozen=True)
class ServiceRow:
    service: str
    title: str
    active: tuple[Target, ...] = ()  # what "busy" means for this service, beside RPCs in flight
    batch: tuple[Target, ...] = ()  # how many requests one engine step serves (TTS: one per model worker)
    latency: tuple[Panel, ...] = field(default=())  # the service's own latency histograms


def quantiles(histogram: str, by: str, legend: str) -> tuple[Target, ...]:
    return tuple(
        Target(
            f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({histogram}_bucket[{RATE}])))",
            f"p{round(q * 100)} {legend}".strip(),
        )
        for q in QUANTILES
    )


def utilisation(service: str, counter: str, ceiling: str) -> str:
    return (
        f"sum by (instance) (rate(voiceagent_{service}_{counter}[{RATE}]))"
        f" / max by (instance) (voiceagent_{service}_{ceiling})"
    )


def service_panels(row: ServiceRow) -> list[Panel]:
    s = f"voiceagent_{row.service}"
    panels = [
        Panel(
            "Requests / s",
            "reqps",
            (Target(f"sum by (method, code) (rate({s}_rpc_requests_total[{RATE}]))", "{{method}} {{code}}"),),
        ),
        Panel("RPC latency", "s", quantiles(f"{s}_rpc_duration_seconds", "method", "{{method}}")),
        Panel(
            "Active",
            "short",
            (Target(f"sum by (method) ({s}_rpc_in_flight)", "in flight {{method}}"), *row.active),
        ),
    ]
    if row.batch:
        panels.append(Panel("Batch size", "short", row.batch, "requests served by one engine step"))
    panels += [
        Panel(
            "Bandwidth utilisation",
            "percentunit",
            (
                Target(
                    utilisation(row.service, "model_read_bytes_total", "device_memory_bandwidth_bytes_per_second"),
                    "{{instance}}",
                ),
            ),
            "bytes the engine's steps must read per second / measured device read bandwidth",
        ),
        Panel(
            "Compute utilisation",
            "percentunit",
            (Target(utilisation(row.service, "model_flops_total", "device_peak_flops_per_second"), "{{instance}}"),),
            "FLOPs the engine's steps must do per second / measured matmul peak in the serving dtype",
        ),
        Panel(
            "Bandwidth: achieved vs ceiling",
            "Bps",
            (
                Target(f"sum by (instance) (rate({s}_model_read_bytes_total[{RATE}]))", "achieved {{instance}}"),
                Target(f"max by (instance) ({s}_device_memory_bandwidth_bytes_per_second)", "ceiling {{instance}}"),
            ),
        ),
        Panel(
            "Compute: achieved vs ceiling",
            "flops",
            (
                Target(f"sum by (instance) (rate({s}_model_flops_total[{RATE}]))", "achieved {{instance}}"),
                Target(f"max by (instance) ({s}_device_peak_flops_per_second)", "ceiling {{instance}}"),
            ),
        ),
        Panel(
            "Engine steps / s",
            "short",
            (Target(f"sum by (instance) (rate({s}_engine_steps_total[{RATE}]))", "{{instance}}"),),
        ),
        *row.latency,
    ]
    return panels


def mean(histogram: str, by: str) -> str:
    return f"sum by ({by}) (rate({histogram}_sum[{RATE}])) / sum by ({by}) (rate({histogram}_count[{RATE}]))"


ROWS = (
    ServiceRow(
        "asr",
        "ASR — streaming speech recognition",
        active=(Target("sum by (chunk_ms) (voiceagent_asr_active_streams)", "streams {{chunk_ms}} ms"),),
        batch=(
            Target(mean("voiceagent_asr_step_batch_streams", "chunk_ms"), "mean {{chunk_ms}} ms"),
            *quantiles("voiceagent_asr_step_batch_streams", "chunk_ms", "{{chunk_ms}} ms")[1:2],
        ),
        latency=(
            Panel(
                "Chunk processing latency",
                "s",
                quantiles("voiceagent_asr_chunk_processing_seconds", "chunk_ms", "{{chunk_ms}} ms"),
                "arrival of the audio completing a chunk -> its hypothesis; must stay below the chunk duration",
            ),
            Panel(
                "Final latency",
                "s",
                quantiles("voiceagent_asr_final_latency_seconds", "chunk_ms", "{{chunk_ms}} ms"),
                "end of a stream's audio -> its final hypothesis",
            ),
            Panel(
                "Audio processed (s/s) and encoder step time",
                "short",
                (
                    Target(f"sum(rate(voiceagent_asr_audio_processed_seconds_total[{RATE}]))", "audio s / s"),
                    *quantiles("voiceagent_asr_step_duration_seconds", "", "step s")[1:2],
                ),
                "audio seconds per second = real-time streams served",
            ),
        ),
    ),
    ServiceRow(
        "llm",
        "LLM — chat generation",
        active=(
            Target("sum(voiceagent_llm_requests_running)", "running"),
            Target("sum(voiceagent_llm_requests_waiting)", "waiting"),
        ),
        batch=(
            Target("sum(voiceagent_llm_requests_running)", "running batch"),
            Target(
                f"sum(rate(voiceagent_llm_generated_tokens_total[{RATE}]))"
                f" / sum(rate(voiceagent_llm_engine_steps_total[{RATE}]))",
                "tokens per engine step",
            ),
        ),
        latency=(
            Panel("Time to first token", "s", quantiles("voiceagent_llm_time_to_first_token_seconds", "", "")),
            Panel(
                "Inter-token latency and queue time",
                "s",
                (
                    *quantiles("voiceagent_llm_inter_token_latency_seconds", "", "inter-token"),
                    *quantiles("voiceagent_llm_queue_time_seconds", "", "queue")[1:2],
                ),
            ),
            Panel(
                "End-to-end latency",
                "s",
                quantiles("voiceagent_llm_e2e_latency_seconds", "finish_reason", "{{finish_reason}}"),
            ),
            Panel(
                "Tokens / s and KV cache",
                "short",
                (
                    Target(f"sum(rate(voiceagent_llm_generated_tokens_total[{RATE}]))", "generated tokens / s"),
                    Target(f"sum(rate(voiceagent_llm_prompt_tokens_total[{RATE}]))", "prompt tokens / s"),
                    Target("max(voiceagent_llm_kv_cache_usage_ratio)", "KV cache in use (0-1)"),
                ),
            ),
        ),
    ),
    ServiceRow(
        "tts",
        "TTS — speech synthesis",
        active=(
            Target("sum(voiceagent_tts_busy_workers)", "busy workers"),
            Target("sum(voiceagent_tts_queued_requests)", "queued requests"),
        ),
        batch=(
            Target("sum(voiceagent_tts_busy_workers)", "busy workers"),
            Target("sum(voiceagent_tts_workers)", "workers"),
        ),
        latency=(
            Panel(
                "Time to first audio",
                "s",
                quantiles("voiceagent_tts_time_to_first_audio_seconds", "method", "{{method}}"),
            ),
            Panel(
                "Inter-chunk gap and queue wait",
                "s",
                (
                    *quantiles("voiceagent_tts_inter_chunk_seconds", "method", "gap {{method}}")[1:],
                    *quantiles("voiceagent_tts_queue_seconds", "", "queue")[1:],
                ),
            ),
            Panel(
                "Real-time factor",
                "short",
                quantiles("voiceagent_tts_real_time_factor", "method", "{{method}}"),
                "generation time / audio seconds; above 1 playback underruns",
            ),
            Panel(
                "Audio produced (s/s)",
                "short",
                (Target(f"sum(rate(voiceagent_tts_audio_seconds_total[{RATE}]))", "audio s / s"),),
            ),
        ),
    ),
)


def grafana_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": panel.unit, "min": 0}
    if panel.max_value is not None:
        defaults["max"] = panel.max_value
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": t.expr, "legendFormat": t.legend, "range": True}
            for i, t in enumerate(panel.targets)
        ],
    }


def build() -> dict:
    ids = itertools.count(1)
    panels, y = [], 0
    for row in ROWS:
        panels.append(
            {
                "id": next(ids),
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, panel in enumerate(service_panels(row)):
            panels.append(grafana_panel(panel, next(ids), x=(i % 3) * 8, y=y + (i // 3) * 8))
        y += -(-len(service_panels(row)) // 3) * 8
    return {
        "uid": "voiceagent",
        "title": "voiceagent — ASR, LLM, TTS",
        "description": "Traffic, latency, batching and live bandwidth / compute utilisation against device ceilings",
        "tags": ["voiceagent"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    DASHBOARD.parent.mkdir(exist_ok=True)
    DASHBOARD.write_text(render())
    print(f"wrote {DASHBOARD}")
