"""One streaming call to each service, timed from the client's side; the users and the voice turn compose them.

Each function fills a `RequestRecord` (first chunk, gaps, units, target-specific extras) and returns what the
next stage of a voice turn needs. Times are `time.perf_counter()` seconds.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator

import gevent
import numpy as np

from loadgen.results import RequestRecord
from loadgen.speech import SAMPLE_RATE_HZ, pcm16
from loadgen.timing import Playback, TokenClock
from loadgen.workload import Workload
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2, llm_pb2, llm_pb2_grpc, tts_pb2, tts_pb2_grpc


def recognise(
    channel, audio: np.ndarray, workload: Workload, record: RequestRecord, started: float
) -> tuple[str, float, float]:
    """Stream `audio` to ASR paced in real time; returns (final transcript, end of speech, final arrival).

    A piece of `chunk_ms` audio is sent when a microphone would have delivered it (at the end of its audio).
    A response's latency is measured from the send of the piece that completed the audio it reports as
    processed; the final's latency from the end of speech (half-close).
    """
    chunk_s = workload.chunk_ms / 1000
    samples = int(chunk_s * SAMPLE_RATE_HZ)
    pieces = [audio[i : i + samples] for i in range(0, len(audio), samples)]
    audio_end_s: list[float] = []  # cumulative audio seconds after each piece
    sent_at: list[float] = []

    def requests() -> Iterator[asr_pb2.StreamingRecognizeRequest]:
        yield asr_pb2.StreamingRecognizeRequest(
            config=asr_pb2.RecognitionConfig(
                sample_rate_hz=SAMPLE_RATE_HZ,
                encoding=common_pb2.AUDIO_ENCODING_PCM16,
                chunk_ms=workload.chunk_ms,
                interim_results=True,
            )
        )
        spoken = 0.0
        for piece in pieces:
            spoken += len(piece) / SAMPLE_RATE_HZ
            gevent.sleep(max(0.0, started + spoken - time.perf_counter()))
            sent_at.append(time.perf_counter())
            audio_end_s.append(spoken)
            yield asr_pb2.StreamingRecognizeRequest(audio=pcm16(piece))

    stub = asr_pb2_grpc.SpeechRecognizerStub(channel)
    transcript, final_at, server_latency = "", 0.0, []
    for response in stub.StreamingRecognize(requests(), timeout=workload.timeout_s):
        now = time.perf_counter()
        if record.first_s is None:
            record.first_s = now - started
        server_latency.append(response.processing_latency_s)
        transcript = response.transcript
        if response.is_final:
            final_at = now
            continue
        piece = min(bisect.bisect_left(audio_end_s, response.audio_processed_s - 1e-6), len(sent_at) - 1)
        if piece >= 0:
            record.gaps_s.append(now - sent_at[piece])
    if not final_at:
        raise RuntimeError("stream ended without a final result")
    end_of_speech = sent_at[-1]
    audio_s = len(audio) / SAMPLE_RATE_HZ
    chunk_latencies = record.gaps_s or [final_at - end_of_speech]
    rtf = float(np.mean(chunk_latencies)) / chunk_s  # per-stream real-time factor: processing time ÷ audio time
    record.units = audio_s
    record.extra.update(
        audio_s=audio_s,
        final_latency_s=final_at - end_of_speech,
        chunk_s=chunk_s,
        rtf=rtf,
        # Kept up: chunks were processed faster than they arrived (RTF < 1) and no backlog built up (95% of
        # chunks answered within two chunk durations); single spikes on a busy machine are not a backlog.
        kept_up=float(rtf < 1 and np.percentile(chunk_latencies, 95) <= 2 * chunk_s),
        server_processing_latency_s=float(np.mean(server_latency)) if server_latency else 0.0,
    )
    return transcript, end_of_speech, final_at


def generate(
    channel, request: llm_pb2.GenerateRequest, workload: Workload, record: RequestRecord, started: float,
    on_text: Callable[[str], None] | None = None,
) -> str:  # fmt: skip
    """Stream one generation; `on_text` gets each text delta as it arrives (the voice turn pipes it to TTS)."""
    stub = llm_pb2_grpc.TextGeneratorStub(channel)
    clock, text, completion = TokenClock(record, started), [], None
    for response in stub.Generate(request, timeout=workload.timeout_s):
        clock.arrived(time.perf_counter(), len(response.token_ids) or (1 if response.text else 0))
        if response.text:
            text.append(response.text)
            if on_text is not None:
                on_text(response.text)
        if response.HasField("completion"):
            completion = response.completion
    clock.finish(completion.usage.completion_tokens if completion is not None else 0)
    if completion is not None:
        record.extra.update(
            prompt_tokens=float(completion.usage.prompt_tokens),
            server_ttft_s=completion.timings.time_to_first_token_s,
            queue_s=completion.timings.queue_s,
        )
    return "".join(text)


def receive_audio(
    responses: Iterable[tts_pb2.AudioChunk], record: RequestRecord, started: float, playback: Playback
) -> float:
    """Consume a TTS response stream: first audio, inter-chunk gaps, underruns; returns the audio seconds."""
    last = None
    for chunk in responses:
        now = time.perf_counter()
        duration_s = chunk.duration_s or _duration_s(chunk)
        if not duration_s:
            continue
        if record.first_s is None:
            record.first_s = now - started
            record.extra["queue_s"] = chunk.queue_s
        if last is not None:
            record.gaps_s.append(now - last)
        last = now
        playback.arrive(now, duration_s)
    record.units = playback.delivered_s
    record.extra.update(
        underruns=float(playback.underruns), underrun_s=playback.stalled_s, audio_s=playback.delivered_s
    )
    return playback.delivered_s


def _duration_s(chunk: tts_pb2.AudioChunk) -> float:
    width = 2 if chunk.encoding == common_pb2.AUDIO_ENCODING_PCM16 else 4
    return len(chunk.audio) / width / chunk.sample_rate_hz if chunk.sample_rate_hz else 0.0


def synthesis_config(workload: Workload) -> tts_pb2.SynthesisConfig:
    config = tts_pb2.SynthesisConfig(encoding=common_pb2.AUDIO_ENCODING_PCM16)
    if workload.inference_timesteps is not None:
        config.inference_timesteps = workload.inference_timesteps
    return config


def synthesize(channel, text: str, workload: Workload, record: RequestRecord, started: float) -> None:
    stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
    request = tts_pb2.SynthesizeRequest(text=text, config=synthesis_config(workload))
    audio_s = receive_audio(stub.Synthesize(request, timeout=workload.timeout_s), record, started, Playback())
    record.extra["rtf"] = (time.perf_counter() - started) / audio_s if audio_s else 0.0
    record.extra["words"] = float(len(text.split()))
