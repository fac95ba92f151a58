"""Cache-aware streaming: every 80 ms encoder frame of every stream is computed exactly once.

Each stream owns a cache slot: its row in pooled tensors `cache_last_channel [layers, slots, left, d]`
(attention keys/values of the last `left` frames), `cache_last_time [layers, slots, d, kernel-1]`
(causal convolution state) and `cache_last_channel_len [slots]`. A batched step gathers the slots of the
streams it steps (a view when their slots are consecutive, else index_select along the batch dimension),
runs NeMo's `cache_aware_stream_step` once for all of them, and scatters the updated caches back.

Pre-encode history. The causal dw_striding subsampling needs the last 9 mel frames before a chunk
(`pre_encode_cache_size`) and NeMo drops the 2 encoder frames they yield. When a stream has fewer than 9
consumed frames — only at step 1 of right context 0, whose first step consumes a single mel frame — NeMo's
`CacheAwareStreamingAudioBuffer` pads the history with zero-valued mel frames. Zero log-mel is not what
the offline pass sees (the convolutions' own zero padding of their activations), which is the ~0.03
streaming/offline mismatch from frame 1 on at right context 0 recorded in ENGINE_NOTES. Here such a step
is fed the true history from the clip start and drops exactly the frames that history yields, so
streaming equals offline for all five contexts (tests/asr/test_streaming.py::test_streaming_equals_offline).
"""

from __future__ import annotations

import logging
import time

import torch

from services.asr import metrics
from services.asr.engine import fastconformer as fc
from services.asr.engine import features
from services.asr.engine.batching import BatchingBackend, GroupResult
from services.asr.engine.slots import gather, join_history, rows, scatter
from services.asr.engine.step_graphs import PaddedStep, bucket_for, buckets_up_to
from services.asr.engine.stream import Stream

log = logging.getLogger(__name__)


class CacheAwareBackend(BatchingBackend):
    name = "nemo-cache-aware"
    with_cache = True

    def __init__(
        self,
        model,
        *args,
        padded_steps: bool = False,
        cuda_graphs: bool = False,
        graph_chunks=(),
        graph_first_steps: bool = True,
        features_in_step: bool = False,
        **kwargs,
    ):
        super().__init__(model, *args, **kwargs)
        # Steady steps (and with `graph_first_steps` first steps) on padded batches in static buffers (captured
        # as CUDA graphs with `cuda_graphs`), for the chunk sizes in `graph_chunks` (all when empty); built
        # after warm-up (`prepare_padded_steps`).
        self.padded_steps = padded_steps or cuda_graphs
        self.cuda_graphs = cuda_graphs
        self.graph_first_steps = graph_first_steps
        self.features_in_step = features_in_step  # padded steps compute their streams' mel frames themselves
        self.graph_chunks = tuple(graph_chunks) or self.chunk_ms_choices
        self.padded: dict[tuple[int, int], PaddedStep] = {}  # (chunk_ms, pre-encode history) -> its padded step
        self.capture_s = 0.0
        encoder = model.encoder
        self.streaming = {}  # chunk_ms -> NeMo CacheAwareStreamingConfig for that context
        for chunk_ms, context in self.contexts.items():
            encoder.set_default_att_context_size(context)
            self.streaming[chunk_ms] = encoder.streaming_cfg
        self.pre_encode_frames = self.streaming[self.chunk_ms_choices[0]].pre_encode_cache_size[1]
        # One slot pool per distinct left context (all five share left 56 in the presets), allocated up front:
        # the encoder's default context is global state that only a step (under the device lock) may change.
        self.pools: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        dtype = next(encoder.parameters()).dtype
        for context in self.contexts.values():
            if context[0] not in self.pools:
                encoder.set_default_att_context_size(context)
                # One row past the slots (streams, offline lanes): the scratch slot padded rows read and write.
                self.pools[context[0]] = encoder.get_initial_cache_state(self.slot_count + 1, dtype=dtype)
        # Each slot's last `pre_encode_frames` consumed mel frames (right-aligned, zeros before a stream's first):
        # the next step's pre-encode history, read and written for all of a step's streams at once.
        self.history = torch.zeros(self.slot_count + 1, self.shape.mel_bins, self.pre_encode_frames, device=self.device)

    def warm_up(self) -> None:
        super().warm_up()
        if self.padded_steps:
            self.prepare_padded_steps()

    def prepare_padded_steps(self) -> None:
        """Static buffers (and with CUDA graphs, one graph per batch-size bucket) for each chunk size."""
        started = time.perf_counter()
        buckets = buckets_up_to(self.max_batch_streams)
        # One warm-up and one capture stream for all (kept as long as the graphs); one graph pool per step.
        streams = (torch.cuda.Stream(), torch.cuda.Stream()) if self.cuda_graphs else None
        for chunk_ms in self.graph_chunks:
            for history in self.padded_histories(chunk_ms):
                step = PaddedStep(
                    self,
                    chunk_ms,
                    history,
                    buckets,
                    self.slot_count,
                    self.cuda_graphs,
                    streams=streams,
                    features_in_step=self.features_in_step,
                )
                self.padded[chunk_ms, history] = step
        self.graph_streams = streams
        self.capture_s = time.perf_counter() - started
        log.info(
            "padded steps for %s ms, buckets %s, %s in %.1f s",
            sorted({chunk_ms for chunk_ms, _first in self.padded}),
            buckets,
            "captured as CUDA graphs" if self.cuda_graphs else "eager",
            self.capture_s,
        )

    def padded_histories(self, chunk_ms: int) -> list[int]:
        """The pre-encode histories a stream's steps of `chunk_ms` start from, one padded step each: the steady
        one (the pre-encode cache); with `graph_first_steps`, also the first step's (none) and, where the first
        chunk is shorter than the cache (80 ms: 1 frame), the second step's. The second step of every 80 ms stream
        ran eagerly, ~40 ms of launches on an H200 (issue 17), each time a wave of streams joined."""
        histories = [self.pre_encode_frames]
        if self.graph_first_steps:
            histories.append(0)
            first = self.streaming[chunk_ms].chunk_size[0]
            if 0 < first < self.pre_encode_frames:
                histories.append(first)
        return histories

    def limits(self):
        return {
            **super().limits(),
            "padded_steps": float(self.padded_steps),
            "cuda_graphs": float(self.cuda_graphs),
            "graph_capture_s": round(self.capture_s, 1),
            "cuda_graphs_captured": float(sum(len(step.graphs) for step in self.padded.values())),
            "graph_first_steps": float(self.graph_first_steps),
            "features_in_step": float(self.features_in_step and self.padded_steps),
        }

    def _pool(self, left: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.pools[left]

    def reset_slots(self, slots: list[int], context: list[int]) -> None:
        channel, time, length = self._pool(context[0])
        at = rows(sorted(slots), self.device)
        channel[:, at] = 0
        time[:, at] = 0
        length[at] = 0
        self.history[at] = 0

    def chunk_mel(self, stream: Stream) -> int:
        chunk_size = self.streaming[stream.settings.chunk_ms].chunk_size
        return chunk_size[0] if stream.steps == 0 else chunk_size[1]

    def _history_and_drop(self, stream: Stream) -> tuple[int, int]:
        """Mel frames of pre-encode history to prepend, and encoder frames to drop after subsampling."""
        # none at the first step; fewer than the pre-encode cache only at 80 ms's second step (right context 0)
        history = 0 if stream.steps == 0 else min(stream.mel_consumed, self.pre_encode_frames)
        return history, self.drop_for(stream.settings.chunk_ms, history)

    def drop_for(self, chunk_ms: int, history: int) -> int:
        """Encoder frames of `history` mel frames of pre-encode history, dropped after subsampling."""
        if history == self.pre_encode_frames:
            return self.streaming[chunk_ms].drop_extra_pre_encoded
        return fc.encoder_frames_for_mel(history)  # 0 for none: a first step

    def group_key(self, stream: Stream) -> tuple:
        """Streams of one pre-encode history share a call, and a stream's short last chunk steps apart from whole
        chunks: a padded step takes whole chunks only, so one short chunk in a group made its whole batch (at 320 ms
        up to thousands of streams) step eagerly, once per stream ending."""
        whole = stream.mel_available() >= stream.mel_consumed + self.chunk_mel(stream)
        return (*self._history_and_drop(stream), whole)

    def _signal(
        self, streams: list[Stream], chunks: torch.Tensor | list[torch.Tensor], history: int
    ) -> tuple[torch.Tensor, list[int]]:
        """Each stream's last `history` consumed frames then its chunk, as one batch [B, mel, T], and each row's
        width; the slots' history rows move on to the last `pre_encode_frames` frames of that."""
        keep = self.pre_encode_frames
        at = rows([stream.slot for stream in streams], self.device)
        if isinstance(chunks, torch.Tensor):  # the steady state
            signal = join_history(self.history, at, chunks, history)
            return signal, [signal.shape[2]] * len(streams)
        # A stream's short last chunk, or frames left over from an earlier step: zero-pad (the encoder masks each
        # stream at its length).
        before = gather(self.history, 0, at)  # [B, mel, keep]
        joined = [torch.cat((before[index], chunk), dim=1) for index, chunk in enumerate(chunks)]
        scatter(self.history, 0, at, torch.stack([row[:, -keep:] for row in joined]))
        inputs = [row[:, keep - history :] for row in joined]
        signal = torch.nn.utils.rnn.pad_sequence([piece.T for piece in inputs], batch_first=True).transpose(1, 2)
        return signal, [piece.shape[1] for piece in inputs]

    def encode_group(self, streams: list[Stream], chunks: torch.Tensor | list[torch.Tensor]) -> GroupResult:
        context = streams[0].context
        history, drop = self._history_and_drop(streams[0])
        signal, widths = self._signal(streams, chunks, history)
        # history 0 at a stream's first step, 9 (the pre-encode cache) at every later one but 80 ms's second (1)
        padded = self.padded.get((streams[0].settings.chunk_ms, history))
        if padded is not None and not padded.features_in_step and all(width == padded.width for width in widths):
            return self._padded_step(padded, streams, signal)
        lengths = torch.tensor(widths)

        channel_pool, time_pool, length_pool = self._pool(context[0])
        slots = rows([stream.slot for stream in streams], self.device)
        encoder = self.model.encoder
        encoder.set_default_att_context_size(context)
        encoded, encoded_len, channel, time, length = encoder.cache_aware_stream_step(
            processed_signal=signal.to(self.device, self.dtype),
            processed_signal_length=lengths.to(self.device),
            cache_last_channel=gather(channel_pool, 1, slots),
            cache_last_time=gather(time_pool, 1, slots),
            cache_last_channel_len=gather(length_pool, 0, slots),
            keep_all_outputs=True,
            drop_extra_pre_encoded=drop,
        )
        scatter(channel_pool, 1, slots, channel)
        scatter(time_pool, 1, slots, time)
        scatter(length_pool, 0, slots, length)

        frames = encoded_len.tolist()  # the step's one device-to-host sync before decoding
        new_frames = max(frames)
        keys = context[0] + new_frames  # each new frame attends over the cache plus the chunk (dense, masked)
        mel_frames = int(lengths.max())
        flops = self.shape.step_flops(len(streams), new_frames, keys, mel_frames, new_frames + drop)
        return GroupResult(
            encoded=encoded,
            lengths=frames,
            frames_computed=frames,
            flops=flops,
            read_bytes=self.shape.step_read_bytes(len(streams), with_cache=True),
        )

    def encode_audio(self, streams: list[Stream], segments: list) -> GroupResult | None:
        """A padded step that computes its streams' mel frames itself, when it has one for these streams and every
        segment is a whole chunk with the step's lead (features.segment_batch); else None (features on the host)."""
        history, _drop = self._history_and_drop(streams[0])
        padded = self.padded.get((streams[0].settings.chunk_ms, history))
        if padded is None or not padded.features_in_step:
            return None
        batch = features.segment_batch(segments, padded.skip, padded.count, pin=self.device.type == "cuda")
        if batch is None:
            return None
        return self._padded_result(padded, streams, padded.launch_audio(*batch, [stream.slot for stream in streams]))

    def _padded_step(self, padded: PaddedStep, streams: list[Stream], signal) -> GroupResult:
        """A first or steady step (every stream a whole chunk): encoder and decoder in one padded call
        (a graph replay on a GPU), launched; the only device-to-host copy is the token table, read when collected."""
        launched = padded.launch(signal.to(self.device, self.dtype), [stream.slot for stream in streams])
        return self._padded_result(padded, streams, launched)

    def _padded_result(self, padded: PaddedStep, streams: list[Stream], launched) -> GroupResult:
        label = str(padded.chunk_ms)
        metrics.padded_rows.labels(label, "stream").inc(len(streams))
        metrics.padded_rows.labels(label, "padding").inc(bucket_for(len(streams), padded.buckets) - len(streams))
        frames = [padded.frames] * len(streams)
        keys = streams[0].context[0] + padded.frames
        flops = self.shape.step_flops(len(streams), padded.frames, keys, padded.width, padded.frames + padded.drop)
        return GroupResult(
            encoded=launched.encoded,
            lengths=frames,
            frames_computed=frames,
            flops=flops,
            read_bytes=self.shape.step_read_bytes(len(streams), with_cache=True),
            new_tokens=launched,
        )
