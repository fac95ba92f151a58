"""The batched step of the NeMo backends, in a worker thread: launched, then read back.

`_launch` (under the device lock) does the step's host work before the device — each stream's new mel frames from
one batched preprocessor call, the slots of new streams reset — and queues its device work (`encode_group`: a padded
step's graph replay, whose token table is copied to the host behind it; other steps decode here). `_collect` (no
lock: it touches no model state, only the step's own streams) waits for the token table and builds each stream's
update. Between the two the device runs, and with overlapped steps the host launches the next step meanwhile
(batching.py).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from services.asr import metrics
from services.asr.backend import RecognitionUpdate
from services.asr.engine import features
from services.asr.engine.slots import upload
from services.asr.engine.step_graphs import TokenTable
from services.asr.engine.stream import GroupResult, Stream


@dataclasses.dataclass
class Launched:
    """A step whose device work is queued: its streams, the mel frames each consumes, what encoding returned."""

    streams: list[Stream]
    sizes: list[int]
    result: GroupResult
    started: float  # time.perf_counter() when its host work began


class Stepping:
    """BatchingBackend's step (a mixin: it uses the backend's model, decoder, slots and `encode_group`)."""

    def _step(self, streams: list[Stream]) -> list[RecognitionUpdate]:
        """One whole step of `streams` (worker thread): launched, then read back."""
        return self._collect(self._launch(streams))

    @torch.inference_mode()  # grad mode is per thread: the worker threads need it set themselves
    def _launch(self, streams: list[Stream]) -> Launched:
        """The step's host work before the device (features, inputs) and its device work, queued (worker thread,
        under the device lock). A padded step's tokens are read back by `_collect`; other steps decode here."""
        started = time.perf_counter()
        self._reset_due_slots()
        sizes = [self.chunk_mel(stream) for stream in streams]
        segments = [
            stream.feature_segment(stream.mel_consumed + size) for stream, size in zip(streams, sizes, strict=True)
        ]
        result = self.encode_audio(streams, segments)
        if result is None:  # features here, then the encoder
            chunks, sizes = self._chunks(segments, sizes)
            result = self.encode_group(streams, chunks)
        if result.new_tokens is None:
            lengths = upload(torch.tensor(result.lengths), self.device)
            result.new_tokens = self.decoder.decode(result.encoded, lengths, [stream.slot for stream in streams])
        if self.record_dir is not None:  # the static output is the next step's once that is launched
            result.encoded = result.encoded.clone()
        return Launched(streams, sizes, result, started)

    @torch.inference_mode()
    def _collect(self, launched: Launched) -> list[RecognitionUpdate]:
        """Wait for a launched step's tokens, then each stream's update (worker thread, no device lock)."""
        streams, sizes, result = launched.streams, launched.sizes, launched.result
        new_tokens = result.new_tokens
        if isinstance(new_tokens, TokenTable):
            new_tokens = new_tokens.tokens()
        finished = time.perf_counter()
        chunk_label = str(streams[0].settings.chunk_ms)
        metrics.step_batch.labels(chunk_label).observe(len(streams))
        metrics.step_duration.labels(chunk_label).observe(finished - launched.started)
        self.work.record_work(result.flops, result.read_bytes)
        metrics.encoder_frames.labels(chunk_label).inc(sum(result.frames_computed))
        metrics.audio_processed.labels(chunk_label).inc(sum(sizes) * features.HOP_SAMPLES / features.SAMPLE_RATE)
        updates = []
        for index, (stream, size, tokens) in enumerate(zip(streams, sizes, new_tokens, strict=True)):
            completed_at = stream.arrival_of_sample(
                (stream.mel_consumed + size - 1) * features.HOP_SAMPLES + features.STFT_HALF_WINDOW
            )
            stream.mel_consumed += size
            known = len(stream.token_ids)
            stream.token_ids += tokens
            stream.transcript = self.detokenizer.extend(stream.transcript, stream.token_ids, known)
            if self.record_dir is not None:
                frames = result.encoded[index, :, : result.lengths[index]].T
                stream.encoded.append(frames.float().cpu().numpy().copy())
                stream.step_rows.append(len(streams))
                stream.step_tokens.append(len(tokens))
            updates.append(
                RecognitionUpdate(
                    transcript=stream.transcript,
                    token_ids=tuple(stream.token_ids),
                    is_final=False,
                    audio_processed_s=stream.mel_consumed * features.HOP_SAMPLES / features.SAMPLE_RATE,
                    processing_latency_s=max(0.0, finished - completed_at),
                    chunk_index=stream.steps,
                    encoder_frames=result.frames_computed[index],
                    batch_size=len(streams),
                )
            )
            stream.steps += 1
        return updates

    def encode_audio(self, streams: list[Stream], segments: list) -> GroupResult | None:
        """A step that computes its streams' features itself, from their audio `segments` (the cache-aware
        backend's padded steps: the mel front end inside the graph); None: features here, then `encode_group`."""
        return None

    def _chunks(self, segments: list, sizes: list[int]) -> tuple[torch.Tensor | list[torch.Tensor], list[int]]:
        """The mel frames each stream's step consumes (from its audio segment), and how many: one batch
        [B, mel, frames] when every stream takes the same number (the steady state), else a list.

        The new frames of every stream come from one batched preprocessor call on the serving device (one call
        per stream would cost a CPU STFT and a host-to-device copy per stream per step), and only the frames the
        step consumes are computed (never a frame left for the next step to join to its new ones). In the steady
        state no tensor operation here is per stream: on a GPU each one is host time per stream per step (the
        join of left-over and new frames was a kernel launch per stream)."""
        mel, busy = features.mel_batch(self.model.preprocessor, self.shape.mel_bins, segments, self.device)
        skip, count = segments[0][1:]
        if len(busy) == len(segments) and all(
            segment[1] == skip and segment[2] == count == size for segment, size in zip(segments, sizes, strict=True)
        ):
            return mel[:, :, skip : skip + count], sizes
        # A closed stream's last chunk (fewer frames, or none: only its final hypothesis is due), or a first step
        # beside later ones: one view per stream.
        chunks = [torch.zeros(self.shape.mel_bins, 0, device=self.device)] * len(segments)
        for row, index in enumerate(busy):
            _samples, skip, count = segments[index]
            chunks[index] = mel[row, :, skip : skip + count]
        return chunks, [chunk.shape[1] for chunk in chunks]

    def _reset_due_slots(self) -> None:
        """Reset every slot taken since the last step (steps are serialised, so no step reads one before)."""
        with self.resets_lock:
            due, self.resets_due = self.resets_due, []
        if not due:
            return
        by_context: dict[int, tuple[list[int], list[int]]] = {}
        for slot, context in due:
            by_context.setdefault(context[0], ([], context))[0].append(slot)
        for slots, context in by_context.values():
            self.reset_slots(slots, context)
        self.decoder.reset([slot for slot, _context in due])
