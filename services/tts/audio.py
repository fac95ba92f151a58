"""Output formatting of model audio: resampling from the native 48 kHz and sample encoding.

Resampling is done by soxr's streaming resampler, which keeps its filter state from one patch to the next, so
the concatenated chunks equal one resampling of the whole signal (no clicks at patch seams). It holds back a
few milliseconds of filter delay, released by `flush()` at the end of the request.
"""

from __future__ import annotations

import numpy as np


class AudioFormatter:
    """Turns float32 patches at `native_rate` into bytes at `rate`, PCM16 or float32, little-endian."""

    def __init__(self, native_rate: int, rate: int, pcm16: bool):
        self.pcm16 = pcm16
        self._resampler = None
        if rate != native_rate:
            import soxr

            self._resampler = soxr.ResampleStream(native_rate, rate, 1, dtype="float32", quality="HQ")

    def _encode(self, samples: np.ndarray) -> bytes:
        if self.pcm16:
            return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
        return samples.astype("<f4", copy=False).tobytes()

    def convert(self, samples: np.ndarray) -> tuple[bytes, int]:
        """Bytes and sample count of one patch at the output rate."""
        samples = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples)
        return self._encode(samples), len(samples)

    def flush(self) -> tuple[bytes, int]:
        """What the resampler still holds at the end of the request (nothing at the native rate)."""
        if self._resampler is None:
            return b"", 0
        samples = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return self._encode(samples), len(samples)


def decode_audio(audio: bytes, pcm16: bool) -> np.ndarray:
    """float32 samples of an AudioChunk's bytes (for clients, tests and the benchmark)."""
    if pcm16:
        return np.frombuffer(audio, dtype="<i2").astype(np.float32) / 32767.0
    return np.frombuffer(audio, dtype="<f4")
