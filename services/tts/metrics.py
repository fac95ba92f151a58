"""The TTS service's domain metrics, declared once (default registry, `voiceagent_tts_*`), and the per-request
recording around a backend's audio (`measure_synthesis`): first audio, gaps, patches, seconds, real-time factor.

Model work (FLOPs, bytes, engine steps = patches) goes to the shared `service_metrics("tts").record_work`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable

from prometheus_client import Counter, Gauge, Histogram

from services.tts.backend import AudioPiece, SpeechBackend, SynthesisRequest
from voiceagent.serving.metrics import LATENCY_BUCKETS_S

PREFIX = "voiceagent_tts"
METHODS = ("Synthesize", "StreamingSynthesize")
# Real-time factor: generation time / audio duration. < 1 keeps up with playback.
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


class TtsMetrics:
    def __init__(self) -> None:
        self.time_to_first_audio = Histogram(
            f"{PREFIX}_time_to_first_audio_seconds",
            "From the first synthesisable text (request start, or first phrase of a text stream) to the first audio",
            ["method"],
            buckets=LATENCY_BUCKETS_S,
        )
        self.inter_chunk = Histogram(
            f"{PREFIX}_inter_chunk_seconds",
            "Gap between consecutive audio chunks of one response",
            ["method"],
            buckets=LATENCY_BUCKETS_S,
        )
        self.real_time_factor = Histogram(
            f"{PREFIX}_real_time_factor",
            "Per request: worker time spent generating / seconds of audio produced",
            ["method"],
            buckets=RTF_BUCKETS,
        )
        self.patches = Counter(f"{PREFIX}_patches", "Audio patches generated (160 ms each at 25 Hz latents)")
        self.audio_seconds = Counter(f"{PREFIX}_audio_seconds", "Seconds of audio produced")
        self.segments = Counter(f"{PREFIX}_segments", "Text segments (phrases) synthesised", ["method"])
        self.queue_seconds = Histogram(
            f"{PREFIX}_queue_seconds", "Time a request waited for a free model worker", buckets=LATENCY_BUCKETS_S
        )
        # multiprocess_mode: how a pod of front-end processes adds up (batched --frontends); unused otherwise
        self.busy_workers = Gauge(
            f"{PREFIX}_busy_workers",
            "Model workers serving a request (batched: requests holding a slot)",
            multiprocess_mode="livesum",
        )
        self.workers = Gauge(f"{PREFIX}_workers", "Model workers (instances) in the pool", multiprocess_mode="max")
        self.queued_requests = Gauge(
            f"{PREFIX}_queued_requests", "Requests waiting for a model worker", multiprocess_mode="livesum"
        )
        # The batched engine's steps (the worker pool has none of these: one request per worker)
        self.batch_requests = Histogram(
            f"{PREFIX}_step_requests",
            "Requests advanced by one batched engine step (one patch each)",
            buckets=BATCH_BUCKETS,
        )
        self.step_batch = Gauge(
            f"{PREFIX}_step_batch_requests",
            "Requests advanced by the latest batched step",
            multiprocess_mode="mostrecent",
        )
        self.step_seconds = Histogram(
            f"{PREFIX}_step_seconds", "Wall time of one batched engine step", buckets=LATENCY_BUCKETS_S
        )
        self.step_launch_seconds = Histogram(
            f"{PREFIX}_step_launch_seconds",
            "Host time of a batched step's launch (inputs into the graph's buffers, the replay issued), of its wall",
            buckets=LATENCY_BUCKETS_S,
        )
        self.step_pass_wait_seconds = Histogram(
            f"{PREFIX}_step_pass_wait_seconds",
            "Time a batched step waited, once the device was done, for a prefill pass started beside it, of its wall",
            buckets=LATENCY_BUCKETS_S,
        )
        self.prefill_seconds = Histogram(
            f"{PREFIX}_prefill_seconds",
            "Prefill work done between two batched steps (the running requests wait for it)",
            buckets=LATENCY_BUCKETS_S,
        )
        self.hidden_prefill_seconds = Histogram(
            f"{PREFIX}_hidden_prefill_seconds",
            "Prefill work launched while a batched step ran on the device (CUDA; nobody waits for it), per step",
            buckets=LATENCY_BUCKETS_S,
        )
        self.first_patch_steps = Histogram(
            f"{PREFIX}_first_patch_steps",
            "Batched steps from a segment's text reaching the engine to its first patch, its own step included "
            "(1: prefilled at the next step boundary; 2: it also waited for the step in flight)",
            buckets=BATCH_BUCKETS,
        )
        for method in METHODS:
            for labelled in (self.time_to_first_audio, self.inter_chunk, self.real_time_factor, self.segments):
                labelled.labels(method)


@functools.cache
def tts_metrics() -> TtsMetrics:
    return TtsMetrics()


class _FirstText:
    """Wraps a segment iterator and notes when the first segment became available (time-to-first-audio start)."""

    def __init__(self, segments: AsyncIterator[str]):
        self._segments = segments
        self.at: float | None = None

    async def __aiter__(self):
        async for segment in self._segments:
            if self.at is None:
                self.at = time.perf_counter()
            yield segment


async def measure_synthesis(
    backend: SpeechBackend,
    request: SynthesisRequest,
    method: str,
    interrupted: Callable[[], BaseException | None] = lambda: None,
) -> AsyncIterator[AudioPiece]:
    """`backend.synthesize(request)`, recording the request's metrics under `method` as its pieces pass.

    `interrupted` is asked before each piece: an error it returns (bad text read mid-stream) is raised there,
    before the piece counts."""
    metrics = tts_metrics()
    first_text = _FirstText(request.segments)
    request = dataclasses.replace(request, segments=aiter(first_text))
    rate = request.sample_rate_hz
    index, samples, last_at, segments = 0, 0, 0.0, set()
    try:
        async with contextlib.aclosing(backend.synthesize(request)) as pieces:
            async for piece in pieces:
                if (error := interrupted()) is not None:
                    raise error
                now = time.perf_counter()
                if index == 0:
                    metrics.time_to_first_audio.labels(method).observe(now - (first_text.at or now))
                elif piece.patches:
                    metrics.inter_chunk.labels(method).observe(now - last_at)
                last_at = now
                metrics.patches.inc(piece.patches)
                metrics.audio_seconds.inc(piece.samples / rate)
                segments.add(piece.segment_index)
                yield piece
                index += 1
                samples += piece.samples
                if piece.is_last and samples:
                    metrics.real_time_factor.labels(method).observe(piece.generation_s / (samples / rate))
    finally:
        metrics.segments.labels(method).inc(len(segments))
