"""Test-side helpers: clips, request streams, recorded encoder outputs and metric samples."""

from __future__ import annotations

import math
import sys
import threading
import time

import grpc
import numpy as np

from tests.harness import sample_sum, scrape_samples
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2

PCM16 = common_pb2.AUDIO_ENCODING_PCM16
FLOAT32 = common_pb2.AUDIO_ENCODING_FLOAT32
CHUNK_MS = (80, 160, 320, 560, 1120)


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise with a slow envelope: random weights make any audio as good as speech for exactness tests."""
    rng = np.random.default_rng(seed)
    samples = int(seconds * 16000)
    envelope = 0.5 + 0.5 * np.sin(np.linspace(0, 6 * np.pi, samples))
    return (rng.standard_normal(samples) * 0.2 * envelope).astype(np.float32)


def config(chunk_ms: int = 320, encoding: int = FLOAT32, request_id: str = "", **fields):
    values = dict(sample_rate_hz=16000, encoding=encoding, chunk_ms=chunk_ms, interim_results=True)
    values.update(fields)
    return asr_pb2.RecognitionConfig(request_id=request_id, **values)


def requests(cfg, audio: np.ndarray, piece_samples: int = 2000):
    yield asr_pb2.StreamingRecognizeRequest(config=cfg)
    payload = audio.astype("<f4") if cfg.encoding == FLOAT32 else (audio * 32767).astype("<i2")
    for start in range(0, len(payload), piece_samples):
        yield asr_pb2.StreamingRecognizeRequest(audio=payload[start : start + piece_samples].tobytes())


def stub(service) -> asr_pb2_grpc.SpeechRecognizerStub:
    """A stub on a connection of its own: by default gRPC shares one connection among the channels to a target
    while any of them lives, so the calls of a test that meant to open new connections (and reach either front end
    of a pod, test_frontends.py) all went to one, as long as earlier channels had not been collected yet."""
    channel = grpc.insecure_channel(service.address, options=[("grpc.use_local_subchannel_pool", 1)])
    return asr_pb2_grpc.SpeechRecognizerStub(channel)


def stream(service, cfg, audio: np.ndarray) -> list:
    return list(stub(service).StreamingRecognize(requests(cfg, audio), timeout=120))


def streams_together(service, configs: list, audios: list[np.ndarray], spacing_s: float = 0.0) -> list[list]:
    """Each (config, audio) streamed from its own thread, all released at once; stream i starts i x
    `spacing_s` later. Returns each stream's responses."""
    results: list[list] = [[] for _ in configs]
    start = threading.Barrier(len(configs))

    def run(index):
        start.wait()
        time.sleep(index * spacing_s)
        results[index] = stream(service, configs[index], audios[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(configs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def recorded(record_dir, request_id: str, backend: str, kind: str) -> tuple[np.ndarray, list[int]]:
    data = np.load(record_dir / f"{request_id}.{backend}.{kind}.npz")
    return data["encoded"], data["token_ids"].tolist()


def equals_offline(service, record_dir, request_id: str, chunk_ms: int, audio: np.ndarray, final) -> None:
    """The stream `request_id` (its final response `final`) equals a Recognize of the same clip: the encoder outputs
    both recorded (within float reordering), their tokens, their transcripts."""
    offline = stub(service).Recognize(
        asr_pb2.RecognizeRequest(config=config(chunk_ms, request_id=request_id), audio=audio.tobytes()), timeout=60
    )
    streamed, streamed_tokens = recorded(record_dir, request_id, "nemo-cache-aware", "streaming")
    reference, reference_tokens = recorded(record_dir, request_id, "nemo-cache-aware", "offline")
    assert streamed.shape == reference.shape
    np.testing.assert_allclose(streamed, reference, atol=1e-4, rtol=0)  # float reordering only
    assert streamed_tokens == reference_tokens
    assert final.is_final and final.transcript == offline.transcript


def metric(service, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when there are none yet)."""
    return sample_sum(scrape_samples(service.metrics_url), name, default=0.0, **labels)


def encoder_frames_of(samples: int) -> int:
    """Offline encoder frames of a clip: mel frames M = samples // 160; causal 8x subsampling gives
    frame 0 from mel frame 0 alone, then one frame per 8 mel frames begun: 1 + ceil((M - 1) / 8)."""
    mel = samples // 160
    return 0 if mel == 0 else 1 + math.ceil((mel - 1) / 8)


def hold_stream(
    address: str, request_id: str, seconds: float = 60, channel: grpc.Channel | None = None
) -> tuple[grpc.Channel, grpc.Future]:
    """Open a stream that sends its config and 0.5 s of audio, then neither sends nor closes; wait for
    its first hypothesis (the stream then holds a cache slot). Returns the channel (keep it: a collected
    channel cancels its calls; `channel` to open it on a given one) and the call."""
    messages = list(requests(config(320, request_id=request_id), clip(0.5)))

    def hold():
        yield from messages
        time.sleep(seconds)

    channel = channel or grpc.insecure_channel(address)
    call = asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(hold())
    next(call)
    return channel, call


if __name__ == "__main__":  # a client process the tests kill: `python -m tests.asr.client ADDRESS`
    _held = hold_stream(sys.argv[1], "killed")
    print("open", flush=True)
    time.sleep(60)
