"""One client stream's state between engine steps (its audio and mel frames, hypothesis and cache slot), what
encoding a group of streams returns, and the debug recording of a stream's encoder output."""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from services.asr.backend import StreamSettings
from services.asr.engine.features import FeatureStream
from services.asr.engine.step_graphs import TokenTable

_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")


class Stream:
    """One client stream's state between steps: audio, decoder hypothesis, cache slot (the backend pools the rest by
    slot: encoder caches, pre-encode history, decoder state)."""

    def __init__(
        self,
        settings: StreamSettings,
        context: list[int],
        features: FeatureStream,
        slot: int,
        deliver: Callable[[object], None],
    ):
        self.settings = settings
        self.context = context
        self.features = features
        self.feature_lock = threading.Lock()  # append (event loop) vs next_segment (worker thread)
        self.slot = slot
        self.joined_at = time.perf_counter()
        self.steps = 0
        self.mel_consumed = 0  # mel frames the encoder has consumed
        self.window: torch.Tensor | None = None  # the buffered backend's mel window (on the serving device)
        self.token_ids: list[int] = []  # the decoder's state is in the backend's pool, row `slot`
        self.transcript = ""  # the text of token_ids, extended as tokens are added
        self.closed = False
        self.closed_at = 0.0
        self.finished = False
        self.abandoned = False  # it left (client gone, or done): never stepped again; slot freed once no step holds it
        self.in_step = False
        self.arrivals: collections.deque[tuple[int, float]] = collections.deque()  # (total samples, time)
        self.deliver = deliver  # where its updates (and its failure) go: a queue's put, or the engine's channel
        self.encoded: list[np.ndarray] = []  # kept only when recording encoder outputs: one array per step,
        self.step_rows: list[int] = []  # with the streams in that step (its padded bucket follows from them)
        self.step_tokens: list[int] = []  # and the tokens it added

    def append(self, audio: np.ndarray, arrived_at: float) -> None:
        with self.feature_lock:
            self.features.append(audio)
        self.arrivals.append((self.features.total_samples, arrived_at))

    def mel_available(self) -> int:
        return self.features.available(self.closed)

    def feature_segment(self, limit: int | None = None) -> tuple[np.ndarray, int, int]:
        """The audio of the next mel frames, up to frame `limit` (features.FeatureStream.next_segment)."""
        with self.feature_lock:
            return self.features.next_segment(self.closed, limit)

    def arrival_of_sample(self, sample: int) -> float:
        """When the audio up to `sample` had arrived (the end of the clip counts as arriving at half-close)."""
        while len(self.arrivals) > 1 and self.arrivals[0][0] < sample:
            self.arrivals.popleft()
        if self.arrivals and self.arrivals[0][0] >= sample:
            return self.arrivals[0][1]
        return self.closed_at or time.perf_counter()


@dataclasses.dataclass
class GroupResult:
    """What `encode_group` returns: encoder output [B, D, T], valid frames per stream, frames computed."""

    encoded: torch.Tensor
    lengths: list[int]
    frames_computed: list[int]  # encoder frames the step computed for each stream ("each frame once")
    flops: float
    read_bytes: float
    # already decoded (a padded step decodes in its own call, and hands over its TokenTable on the way to the host)
    new_tokens: list[list[int]] | TokenTable | None = None


def record_encoder_output(
    record_dir: Path,
    name: str,
    kind: str,
    encoded: list[np.ndarray],
    token_ids: list[int],
    width: int,
    step_rows: list[int] | None = None,
    step_tokens: list[int] | None = None,
) -> None:
    """Debug: keep a stream's encoder output ([frames, width]) so tests can compare streaming with offline exactly,
    with what each step added (frames, tokens) and how many streams it ran with (default: one pass of one row).

    The archive is made in memory and parsed back before it is written, and the file is read back after: two GPU
    runs found an eager service's archive with null bytes in its header (session 21: the header's padding, 36
    bytes), which no CPU run has shown. Whichever check fails says where the bytes went wrong."""
    frames = np.concatenate(encoded) if encoded else np.zeros((0, width), np.float32)
    steps = {
        "step_frames": np.array([len(piece) for piece in encoded], dtype=np.int64),
        "step_rows": np.array(step_rows if step_rows is not None else [1] * len(encoded), dtype=np.int64),
        "step_tokens": np.array(step_tokens if step_tokens is not None else [len(token_ids)], dtype=np.int64),
    }
    buffer = io.BytesIO()
    np.savez(buffer, encoded=frames, token_ids=np.array(token_ids, dtype=np.int64), **steps)
    data = buffer.getvalue()
    with np.load(io.BytesIO(data)) as archive:  # raises if the archive is already wrong in memory
        archive["encoded"], archive["token_ids"]
    record_dir.mkdir(parents=True, exist_ok=True)
    path = record_dir / f"{_SAFE_ID.sub('_', name)}.{kind}.npz"
    partial = path.with_suffix(".partial")  # written whole, then renamed: a reader never sees half a file
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    written = partial.read_bytes()
    if written != data:
        wrong = [i for i, (a, b) in enumerate(zip(written, data, strict=False)) if a != b]
        raise OSError(f"{partial}: {len(written)} bytes on disk differ from the {len(data)} written at {wrong[:40]}")
    os.replace(partial, path)
