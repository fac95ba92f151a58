"""From the requests of one level to its `LevelResult`: throughput, per-request speed, latency percentiles.

What each target's numbers mean:
- llm, openai: tokens/s over all streams; per request, decode tokens/s after the first token; TTFT, ITL, e2e.
- asr: audio seconds recognised per second; per request, chunk duration ÷ chunk latency (how many times faster
  than real time a chunk is processed); final latency after end of speech; real time = every stream kept up.
- tts: audio seconds synthesised per second; per request, audio seconds ÷ synthesis time (1/RTF); first audio,
  inter-chunk gaps; real time = no playback underruns.
- voice: turns per second; per request, reply audio seconds ÷ time from end of speech to the last audio;
  end-of-speech → first audio (voice-to-voice) and each stage's share; real time = ASR kept up, no underruns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadgen.results import LevelResult, Percentiles, RequestRecord, ServerCounters

# The latency a level's objective applies to (the first in each level's latency table, too).
PRIMARY_LATENCY = {
    "llm": "ttft_s",
    "openai": "ttft_s",
    "asr": "final_latency_s",
    "tts": "first_audio_s",
    "voice": "voice_to_voice_s",
}
THROUGHPUT_UNIT = {"llm": "tokens/s", "openai": "tokens/s", "asr": "audio s/s", "tts": "audio s/s", "voice": "turns/s"}
SPEED_UNIT = {
    "llm": "tokens/s per stream",
    "openai": "tokens/s per stream",
    "asr": "× real time per chunk",
    "tts": "× real time (1/RTF)",
    "voice": "× real time (reply)",
}


def percentiles(values: Sequence[float]) -> Percentiles:
    if not len(values):
        return Percentiles(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    p50, p90, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 90, 95, 99])
    return Percentiles(float(p50), float(p90), float(p95), float(p99), float(np.mean(values)), len(values))


def _extra(records: Sequence[RequestRecord], name: str) -> list[float]:
    return [record.extra[name] for record in records if name in record.extra]


def _latencies(target: str, ok: Sequence[RequestRecord]) -> dict[str, list[float]]:
    firsts = [record.first_s for record in ok if record.first_s is not None]
    gaps = [gap for record in ok for gap in record.gaps_s]
    totals = [record.latency_s for record in ok]
    if target in ("llm", "openai"):
        return {"ttft_s": firsts, "itl_s": gaps, "e2e_s": totals}
    if target == "asr":
        return {
            "final_latency_s": _extra(ok, "final_latency_s"),
            "chunk_latency_s": gaps,
            "first_partial_s": firsts,
        }
    if target == "tts":
        return {"first_audio_s": firsts, "chunk_gap_s": gaps, "e2e_s": totals}
    return {
        "voice_to_voice_s": firsts,
        "asr_final_s": _extra(ok, "asr_final_s"),
        "llm_ttft_s": _extra(ok, "llm_ttft_s"),
        "tts_first_audio_s": _extra(ok, "tts_first_audio_s"),
        "turn_s": totals,
    }


def _speed(target: str, ok: Sequence[RequestRecord]) -> float:
    if target in ("llm", "openai"):
        speeds = _extra(ok, "decode_tokens_per_s")
    elif target == "asr":
        speeds = [record.extra["chunk_s"] / gap for record in ok for gap in record.gaps_s if gap > 0]
        return float(np.median(speeds)) if speeds else 0.0
    elif target == "tts":
        speeds = [record.units / record.latency_s for record in ok if record.latency_s > 0]
    else:
        speeds = [
            record.extra["reply_audio_s"] / (record.latency_s - record.extra["utterance_s"])
            for record in ok
            if record.latency_s > record.extra.get("utterance_s", 0.0)
        ]
    return float(np.mean(speeds)) if speeds else 0.0


def _realtime(target: str, ok: Sequence[RequestRecord]) -> tuple[bool | None, dict[str, float]]:
    if target == "asr":
        kept_up = _extra(ok, "kept_up")
        return (bool(kept_up) and all(kept_up)), {"streams_kept_up_share": float(np.mean(kept_up)) if kept_up else 0.0}
    if target in ("tts", "voice"):
        underruns = _extra(ok, "underruns")
        extra = {"underruns": float(sum(underruns)), "underrun_s": float(sum(_extra(ok, "underrun_s")))}
        realtime = bool(ok) and not any(underruns)
        if target == "voice":
            realtime = realtime and all(_extra(ok, "asr_kept_up"))
        return realtime, extra
    return None, {}


def level_result(
    target: str,
    concurrency: int,
    records: Sequence[RequestRecord],
    duration_s: float,
    server: ServerCounters,
    loadgen_cpu: float = 0.0,
) -> LevelResult:
    ok = [record for record in records if record.ok]
    errors = [record for record in records if not record.ok]
    realtime_ok, extra = _realtime(target, ok)
    if realtime_ok is not None:
        extra["realtime_streams"] = float(concurrency if realtime_ok else 0)
    extra["requests_per_s"] = len(ok) / duration_s if duration_s > 0 else 0.0
    for record in errors:  # error kinds, so a report says *what* failed
        kind = record.error.split(":", 1)[0]
        extra[f"errors.{kind}"] = extra.get(f"errors.{kind}", 0.0) + 1
    return LevelResult(
        concurrency=concurrency,
        duration_s=duration_s,
        requests=len(ok),
        errors=len(errors),
        throughput=sum(record.units for record in ok) / duration_s if duration_s > 0 else 0.0,
        throughput_unit=THROUGHPUT_UNIT[target],
        per_request_speed=_speed(target, ok),
        latency={name: percentiles(values) for name, values in _latencies(target, ok).items()},
        server=server,
        realtime_ok=realtime_ok,
        loadgen_cpu=loadgen_cpu,
        extra=extra,
    )
