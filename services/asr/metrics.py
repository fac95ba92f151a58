"""The ASR service's own metrics (the shared RPC, ceiling and work metrics come from voiceagent.serving).

Everything that lets an operator read real-time factor and batching efficiency: per-chunk processing
latency, end-of-audio→final latency, active streams, streams per encoder step, encoder frames computed and
audio seconds processed (encoder frames / audio seconds = 12.5 exactly when every frame is computed once).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from voiceagent.serving.metrics import LATENCY_BUCKETS_S

CHUNK_MS = ("80", "160", "320", "560", "1120")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

chunk_processing = Histogram(
    "voiceagent_asr_chunk_processing_seconds",
    "From arrival of the audio that completed a chunk to its hypothesis (queueing + encoder step + decoding)",
    ["chunk_ms"],
    buckets=LATENCY_BUCKETS_S,
)
final_latency = Histogram(
    "voiceagent_asr_final_latency_seconds",
    "From the end of a stream's audio (half-close) to its final hypothesis",
    ["chunk_ms"],
    buckets=LATENCY_BUCKETS_S,
)
active_streams = Gauge("voiceagent_asr_active_streams", "Streams holding a cache slot, by chunk size", ["chunk_ms"])
step_batch = Histogram(
    "voiceagent_asr_step_batch_streams",
    "Streams stepped together in one batched encoder step",
    ["chunk_ms"],
    buckets=BATCH_BUCKETS,
)
step_duration = Histogram(
    "voiceagent_asr_step_duration_seconds",
    "Wall time of one batched encoder + decoder step, from its host work's start to its tokens on the host",
    ["chunk_ms"],
    buckets=LATENCY_BUCKETS_S,
)
overlapped_steps = Counter(
    "voiceagent_asr_overlapped_steps",
    "Steps launched while the step before them was still on the device (--overlap-steps): host and device busy "
    "together",
    ["chunk_ms"],
)
encoder_frames = Counter(
    "voiceagent_asr_encoder_frames",
    "80 ms encoder frames computed (the buffered baseline recomputes its window's frames every step)",
    ["chunk_ms"],
)
audio_processed = Counter(
    "voiceagent_asr_audio_processed_seconds", "Seconds of audio consumed by the encoder", ["chunk_ms"]
)
padded_rows = Counter(
    "voiceagent_asr_padded_step_rows",
    "Rows of steady steps run on padded batch-size buckets (CUDA graphs on a GPU), by kind: stream or padding",
    ["chunk_ms", "kind"],
)

offline_requests = Gauge(
    "voiceagent_asr_offline_requests", "Recognize calls the engine is transcribing (or waiting to) right now"
)

# What the engine process records and forwards to the gRPC process's registry (backends/engine_process.py).
FORWARDED = (
    "chunk_processing", "final_latency", "active_streams", "step_batch", "step_duration", "encoder_frames",
    "audio_processed", "padded_rows", "offline_requests", "overlapped_steps",
)  # fmt: skip


def observe_all(histogram, values) -> None:
    """`histogram.observe(value)` for each value. In the engine process the histogram stands in for the gRPC
    process's (backends/engine_process.py), and the values travel as one message, not one per value."""
    forwarded = getattr(histogram, "forward_observations", None)
    if forwarded is not None:
        forwarded(values)
        return
    for value in values:
        histogram.observe(value)


for _chunk in CHUNK_MS:
    for _metric in (chunk_processing, final_latency, active_streams, step_batch, step_duration):
        _metric.labels(_chunk)
    encoder_frames.labels(_chunk)
    audio_processed.labels(_chunk)
    overlapped_steps.labels(_chunk)
    for _kind in ("stream", "padding"):
        padded_rows.labels(_chunk, _kind)
backpressure = Counter(
    "voiceagent_asr_stream_backpressure_seconds",
    "Seconds the service did not read a stream's messages because its unprocessed audio was over "
    "--max-stream-backlog-s (a client sending faster than the engine steps it)",
)
