"""The buffered baseline: re-encode a sliding window of recent audio for every chunk, no encoder caches.

This is how streaming ASR ran before cache-aware models (NeMo's FrameBatchASR / BufferedRNNTPipeline): a
fixed-size buffer of the last `window_ms` of log-mel frames, zero-filled at the start, shifts by one chunk
per step and is encoded from scratch; only the newest chunk's encoder frames go to the RNN-T decoder,
whose state is carried between steps exactly as in the cache-aware backend.

Window and overlap: the window is `window_ms` rounded up to whole attention chunks of (right + 1) frames,
so its last attention chunk is exactly the new chunk and sees the same right context as cache-aware
streaming. Each step computes window/80 ms encoder frames to emit (right + 1); the other frames are the
overlap, recomputed. With the default 4 s window at 320 ms chunks that is 52 frames per 4 new ones.
Streams are batched across clients exactly like the cache-aware backend (same loop, same padding).
"""

from __future__ import annotations

import math

import torch

from services.asr.engine import fastconformer as fc
from services.asr.engine.batching import BatchingBackend, GroupResult
from services.asr.engine.stream import Stream


class BufferedBackend(BatchingBackend):
    name = "nemo-buffered"
    with_cache = False

    def __init__(self, model, *args, window_ms: int = 4000, **kwargs):
        super().__init__(model, *args, **kwargs)
        self.window_ms = window_ms
        self.window_frames = {}  # chunk_ms -> encoder frames per window
        for chunk_ms, (_left, right) in self.contexts.items():
            chunk_frames = right + 1
            frames = math.ceil(window_ms / fc.ENCODER_FRAME_MS / chunk_frames) * chunk_frames
            self.window_frames[chunk_ms] = frames

    def limits(self):
        return {**super().limits(), "buffered_window_ms": self.window_ms}

    def chunk_mel(self, stream: Stream) -> int:
        return fc.MEL_PER_ENCODER_FRAME * (stream.context[1] + 1)

    def encode_group(self, streams: list[Stream], chunks: list[torch.Tensor]) -> GroupResult:
        chunk_ms = streams[0].settings.chunk_ms
        # 8·(W - 1) + 1 mel frames make exactly W encoder frames (the causal subsampling's frame 0 takes one
        # mel frame), and the last right + 1 of them cover exactly the newest chunk.
        window_mel = (self.window_frames[chunk_ms] - 1) * fc.MEL_PER_ENCODER_FRAME + 1
        windows = []
        for stream, chunk in zip(streams, chunks, strict=True):
            if stream.window is None:  # the buffer starts zero-filled, as in FrameBatchASR
                stream.window = chunk.new_zeros(chunk.shape[0], window_mel)
            stream.window = torch.cat((stream.window, chunk), dim=1)[:, -window_mel:]
            windows.append(stream.window)
        signal = torch.stack(windows).to(self.device, self.dtype)
        encoder = self.model.encoder
        encoder.set_default_att_context_size(streams[0].context)
        lengths = torch.full((len(streams),), window_mel, device=self.device)
        encoded, encoded_len = encoder(audio_signal=signal, length=lengths)
        window_frames = int(encoded_len.max())
        new_frames = [math.ceil(chunk.shape[1] / fc.MEL_PER_ENCODER_FRAME) for chunk in chunks]
        emit = max(new_frames)
        # Each stream's newest frames go to the front of the decoder input; the rest of the window is overlap.
        out = torch.zeros(len(streams), encoded.shape[1], emit, dtype=encoded.dtype, device=encoded.device)
        for index, frames in enumerate(new_frames):
            out[index, :, :frames] = encoded[index, :, window_frames - frames : window_frames]
        return GroupResult(
            encoded=out,
            lengths=new_frames,
            frames_computed=[window_frames] * len(streams),
            flops=self.shape.step_flops(len(streams), window_frames, window_frames, window_mel, window_frames),
            read_bytes=self.shape.step_read_bytes(len(streams), with_cache=False),
        )
