"""The batching loop both NeMo backends share: streams, one asyncio task per chunk size, one step at a time.

Each task waits until some of its streams have a whole chunk of audio (or have ended), takes every ready
stream (up to `max_batch_streams`) and runs ONE batched encoder + RNN-T decoder step over all of them in a
worker thread. While a step runs, audio keeps arriving for other streams, so the next step is bigger: the
batch grows with load on its own. Two bounded waits shape it: a step waits up to `batch_wait_fraction` of a
chunk for streams about to be ready, and a new stream's first step waits up to `join_window` for others
joining at the same moment (first steps cannot share a call with running streams). Steps are serialised
by one device lock (two concurrent steps would only fight over the same cores or GPU). How a group is
encoded — from per-stream caches or by re-encoding a window — is the subclass's `encode_group`.

A step is launched (its host work: features and inputs; its device work queued) and then read back (its token
table on the host, then each stream's update). With `overlap_steps` (on a GPU) a chunk size's next step is launched
before the last one is read back: the host prepares one step, and reads the other back, while the device runs;
the lock is held for launches only. On a CPU a step is done when launched, so overlapping would only delay it.
Recognize calls go through the same lock (offline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from services.asr import metrics
from services.asr.backend import RecognitionUpdate, StreamSettings, step_failure
from services.asr.engine import fastconformer as fc
from services.asr.engine import features
from services.asr.engine.clocked import clocked_loop
from services.asr.engine.greedy import GreedyDecoder
from services.asr.engine.offline import OFFLINE_LANES, OfflineLane, finish_holding
from services.asr.engine.step import Launched, Stepping
from services.asr.engine.step_graphs import TokenTable
from services.asr.engine.stream import GroupResult, Stream, record_encoder_output
from voiceagent.serving.device_fault import end_process_after
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.metrics import service_metrics

log = logging.getLogger(__name__)
Arrival = tuple[np.ndarray | None, float]  # audio and when it arrived (time.perf_counter); None: the end
Deliver = Callable[[RecognitionUpdate | BaseException], None]  # where a stream's updates go, on the event loop
STEP_POLL_S = 0.002  # how often a batch wait looks whether the step in flight has run


def _discard(update: RecognitionUpdate | BaseException) -> None:
    """Where the warm-up's and offline steps' updates go: nobody reads them."""


class BatchingBackend(Stepping, OfflineLane):
    """Streams, admission to cache slots, the per-chunk-size batching loops and delivery of hypotheses."""

    name = "nemo"
    with_cache = True

    def __init__(
        self,
        model,
        source: str,
        preset: str,
        max_streams: int,
        max_batch_streams: int,
        record_dir: str,
        batch_wait_fraction: float = 0.0,
        join_window_ms: float = 0.0,
        offline_pass_s: float = float("inf"),
        offline_slice_ms: float = 50.0,
        step_policy: str = "ready",
        overlap_steps: bool = False,
        fused_encoder: bool = False,
    ):
        self.model = model
        self.source = source
        self.preset = preset
        self.max_streams = max_streams
        self.max_batch_streams = max_batch_streams
        self.batch_wait_fraction = batch_wait_fraction
        self.join_window_s = join_window_ms / 1000
        self.offline_pass_samples = offline_pass_s * features.SAMPLE_RATE
        self.offline_slice_s = offline_slice_ms / 1000
        self.step_policy = step_policy  # "ready" (as streams become ready) or "clocked" (engine/clocked.py)
        # Launch a chunk size's next step before reading the last one back (module docstring): at most one step
        # per chunk size waits to be read back, here.
        self.overlap_steps = overlap_steps
        self.fused_encoder = fused_encoder  # the model's attention and convolution modules (engine/fused_encoder.py)
        self.in_flight: dict[int, Launched] = {}
        self.slot_count = max_streams + OFFLINE_LANES  # the last OFFLINE_LANES slots step long offline clips
        self.record_dir = Path(record_dir) if record_dir else None
        self.shape = fc.encoder_shape(model)
        self.device = next(model.encoder.parameters()).device
        self.dtype = next(model.encoder.parameters()).dtype  # encoder and decoder compute in it; mel is float32
        self.detokenizer = fc.Detokenizer(model)
        self.decoder = GreedyDecoder(model, self.slot_count + 1, self.device)  # + the padded rows' scratch slot
        self.chunk_ms_choices = tuple(fc.supported_chunk_ms(model))
        self.contexts = {chunk_ms: fc.context_for_chunk_ms(model, chunk_ms) for chunk_ms in self.chunk_ms_choices}
        self.streams: dict[int, list[Stream]] = {chunk_ms: [] for chunk_ms in self.chunk_ms_choices}
        self.wake = {chunk_ms: asyncio.Event() for chunk_ms in self.chunk_ms_choices}
        # Readiness, kept as it changes rather than scanned for: the streams whose readiness may have changed since
        # a loop last looked (audio in, audio ended, a step read back, joined), and those not stepped yet (only
        # they can be held by the join window). A scan of every stream per audio message cost the event loop
        # O(streams) per message: at 1,024 paced streams on an H100, 208 of its 374 py-spy samples
        # (results/h200/README.md, v6).
        self.changed: dict[int, dict[Stream, None]] = {chunk_ms: {} for chunk_ms in self.chunk_ms_choices}
        self.unstepped: dict[int, dict[Stream, None]] = {chunk_ms: {} for chunk_ms in self.chunk_ms_choices}
        self.last_join = dict.fromkeys(self.chunk_ms_choices, 0.0)
        # Labelled children looked up once: a labels() call per stream per step takes the GIL for a lookup.
        self.chunk_latency = {c: metrics.chunk_processing.labels(str(c)) for c in self.chunk_ms_choices}
        # A min-heap: a stream takes the lowest free slot, so streams that start together get consecutive slots
        # and a step (its batch sorted by slot) reads their caches as a view. A stack handed slots out in reverse
        # release order: from the second wave of streams on, a permutation, and every step copied the caches.
        self.free_slots = list(range(max_streams))
        self.offline_slots: asyncio.Queue[int] = asyncio.Queue()
        for slot in range(max_streams, self.slot_count):
            self.offline_slots.put_nowait(slot)
        self.slot_freed = asyncio.Event()
        # New streams' slots, reset together at the start of the next step (in its thread): resetting each as its
        # stream joined cost the event loop a few hundred microseconds of kernel launches per stream on an H200
        # (results/h200/README.md, v5), and a join wave of a thousand streams held the loop for a third of a second.
        self.resets_due: list[tuple[int, list[int]]] = []
        self.resets_lock = threading.Lock()
        self.device_lock = asyncio.Lock()
        self.loops: list[asyncio.Task] = []
        self.work = service_metrics("asr")

    # --- what subclasses provide -------------------------------------------------------------------------
    def chunk_mel(self, stream: Stream) -> int:
        """Mel frames the next step of `stream` consumes."""
        raise NotImplementedError

    def group_key(self, stream: Stream) -> tuple:
        """Streams whose next steps can share one batched call have equal keys."""
        return ()

    def encode_group(self, streams: list[Stream], chunks: list[torch.Tensor]) -> GroupResult:
        raise NotImplementedError

    def reset_slots(self, slots: list[int], context: list[int]) -> None:
        """Prepare `slots` for new streams of attention context `context` (all at once: a few kernels)."""

    # --- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self.warm_up)
        self.loops = [asyncio.create_task(self._batch_loop(chunk_ms)) for chunk_ms in self.chunk_ms_choices]

    async def stop(self) -> None:
        for task in self.loops:
            task.cancel()
        await asyncio.gather(*self.loops, return_exceptions=True)

    def warm_up(self) -> None:
        """One offline pass and one streamed clip per chunk size, so no first request pays for lazy setup."""
        clip = np.random.default_rng(0).standard_normal(features.SAMPLE_RATE).astype(np.float32) * 0.1
        for chunk_ms in self.chunk_ms_choices:
            self._offline(StreamSettings("warm-up", chunk_ms), clip)
            stream = self._new_stream(StreamSettings("warm-up", chunk_ms, False))
            stream.append(clip, time.perf_counter())
            stream.closed = True
            while stream.mel_consumed < stream.mel_available():
                self._step([stream])
            heapq.heappush(self.free_slots, stream.slot)

    def facts(self) -> ModelFacts:
        params = self.shape.encoder_params + self.shape.decoder_params
        from nemo import __version__ as nemo_version

        return ModelFacts(
            backend=self.name,
            engine_version=f"nemo {nemo_version}",
            preset=self.preset or "checkpoint",
            source=self.source,
            synthetic_weights=self.preset != "",
            parameter_count=params,
            weight_bytes=params * self.shape.bytes_per_param,
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(self.device),
            shape=self.shape.as_facts(),
        )

    def limits(self) -> Mapping[str, float]:
        return {
            "max_streams": self.max_streams,
            "max_batch_streams": self.max_batch_streams,
            "batch_wait_fraction": self.batch_wait_fraction,
            "join_window_ms": self.join_window_s * 1000,
            "offline_pass_s": self.offline_pass_samples / features.SAMPLE_RATE,
            "offline_slice_ms": self.offline_slice_s * 1000,
            "clocked_steps": float(self.step_policy == "clocked"),
            "overlap_steps": float(self.overlap_steps),
            "fused_encoder": float(self.fused_encoder),
        }

    # --- streams -----------------------------------------------------------------------------------------
    def _new_stream(self, settings: StreamSettings, slot: int | None = None, deliver: Deliver = _discard) -> Stream:
        slot = heapq.heappop(self.free_slots) if slot is None else slot
        context = self.contexts[settings.chunk_ms]
        with self.resets_lock:
            self.resets_due.append((slot, context))  # reset before any step reads it (_reset_due_slots)
        return Stream(settings, context, features.FeatureStream(self.shape.mel_bins), slot, deliver)

    def _release(self, stream: Stream) -> None:
        heapq.heappush(self.free_slots, stream.slot)
        self.slot_freed.set()

    # --- live streams, driven by calls: what the engine process uses (no task or queue per stream) -------------
    async def slot_free(self) -> None:
        """Until a slot is free. The servicer admits at most max_streams, but a slot whose client just left is
        freed only after the step holding it ends: wait that one step rather than fail."""
        while not self.free_slots:
            self.slot_freed.clear()
            await self.slot_freed.wait()

    def join(self, settings: StreamSettings, deliver: Deliver) -> Stream:
        """A new live stream in a free slot (after `slot_free`, with no await between). Its updates and its failure
        go to `deliver`, on the event loop, the last one final; then the caller calls `leave`."""
        stream = self._new_stream(settings, deliver=deliver)
        self.streams[settings.chunk_ms].append(stream)
        self.unstepped[settings.chunk_ms][stream] = None
        self._touch(stream)
        self.last_join[settings.chunk_ms] = stream.joined_at
        metrics.active_streams.labels(str(settings.chunk_ms)).inc()
        return stream

    def feed(self, stream: Stream, piece: np.ndarray, arrived_at: float) -> None:
        """More of a stream's audio, and when it arrived (time.perf_counter in the process that received it)."""
        stream.append(piece, arrived_at)
        self._touch(stream)

    def end_audio(self, stream: Stream, ended_at: float) -> None:
        """The stream's audio has ended (its client half-closed): the rest is stepped, then the final update."""
        stream.closed = True
        stream.closed_at = ended_at
        self._touch(stream)

    def leave(self, stream: Stream) -> None:
        """The stream is done (its final update delivered) or its client left: its slot is freed, after the step
        holding it if one is in flight."""
        chunk_ms = stream.settings.chunk_ms
        self.streams[chunk_ms].remove(stream)
        self.changed[chunk_ms].pop(stream, None)
        self.unstepped[chunk_ms].pop(stream, None)
        metrics.active_streams.labels(str(chunk_ms)).dec()
        stream.abandoned = True  # never stepped again (a loop may still hold it in a batch it is filling)
        if not stream.in_step:  # else the step in flight still writes this slot: freed afterwards
            self._release(stream)

    # --- live streams as async iterators: what the servicer uses in one process --------------------------------
    async def recognize(self, settings: StreamSettings, audio: AsyncIterator[np.ndarray]):
        async for update in self.recognize_timed(settings, _arrivals(audio)):
            yield update

    async def recognize_timed(self, settings: StreamSettings, audio: AsyncIterator[Arrival]):
        """`recognize`, for audio stamped where it arrived: pieces `(samples, perf_counter time)`, and
        `(None, time)` for the end of the audio."""
        await self.slot_free()
        updates: asyncio.Queue = asyncio.Queue()
        stream = self.join(settings, updates.put_nowait)
        pump = asyncio.create_task(self._pump(stream, audio))
        try:
            while True:
                update = await updates.get()
                if isinstance(update, BaseException):
                    raise update
                yield update
                if update.is_final:
                    return
        finally:
            pump.cancel()
            self.leave(stream)

    async def _pump(self, stream: Stream, audio: AsyncIterator[Arrival]) -> None:
        ended_at = None
        try:
            async for piece, arrived_at in audio:
                if piece is None:
                    ended_at = arrived_at
                    break
                self.feed(stream, piece, arrived_at)
        except Exception as exc:  # malformed audio: hand it to the stream's reader
            stream.deliver(exc)
            return
        self.end_audio(stream, ended_at or time.perf_counter())

    def _touch(self, stream: Stream) -> None:
        """`stream`'s readiness may have changed: its loop looks at it (and only at it) when it wakes."""
        self.changed[stream.settings.chunk_ms][stream] = None
        self.wake[stream.settings.chunk_ms].set()

    def take_changed(self, chunk_ms: int) -> list[Stream]:
        """The streams touched since the last call (in order), forgotten here."""
        changed, self.changed[chunk_ms] = self.changed[chunk_ms], {}
        return list(changed)

    def _held_until(self, stream: Stream) -> float:
        """Until when a new stream's first step waits for others joining (0: not held).

        A stream's first step (no pre-encode history yet, a shorter first chunk) cannot share an encoder call
        with streams already running. Streams that start together — a burst of calls — should share theirs,
        or each wave of arrivals pays its own first steps (and, at 80 ms, second steps) and finishes steps
        behind the others. So a first step waits until no stream of its chunk size has joined for
        `join_window`, and never longer than one chunk after the stream's own arrival."""
        if stream.steps or not self.join_window_s:
            return 0.0
        chunk_s = stream.settings.chunk_ms / 1000
        return min(self.last_join[stream.settings.chunk_ms] + self.join_window_s, stream.joined_at + chunk_s)

    def _ready(self, stream: Stream) -> bool:
        if stream.finished or stream.in_step or stream.abandoned:
            return False
        if self._held_until(stream) > time.perf_counter():
            return False
        available = stream.mel_available()
        if stream.closed:
            return True  # either a last (possibly short) chunk, or just the final hypothesis
        return available >= stream.mel_consumed + self.chunk_mel(stream)

    def _completed_at(self, stream: Stream) -> float:
        """When `stream`'s next chunk was complete: the arrival of its last sample (or the end of the audio)."""
        last = (stream.mel_consumed + self.chunk_mel(stream) - 1) * features.HOP_SAMPLES + features.STFT_HALF_WINDOW
        return stream.arrival_of_sample(last)

    def _has_run(self, chunk_ms: int) -> bool:
        """Whether `chunk_ms` has a step in flight whose device work is done (reading it back would not wait)."""
        launched = self.in_flight.get(chunk_ms)
        if launched is None:
            return False
        tokens = launched.result.new_tokens
        return not isinstance(tokens, TokenTable) or tokens.has_run()

    def _fillable(self, chunk_ms: int) -> int:
        """How many streams a batch could take now: those not finished and not in a step, up to the cap."""
        waiting = sum(1 for s in self.streams[chunk_ms] if not s.finished and not s.in_step)
        return min(waiting, self.max_batch_streams)

    async def _gather_ready(self, chunk_ms: int) -> list[Stream]:
        """The streams ready to step, after waiting up to `batch_wait_fraction` of a chunk for the others.

        Streams' chunks complete at different moments; stepping each as soon as it is ready makes many small
        steps, each paying the per-step overhead (every layer's kernels once per step). Waiting a bounded
        fraction of the chunk lets the batch fill: latency spent for capacity. The wait is counted from when the
        oldest ready chunk was complete, not from when the loop looks: a chunk that already waited for the step in
        flight is not held again, so under load a step is launched beside the one in flight (overlapped steps)
        instead of after a wait with the device idle (at 1,024 paced streams on an H100 a step was in flight 47 % of
        the time, results/h200/README.md, v6). While the wait lasts, a step in flight is read back once it has run
        (its streams may join this batch). One look at every stream per call (about one per step); while waiting,
        only the streams touched since are looked at."""
        self.take_changed(chunk_ms)  # looked at now, all of them
        ready = [stream for stream in self.streams[chunk_ms] if self._ready(stream)]
        fillable = self._fillable(chunk_ms)
        if not ready or len(ready) >= fillable or not self.batch_wait_fraction:
            return ready
        loop = asyncio.get_running_loop()
        oldest = min(self._completed_at(stream) for stream in ready)  # time.perf_counter()
        deadline = loop.time() + oldest + self.batch_wait_fraction * chunk_ms / 1000 - time.perf_counter()
        wake = self.wake[chunk_ms]
        taken = set(ready)
        while len(ready) < fillable and (left := deadline - loop.time()) > 0:
            if self._has_run(chunk_ms):
                await self.drain(chunk_ms)  # its streams' results do not wait for the batch; they may join it
                fillable = self._fillable(chunk_ms)
            else:
                wake.clear()
                if chunk_ms in self.in_flight:  # a CUDA event has no awaitable: look again shortly
                    left = min(left, STEP_POLL_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), left)
            for stream in self.take_changed(chunk_ms):
                if stream not in taken and self._ready(stream):
                    ready.append(stream)
                    taken.add(stream)
        return [stream for stream in ready if self._ready(stream)]  # none left or failed meanwhile

    def _hold_left(self, chunk_ms: int) -> float | None:
        """Seconds until the first held stream may step, or None when none is held."""
        now = time.perf_counter()
        held = [until - now for s in self.unstepped[chunk_ms] if (until := self._held_until(s)) > now]
        return min(held) if held else None

    async def _batch_loop(self, chunk_ms: int) -> None:
        if self.step_policy == "clocked":
            return await clocked_loop(self, chunk_ms)
        wake = self.wake[chunk_ms]
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._hold_left(chunk_ms))
            wake.clear()
            while True:
                while ready := await self._gather_ready(chunk_ms):
                    await self._step_streams(ready)
                # Nothing more to launch: read the step in flight back; its streams may be ready again.
                if not await self.drain(chunk_ms):
                    break

    async def _step_streams(self, ready: list[Stream], every_batch: bool = False) -> None:
        """Finish the exhausted streams of `ready` and step the rest: one batch (of up to `max_batch_streams`)
        per group of streams that can share a call; with `every_batch`, all of each group's batches."""
        exhausted = [s for s in ready if s.closed and s.mel_available() == s.mel_consumed]
        for stream in exhausted:
            self._finish(stream)
        groups: dict[tuple, list[Stream]] = {}
        for stream in ready:
            if not stream.finished:
                groups.setdefault(self.group_key(stream), []).append(stream)
        for group in groups.values():
            starts = range(0, len(group), self.max_batch_streams) if every_batch else [0]
            for start in starts:
                await self._step_batch(group[start : start + self.max_batch_streams])

    async def _step_batch(self, streams: list[Stream]) -> None:
        """Launch a step of `streams`; with overlapped steps, read back the one launched before it now (its
        device work ran while this one was prepared), else this one at once."""
        batch = sorted(streams, key=lambda stream: stream.slot)
        for stream in batch:
            stream.in_step = True
        try:
            async with self.device_lock:
                launched = await finish_holding(asyncio.to_thread(self._launch, batch))
        except Exception as exc:  # an engine failure fails these streams, not the service
            self._settle(batch, [exc] * len(batch))
            return
        chunk_ms = batch[0].settings.chunk_ms
        earlier = self.in_flight.pop(chunk_ms, None)
        self.in_flight[chunk_ms] = launched
        if earlier is not None:
            metrics.overlapped_steps.labels(str(chunk_ms)).inc()
            await self._collect_step(earlier)
        if not self.overlap_steps:
            await self.drain(chunk_ms)

    async def drain(self, chunk_ms: int) -> bool:
        """Read back the step of `chunk_ms` in flight, if any, and deliver its streams' updates; whether there was
        one (its streams may be ready to step again)."""
        if (launched := self.in_flight.pop(chunk_ms, None)) is None:
            return False
        await self._collect_step(launched)
        return True

    async def _collect_step(self, launched: Launched) -> None:
        # Not under the device lock: reading back touches no model state, only the step's own streams.
        try:
            updates = await finish_holding(asyncio.to_thread(self._collect, launched))
        except Exception as exc:
            updates = [exc] * len(launched.streams)
        self._settle(launched.streams, updates)

    def _settle(self, batch: list[Stream], updates: list) -> None:
        """A step's streams are out of it: each gets its update (or failure), or its slot back if it left."""
        latencies = []
        for stream, update in zip(batch, updates, strict=True):
            stream.in_step = False
            if stream.steps:
                self.unstepped[stream.settings.chunk_ms].pop(stream, None)
            if stream.abandoned:
                self._release(stream)
            elif isinstance(update, BaseException):
                stream.finished = True
                stream.deliver(step_failure(update))
                end_process_after(update, log)  # a CUDA fault: every later step would fail too
            else:
                latencies.append(update.processing_latency_s)
                self._deliver(stream, update)
                if not stream.finished:
                    self._touch(stream)  # more of its audio may have come while it stepped
        if latencies:  # one call per step: from the engine process one message, not one per stream
            metrics.observe_all(self.chunk_latency[batch[0].settings.chunk_ms], latencies)

    def _deliver(self, stream: Stream, update: RecognitionUpdate) -> None:
        last = stream.closed and stream.mel_available() == stream.mel_consumed
        if not last:  # interim results too: the servicer drops them where not asked for, after counting progress
            stream.deliver(update)
        if last:
            self._finish(stream, update)

    def _finish(self, stream: Stream, last: RecognitionUpdate | None = None) -> None:
        stream.finished = True
        now = time.perf_counter()
        metrics.final_latency.labels(str(stream.settings.chunk_ms)).observe(now - stream.closed_at)
        if self.record_dir is not None:
            name, width = f"{stream.settings.request_id}.{self.name}", self.shape.d_model
            try:
                record_encoder_output(
                    self.record_dir,
                    name,
                    "streaming",
                    stream.encoded,
                    stream.token_ids,
                    width,
                    stream.step_rows,
                    stream.step_tokens,
                )
            except Exception as exc:  # this stream fails; the batching loop that delivered must go on
                log.exception("recording stream %s failed", stream.settings.request_id)
                stream.deliver(step_failure(exc))
                return
        stream.deliver(
            RecognitionUpdate(
                transcript=stream.transcript,
                token_ids=tuple(stream.token_ids),
                is_final=True,
                audio_processed_s=stream.mel_consumed * features.HOP_SAMPLES / features.SAMPLE_RATE,
                processing_latency_s=now - stream.closed_at,
                chunk_index=last.chunk_index if last else max(stream.steps - 1, 0),
                encoder_frames=last.encoder_frames if last else 0,
                batch_size=last.batch_size if last else 0,
            )
        )


async def _arrivals(audio: AsyncIterator[np.ndarray]) -> AsyncIterator[Arrival]:
    async for piece in audio:
        yield piece, time.perf_counter()
    yield None, time.perf_counter()
