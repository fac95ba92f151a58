"""A steady ASR step at N streams on the CPU (tiny preset, padded steps as the GPU path runs them): wall time per
step, the part outside the encoder+decoder call and the mel preprocessor (host work: features, bookkeeping, per
stream tensor calls), and torch calls per step. Run with PYTHONPATH at the checkout to measure:
    PYTHONPATH=<checkout> .venv/asr/bin/python results/cpu/asr_step_calls_2026-12-05/step_host.py 64,256,512"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from services.asr.backend import StreamSettings
from services.asr.backends.in_process import load_in_process
from services.asr.config import AsrConfig

STEPS = 20


class Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def measure(n: int) -> str:
    backend = load_in_process(
        AsrConfig(preset="tiny", max_streams=n, max_batch_streams=n, padded_steps=True, threads=1)
    )
    backend.warm_up()
    rng = np.random.default_rng(0)
    streams = [backend._new_stream(StreamSettings(f"s{i}", 320, False)) for i in range(n)]
    piece = (rng.standard_normal(5120) * 0.1).astype(np.float32)

    def feed() -> None:  # one chunk of audio per stream, as real-time clients send it
        for stream in streams:
            while stream.mel_available() < stream.mel_consumed + backend.chunk_mel(stream):
                stream.append(piece, time.perf_counter())

    model_s = [0.0]

    def timed(function):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                model_s[0] += time.perf_counter() - started

        return call

    for _ in range(3):
        feed()
        backend._step(streams)
    padded = backend.padded[320, False]
    padded.run = timed(padded.run)
    backend.model.preprocessor.forward = timed(backend.model.preprocessor.forward)
    total = 0.0
    for _ in range(STEPS):
        feed()
        started = time.perf_counter()
        backend._step(streams)
        total += time.perf_counter() - started
    host = (total - model_s[0]) / STEPS
    model = model_s[0]
    feed()
    with Calls() as calls:
        backend._step(streams)
    return (
        f"N={n:4d}  step {total / STEPS * 1e3:7.2f} ms  model+mel {model / STEPS * 1e3:7.2f} ms  "
        f"host {host * 1e3:6.2f} ms = {host / n * 1e6:5.1f} us/stream  torch calls/step {calls.count}"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    for n in (int(v) for v in sys.argv[1].split(",")):
        print(measure(n), flush=True)
