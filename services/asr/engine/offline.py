"""Recognize calls on the batching backend: the offline lane beside the live streams.

Clips up to `offline_pass_s` run as one encoder pass under the device lock. A longer clip would hold it for seconds
and stall every live stream, so it is stepped like a stream of its own, in an offline slot beside the live ones, for
at most `offline_slice_ms` per hold of the lock; the lock is fair (first come, first served), so live steps that
queued meanwhile run before its next slice. Stepping gives the streaming result, which for the cache-aware backend
equals the offline pass (tests/asr/test_streaming.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable

import numpy as np
import torch

from services.asr import metrics
from services.asr.backend import OfflineResult, StreamSettings, step_failure
from services.asr.engine import features
from services.asr.engine.stream import Stream, record_encoder_output
from voiceagent.serving.device_fault import end_process_after
from voiceagent.serving.errors import ServiceError

log = logging.getLogger(__name__)

OFFLINE_LANES = 1  # long clips stepped at once; more wait for the lane (each holds a cache slot)


async def finish_holding(work: Awaitable):
    """Await `work` (a step in a worker thread) even when cancelled: the caller holds the device lock, and
    releasing it while the thread still runs would let a second step use the model at the same time (a
    cancelled Recognize did exactly that, and a live step beside it failed inside the model). The work becomes a
    task first: a coroutine can be awaited once only, so waiting again on the coroutine itself raised at once."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():  # cancelled again meanwhile: keep waiting, the lock is still ours
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # taken: the step's own failure is not the cancelled caller's to report
        raise


class OfflineLane:
    """BatchingBackend's Recognize calls (a mixin: it uses the backend's model, slots, lock and step)."""

    async def transcribe(self, settings: StreamSettings, audio: np.ndarray) -> OfflineResult:
        metrics.offline_requests.inc()
        try:
            if len(audio) <= self.offline_pass_samples:
                async with self.device_lock:
                    return await finish_holding(asyncio.to_thread(self._offline, settings, audio))
            return await self._transcribe_stepped(settings, audio)
        except ServiceError:
            raise
        except Exception as exc:
            end_process_after(exc, log)  # a CUDA fault: every later step would fail too
            raise step_failure(exc) from exc
        finally:
            metrics.offline_requests.dec()

    async def _transcribe_stepped(self, settings: StreamSettings, audio: np.ndarray) -> OfflineResult:
        """A long clip stepped chunk by chunk in an offline slot, one slice per hold of the device lock; a
        cancelled call (client gone, deadline) stops at the end of the slice in progress."""
        slot = await self.offline_slots.get()
        try:
            started = time.perf_counter()
            stream = self._new_stream(settings, slot)
            fed = 0
            while not stream.closed or stream.mel_consumed < stream.mel_available():
                async with self.device_lock:  # fair: live steps queued during the last slice go first
                    fed = await finish_holding(asyncio.to_thread(self._offline_slice, stream, audio, fed))
            return OfflineResult(
                transcript=stream.transcript,
                token_ids=tuple(stream.token_ids),
                audio_s=len(audio) / features.SAMPLE_RATE,
                processing_s=time.perf_counter() - started,
            )
        finally:
            self.offline_slots.put_nowait(slot)

    def _offline_slice(self, stream: Stream, audio: np.ndarray, fed: int) -> int:
        """Steps of one offline stream until its audio is consumed or the slice's engine time is spent. The
        clip is fed a second at a time, as it would stream in, so no step computes the features of the whole
        clip at once. Returns how many samples have been fed."""
        started = time.perf_counter()
        while time.perf_counter() - started < self.offline_slice_s:
            while not stream.closed and stream.mel_available() < stream.mel_consumed + self.chunk_mel(stream):
                piece = audio[fed : fed + features.SAMPLE_RATE]
                fed += len(piece)
                stream.append(piece, started)
                if fed >= len(audio):
                    stream.closed, stream.closed_at = True, time.perf_counter()
            if stream.closed and stream.mel_consumed >= stream.mel_available():
                break
            self._step([stream])
        return fed

    @torch.inference_mode()
    def _offline(self, settings: StreamSettings, audio: np.ndarray) -> OfflineResult:
        started = time.perf_counter()
        encoder = self.model.encoder
        encoder.set_default_att_context_size(self.contexts[settings.chunk_ms])
        signal = torch.from_numpy(audio).unsqueeze(0).to(self.device)
        length = torch.tensor([signal.shape[1]], device=self.device)
        mel, mel_len = self.model.preprocessor(input_signal=signal, length=length)
        encoded, encoded_len = encoder(audio_signal=mel.to(self.dtype), length=mel_len)
        token_ids: list[int] = []
        if int(encoded_len[0]) > 0:
            (hypothesis,) = self.model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=encoded_len, return_hypotheses=True
            )
            token_ids = _token_list(hypothesis.y_sequence)
        if self.record_dir is not None and settings.request_id != "warm-up":
            frames = encoded[0, :, : int(encoded_len[0])].T.float().cpu().numpy()
            name = f"{settings.request_id}.{self.name}"
            record_encoder_output(self.record_dir, name, "offline", [frames], token_ids, self.shape.d_model)
        return OfflineResult(
            transcript=self.detokenizer(token_ids),
            token_ids=tuple(token_ids),
            audio_s=len(audio) / features.SAMPLE_RATE,
            processing_s=time.perf_counter() - started,
        )


def _token_list(sequence) -> list[int]:
    return sequence.tolist() if isinstance(sequence, torch.Tensor) else list(sequence)
