"""Streamed log-mel features: each frame computed once as audio arrives, many streams in one batched call."""

from __future__ import annotations

import numpy as np
import torch

from services.asr.engine.slots import upload

SAMPLE_RATE = 16000
HOP_SAMPLES = 160  # 10 ms mel hop
STFT_HALF_WINDOW = 256  # n_fft / 2: a mel frame centred at t needs samples up to t + 256
LEAD_FRAMES = 4  # a segment starts this many frames before its new ones (640 samples > the 257 a frame reaches back)


class FeatureStream:
    """Log-mel frames of a growing clip, each computed once, equal to one pass over the whole clip (to float
    rounding: batching changes the FFT/matmul blocking, observed <= 1 ulp).

    A frame centred on sample 160·t needs samples up to 160·t + 256, so frames lag the audio by 16 ms until
    the end, where the clip is closed the way the offline preprocessor closes it (zero padding). This class
    only cuts the audio; `mel_batch` computes many streams' segments in one batched preprocessor call.
    """

    def __init__(self, mel_bins: int):
        self.mel_bins = mel_bins
        self.samples = np.zeros(0, dtype=np.float32)
        self.sample_offset = 0  # clip index of self.samples[0]
        self.arrived: list[np.ndarray] = []  # pieces not joined to `samples` yet
        self.total_samples = 0
        self.mel_done = 0  # frames already returned

    def append(self, audio: np.ndarray) -> None:
        # Joined once per step in next_segment: joining per piece copies the kept samples again for every
        # piece (quadratic when a client sends many pieces between two steps).
        self.arrived.append(audio)
        self.total_samples += len(audio)

    def available(self, final: bool) -> int:
        """Mel frames that can be computed exactly now (all of them once the clip is closed)."""
        total = self.total_samples
        if final:
            return total // HOP_SAMPLES
        return max(0, (total - STFT_HALF_WINDOW) // HOP_SAMPLES + 1)

    def next_segment(self, final: bool, limit: int | None = None) -> tuple[np.ndarray, int, int]:
        """The audio the next frames are computed from, and which of its frames are new: (samples, skip, count).

        The segment starts 4 frames early (640 samples > the 257 the window and pre-emphasis reach back), on
        the hop grid, so its frames from `skip` on are the clip's own. With `limit`, frames from `limit` on are
        left for a later call: the segment then ends where frame `limit - 1`'s window does, so none of its frames
        reaches the clip's end (as for a clip still arriving). Marks the frames as taken."""
        available = self.available(final)
        end = available if limit is None else min(available, limit)
        if end <= self.mel_done:
            return self.samples[:0], 0, 0
        if self.arrived:
            self.samples = np.concatenate((self.samples, *self.arrived))
            self.arrived.clear()
        first = max(0, self.mel_done - LEAD_FRAMES)
        segment = self.samples[first * HOP_SAMPLES - self.sample_offset :]
        if end < available:  # frames only up to end - 1: its window ends STFT_HALF_WINDOW past its centre
            segment = segment[: (end - 1 - first) * HOP_SAMPLES + STFT_HALF_WINDOW]
        skip, count = self.mel_done - first, end - self.mel_done
        self.mel_done = end
        # Keep only what the next segment reaches back to (`segment` keeps its own reference).
        keep_from = max(0, self.mel_done - LEAD_FRAMES) * HOP_SAMPLES
        if keep_from > self.sample_offset:
            self.samples = self.samples[keep_from - self.sample_offset :]
            self.sample_offset = keep_from
        return segment, skip, count


def mel_batch(
    preprocessor, mel_bins: int, segments: list[tuple[np.ndarray, int, int]], device
) -> tuple[torch.Tensor | None, list[int]]:
    """ONE batched preprocessor call on `device` over the segments with new frames: their mel [rows, feat, T]
    (None when no segment has any) and which segments its rows are.

    Segments are zero-padded to the longest; the preprocessor masks each row at its own length (pre-emphasis
    and frames), so a row's frames are those of the segment alone."""
    busy = [index for index, (_samples, _skip, count) in enumerate(segments) if count]
    if not busy:
        return None, busy
    longest = max(len(segments[index][0]) for index in busy)
    signal = np.zeros((len(busy), longest), dtype=np.float32)
    for row, index in enumerate(busy):
        signal[row, : len(segments[index][0])] = segments[index][0]
    lengths = torch.tensor([len(segments[index][0]) for index in busy])
    mel, _ = preprocessor(input_signal=upload(torch.from_numpy(signal), device), length=upload(lengths, device))
    return mel, busy


def segment_width(skip: int, count: int) -> int:
    """Samples a segment needs for frames [skip, skip + count): up to where its last frame's window ends. A clip cut
    there has exactly skip + count frames (frame t's window is centred on sample 160·t)."""
    return (skip + count - 1) * HOP_SAMPLES + STFT_HALF_WINDOW


def segment_batch(
    segments: list[tuple[np.ndarray, int, int]], skip: int, count: int, pin: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The segments as one batch of audio [B, segment_width] and each row's length, when every segment has `skip`
    frames of lead and `count` new frames (a padded step's features, computed inside the step); else None.

    A segment that runs past the width (audio arrived beyond its last frame's window) is cut there: the frames
    before the cut are the same. One that ends before it (the clip closed) keeps its length, and the preprocessor
    masks the row there, as `mel_batch` does. With `pin`, the batch is built in pinned memory: one copy per row, and
    the upload to a GPU needs no staging copy."""
    if any(segment[1] != skip or segment[2] != count for segment in segments):
        return None
    width = segment_width(skip, count)
    audio = torch.zeros((len(segments), width), dtype=torch.float32, pin_memory=pin)
    rows = audio.numpy()
    lengths = []
    for row, (samples, _skip, _count) in enumerate(segments):
        length = min(len(samples), width)
        rows[row, :length] = samples[:length]
        lengths.append(length)
    return audio, torch.tensor(lengths)
