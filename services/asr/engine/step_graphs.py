"""The cache-aware step on padded batches in static buffers, replayed as CUDA graphs on a GPU.

Why: eager, one step of the 24-layer encoder plus the RNN-T label loop is ~1-3 thousand kernel launches and
two device-to-host syncs; on an H200 that fixed cost, not the arithmetic, bounds small steps. Here one chunk
size's steady step (full-width chunks after the first, 9 mel frames of pre-encode history), its first
step (the first chunk of every stream, from empty caches) and, at 80 ms, its second step (1 frame of history)
are each one function
of static tensors: the streams' input and their cache slots [bucket]. The input is their audio segments
[bucket, samples] with `features_in_step` (the step computes the mel frames and joins them to the slots' pre-encode
history itself: step_features.py), else their mel frames [bucket, mel, width]. It gathers
the encoder caches and decoder state of those slots from the pools, runs NeMo's encoder step, decodes the
new frames greedily (an unrolled, masked RNN-T greedy loop: `max_symbols` joint/predictor evaluations per
frame for every row, so no host round trip decides when it stops), writes caches and decoder state back,
and leaves one small table [bucket, 1 + tokens] of token counts and ids: the step's only device-to-host copy.

A batch of B streams runs the smallest bucket (1, 2, 4, ... 64, then multiples of 64, ... max) holding it;
rows B.. are padding that read and write a scratch slot no stream owns, so they never touch a stream's
state and their outputs are dropped. A step's buckets are captured largest first into one memory pool of
their own (replays are serialised by the device lock, so their workspaces may overlap); each padded step
(first or steady, per chunk size) has its own pool. Without CUDA (`graphs=False`) the same function runs
eagerly on the same padded buffers: the CPU twin the tests check.

Graph hygiene (the H200 main job's first replay hit an illegal memory access, results/h200/README.md): a
replay reads raw addresses, so everything a graph reads must outlive it unmoved. The static buffers, the
slot pools and the positional table are checked by tests/asr/test_padded_steps.py; cuBLAS keeps one
workspace per (handle, stream) outside any graph, which a graph then embeds. So captures run on the
backend's own capture stream, cuBLAS's cached workspaces are dropped before and after capturing (the
capture then allocates its workspace in its own pool, as torch's cudagraph trees do), and graphs are never
destroyed while the service runs (destroying one drops the workspace of its stream, which others share).
"""

from __future__ import annotations

import logging
import time

import torch
from torch.profiler import record_function

from services.asr.engine import features
from services.asr.engine.slots import join_history, upload
from services.asr.engine.step_features import StepFeatures

log = logging.getLogger(__name__)


FINE_STEP = 64  # past 64 rows, buckets are multiples of 64


def release_blas_workspaces() -> None:
    """Drop cuBLAS's cached per-(handle, stream) workspaces (after a synchronize): a capture that follows then
    allocates its workspace inside its own graph pool, and no eager call inherits one that a graph embeds."""
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def buckets_up_to(largest: int) -> list[int]:
    """Batch-size buckets 1, 2, 4, ... 64, then every multiple of 64, and `largest` itself. At large batches a
    step costs in proportion to its rows (compute, not launches): padding 640 streams to 1,024 cost the H200
    60 % more per step, so there a bucket wastes at most 63 rows."""
    buckets, size = [], 1
    while size < min(largest, FINE_STEP):
        buckets.append(size)
        size *= 2
    buckets += range(FINE_STEP, largest, FINE_STEP)
    return [*buckets, largest]


def bucket_for(streams: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `streams`."""
    for bucket in buckets:
        if bucket >= streams:
            return bucket
    raise ValueError(f"{streams} streams exceed the largest bucket {buckets[-1]}")


class PaddedStep:
    """One chunk size's steady step over padded batches: static inputs, per-bucket graphs (or eager)."""

    def __init__(
        self,
        backend,
        chunk_ms: int,
        history: int,
        buckets: list[int],
        scratch_slot: int,
        graphs: bool,
        pool=None,
        streams: tuple | None = None,
        features_in_step: bool = False,
    ):
        """`pool`: a graph pool to share (None: one of its own); `streams`: (warm-up, capture) CUDA streams (None:
        a side stream and torch's default capture stream); `features_in_step`: the step takes audio segments and
        computes their mel frames itself (`launch_audio`) instead of taking mel frames (`launch`)."""
        model = backend.model
        self.encoder = model.encoder
        self.decoder = backend.decoder  # GreedyDecoder: pooled predictor state by slot
        self.computer = backend.decoder.computer
        if self.computer.max_symbols is None:
            raise ValueError("padded steps need a bounded max_symbols in greedy RNN-T decoding")
        self.context = backend.contexts[chunk_ms]
        self.cfg = backend.streaming[chunk_ms]
        self.caches = backend.pools[self.context[0]]
        self.chunk_ms = chunk_ms
        self.buckets = buckets
        self.scratch_slot = scratch_slot
        # `history`: mel frames of pre-encode history before the chunk. 0, a first step: the first chunk (10 ms +
        # right context) from empty caches, nothing dropped. The pre-encode cache (9), a steady step: the history +
        # one whole chunk, dropping the history's encoder frames. In between, a second step whose first chunk was
        # shorter than the pre-encode cache (80 ms: 1 frame): the same with that short history.
        self.history, self.pre_encode = history, backend.pre_encode_frames
        self.first = history == 0
        self.width = self.cfg.chunk_size[0] if self.first else history + self.cfg.chunk_size[1]
        self.drop = backend.drop_for(chunk_ms, history)
        self.device = backend.device
        largest = buckets[-1]
        self.signal = torch.zeros(largest, backend.shape.mel_bins, self.width, device=self.device, dtype=backend.dtype)
        # With the features in the step, its input is each stream's audio segment instead of mel frames: the mel front
        # end (pre-emphasis, STFT, filterbank, log) and the join to the pre-encode history run inside the step, i.e.
        # inside its graph, not as a few dozen eager launches (and a cuFFT plan per new shape) on the host per step.
        self.features_in_step = features_in_step
        self.history_pool = backend.history  # each slot's last pre-encode frames (mel, float32)
        self.skip = min(history, features.LEAD_FRAMES)  # the segment's frames before the chunk (FeatureStream)
        self.count = self.width - history  # the chunk's new mel frames
        self.audio_width = features.segment_width(self.skip, self.count)
        if features_in_step:
            self.mel = StepFeatures(model.preprocessor, self.skip, self.count, self.device)
            self.audio = torch.zeros(largest, self.audio_width, device=self.device)
            self.audio_length = torch.full((largest,), self.audio_width, dtype=torch.long, device=self.device)
        self.slots = torch.full((largest,), scratch_slot, dtype=torch.long, device=self.device)
        self.signal_length = torch.full((largest,), self.width, dtype=torch.long, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.retired: list = []  # graphs no longer replayed, kept alive (see the module docstring)
        self.lengths = None  # encoder output lengths of the last set-up run
        self.frames = 0  # encoder frames per row of a steady step (known at set-up: no sync per step)
        self.positions = None  # the positional table the graphs read (NeMo replaces it if audio outgrows it)
        self.capture_s = 0.0
        self._prepare(graphs, pool, streams)

    # --- the step as a function of the static buffers ---------------------------------------------------
    def _forward(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder + greedy decoding of rows [:bucket]; returns (encoded [bucket, D, T], table [bucket, 1+K])."""
        slots = self.slots[:bucket]
        channel_pool, time_pool, length_pool = self.caches
        # The ranges name the step's phases for a profiler (results/h200/asr_profile.py); a replay does not see them.
        with record_function("cache gather"):
            caches = channel_pool.index_select(1, slots), time_pool.index_select(1, slots)
            lengths = length_pool.index_select(0, slots)
        if self.features_in_step:
            with record_function("features"):
                signal = self._features(bucket, slots)
        else:
            signal = self.signal[:bucket]
        with record_function("encoder"):
            encoded, self.lengths, channel, time_cache, length = self.encoder.cache_aware_stream_step(
                processed_signal=signal,
                processed_signal_length=self.signal_length[:bucket],
                cache_last_channel=caches[0],
                cache_last_time=caches[1],
                cache_last_channel_len=lengths,
                keep_all_outputs=True,
                drop_extra_pre_encoded=self.drop,
            )
        with record_function("cache scatter"):
            channel_pool.index_copy_(1, slots, channel)
            time_pool.index_copy_(1, slots, time_cache)
            length_pool.index_copy_(0, slots, length)
        with record_function("decoder"):
            return encoded, self._decode(encoded, slots)

    def _features(self, bucket: int, slots: torch.Tensor) -> torch.Tensor:
        """Rows [:bucket]'s encoder input from their audio: mel frames [skip, skip + count) of each segment (each row
        masked at its own length; step_features.py), after the slot's pre-encode history; the slots' history
        moves on. What `CacheAwareBackend._signal` does for a step given mel frames."""
        mel = self.mel(self.audio[:bucket], self.audio_length[:bucket])
        return join_history(self.history_pool, slots, mel, self.history).to(self.signal.dtype)

    def _decode(self, encoded: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """Greedy RNN-T over every frame of every row (all rows have all frames in a steady step): at each
        frame up to `max_symbols` labels, each followed by a predictor step, masked per row instead of a
        loop whose exit needs the host. The same tokens as NeMo's label-looping computer."""
        computer, pools = self.computer, self.decoder
        joint, predictor = computer.joint, computer.decoder
        blank, max_symbols = computer._blank_index, computer.max_symbols
        rows, frames = encoded.shape[0], encoded.shape[2]
        projected = joint.project_encoder(encoded.transpose(1, 2))  # [B, T, H], once per step
        state = [pool.index_select(1, slots) for pool in pools.states]
        output = pools.outputs.index_select(0, slots)
        last_label = pools.labels.index_select(0, slots)
        tokens = torch.zeros(rows, frames * max_symbols + 1, dtype=torch.long, device=encoded.device)
        counts = torch.zeros(rows, dtype=torch.long, device=encoded.device)
        row_index = torch.arange(rows, device=encoded.device)
        for frame in range(frames):
            emitting = torch.ones(rows, dtype=torch.bool, device=encoded.device)
            for _symbol in range(max_symbols):
                logits = joint.joint_after_projection(projected[:, frame : frame + 1], output).squeeze(1).squeeze(1)
                label = logits.max(-1)[1]
                emitting = emitting & (label != blank)
                tokens[row_index, counts] = label  # kept only where emitting: counts moves past it
                counts += emitting
                new_output, new_state, *_ = predictor.predict(label.unsqueeze(1), state, add_sos=False, batch_size=rows)
                new_output = joint.project_prednet(new_output)
                output = torch.where(emitting[:, None, None], new_output, output)
                keep = emitting[None, :, None]
                state = [torch.where(keep, new, old) for new, old in zip(new_state, state, strict=True)]
                last_label = torch.where(emitting, label, last_label)
        for pool, value in zip(pools.states, state, strict=True):
            pool.index_copy_(1, slots, value)
        pools.outputs.index_copy_(0, slots, output)
        pools.labels.index_copy_(0, slots, last_label)
        pools.lengths.index_copy_(0, slots, pools.lengths.index_select(0, slots) + frames)
        return torch.cat((counts[:, None], tokens), dim=1)

    # --- set-up -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _prepare(self, graphs: bool, pool, streams) -> None:
        """Learn the step's frame count; with `graphs`, capture every bucket (largest first)."""
        started = time.perf_counter()
        self.encoder.set_default_att_context_size(self.context)
        self.slots.fill_(self.scratch_slot)  # set-up runs touch only the scratch slot
        encoded, _table = self._forward(1)
        self.frames = encoded.shape[2]
        if int(self.lengths.min()) != self.frames:  # one sync at set-up instead of one per step
            raise ValueError(f"a padded {self.chunk_ms} ms step yields {self.lengths.tolist()} of {self.frames} frames")
        self.positions = self.encoder.pos_enc.pe
        if graphs:
            side, capture = streams or (torch.cuda.Stream(), None)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for bucket in reversed(self.buckets):
                    for _ in range(2):  # warm-up on a side stream: cuDNN/cuBLAS pick their kernels first
                        self._forward(bucket)
            torch.cuda.current_stream().wait_stream(side)
            if streams is not None:
                release_blas_workspaces()
            try:
                for bucket in reversed(self.buckets):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=capture, capture_error_mode="thread_local"):
                        self.outputs[bucket] = self._forward(bucket)
                    self.graphs[bucket] = graph
                    pool = graph.pool()
                torch.cuda.synchronize()
            except RuntimeError:  # serve eagerly on the same padded buffers rather than not at all
                log.exception("capturing the %s %d ms step failed: it runs eagerly", self.kind, self.chunk_ms)
                self.retire()
            if streams is not None:
                release_blas_workspaces()
        self.pool = pool
        self.capture_s = time.perf_counter() - started

    def retire(self) -> None:
        """Stop replaying this step's graphs (it runs eagerly from now on) without destroying them."""
        self.retired += self.graphs.values()
        self.graphs = {}
        self.outputs = {}

    @property
    def kind(self) -> str:
        return "first" if self.first else "steady" if self.history == self.pre_encode else "second"

    # --- a step -----------------------------------------------------------------------------------------
    def launch(self, signal: torch.Tensor, slots: list[int]) -> TokenTable:
        """Step the streams in `slots` on `signal` [B, mel, width] without waiting for the device: their token
        table is copied to the host behind the step (`TokenTable.tokens` waits for it). A step launched after this
        one reads this one's results only through the table: the static outputs are the next step's."""
        if self.features_in_step:
            raise ValueError("this padded step computes its features: launch it with audio (launch_audio)")
        self.signal[: len(slots)].copy_(signal)
        return self._replay(slots)

    def launch_audio(self, audio: torch.Tensor, lengths: torch.Tensor, slots: list[int]) -> TokenTable:
        """`launch`, from the streams' audio segments [B, audio_width] (host, pinned for a GPU) and their lengths [B]
        (features.segment_batch): the step computes their mel frames itself."""
        rows = len(slots)
        self.audio[:rows].copy_(audio, non_blocking=True)
        self.audio_length[:rows].copy_(upload(lengths, self.device))
        return self._replay(slots)

    def _replay(self, slots: list[int]) -> TokenTable:
        rows = len(slots)
        bucket = bucket_for(rows, self.buckets)
        self.slots[:rows].copy_(upload(torch.tensor(slots, dtype=torch.long), self.device))
        self.slots[rows:bucket].fill_(self.scratch_slot)
        graph = self.graphs.get(bucket)
        if graph is not None and self.encoder.pos_enc.pe is not self.positions:
            log.warning(
                "the encoder's positional table was replaced (a long offline clip): graphs off for %d ms", self.chunk_ms
            )
            self.retire()
            graph = None
        if graph is not None:
            graph.replay()
            encoded, table = self.outputs[bucket]
        else:
            self.encoder.set_default_att_context_size(self.context)
            encoded, table = self._forward(bucket)
        return TokenTable(encoded[:rows], table[:rows])

    def run(self, signal: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, list[list[int]]]:
        """`launch`, then wait: the streams' encoder output [B, D, T] (a view valid until the next step) and each
        stream's new token ids."""
        launched = self.launch(signal, slots)
        return launched.encoded, launched.tokens()


class TokenTable:
    """A launched step's token table on its way to the host: the step's one device-to-host copy."""

    def __init__(self, encoded: torch.Tensor, table: torch.Tensor):
        self.encoded = encoded  # a view of the step's static output: valid until the next step of its buckets
        on_gpu = table.device.type == "cuda"
        self.host = torch.empty(table.shape, dtype=table.dtype, pin_memory=on_gpu)
        self.host.copy_(table, non_blocking=on_gpu)
        self.copied = torch.cuda.Event() if on_gpu else None
        if self.copied is not None:
            self.copied.record()

    def has_run(self) -> bool:
        """Whether the step and its copy are done (`tokens` would not wait); never blocks."""
        return self.copied is None or self.copied.query()

    def tokens(self) -> list[list[int]]:
        """Each row's new token ids, once the step has run (waits for it, without the interpreter lock)."""
        if self.copied is not None:
            self.copied.synchronize()
        return [row[1 : 1 + row[0]] for row in self.host.tolist()]
