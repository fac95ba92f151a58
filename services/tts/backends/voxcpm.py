"""VoxCPM2 backend: a pool of worker processes, each running one VoxCPM2 model, streaming patch by patch.

`worker_main` runs in each worker process (heavy imports happen there, not in the server process): it loads
the model, measures the per-patch work, warms up and then serves Begin / Segment* / End jobs (pool.py's
messages, over the shared channel), sending every 160 ms patch the moment `VoxCPM2Model.generate_streaming`
yields it, already in the requested format; generation runs on a thread while the loop keeps the channel.
`VoxCPMBackend` is the server-side half: it leases a worker per request and relays its patches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

from services.tts.backend import AudioPiece, SynthesisRequest
from services.tts.config import TtsConfig
from services.tts.context import SegmentBudget
from services.tts.metrics import tts_metrics
from services.tts.pool import (
    Audio,
    Begin,
    End,
    Ended,
    Ready,
    Segment,
    SegmentDone,
    Stop,
    WorkerFailed,
    WorkerPool,
)
from voiceagent.serving.channel import Channel
from voiceagent.serving.device_fault import end_process_after
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.metrics import service_metrics

log = logging.getLogger(__name__)

# VoxCPM wraps its decode loop in tqdm (a stderr line per patch). Set before anything imports tqdm: workers
# import this module first.
os.environ.setdefault("TQDM_DISABLE", "1")

WARM_UP_TEXT = "Warm up."


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to build its model (picklable)."""

    source: str  # preset config.json or checkpoint directory
    checkpoint: bool
    preset: str
    weight_seed: int
    device: str
    threads: int
    timesteps: int
    cfg_value: float
    patches_per_char: float
    max_patches: int
    compile: bool

    @classmethod
    def from_config(cls, config: TtsConfig) -> WorkerSpec:
        return cls(
            source=str(config.model_source),
            checkpoint=bool(config.checkpoint),
            preset=config.preset,
            weight_seed=config.weight_seed,
            device=config.device,
            threads=config.threads_per_worker,
            timesteps=config.inference_timesteps,
            cfg_value=config.cfg_value,
            patches_per_char=config.patches_per_char,
            max_patches=config.max_patches,
            compile=config.compile,
        )


def segment_max_len(spec: WorkerSpec, text: str) -> int:
    """Patches a segment may take. Synthetic weights never stop by themselves (see build_synthetic): they speak
    `patches_per_char` per character; a real model stops itself and this is only the cap."""
    if spec.checkpoint:
        return spec.max_patches
    return min(spec.max_patches, max(4, math.ceil(len(text) * spec.patches_per_char)))


def load_model(spec: WorkerSpec):
    from services.tts.backends import voxcpm_model

    if spec.checkpoint:
        return voxcpm_model.load_checkpoint(Path(spec.source), spec.device, spec.compile)
    return voxcpm_model.build_synthetic(Path(spec.source), spec.weight_seed, spec.device).optimize(
        disable=not spec.compile
    )


def ready_payload(model, spec: WorkerSpec, work) -> dict:
    """What a started engine reports: parameter count, weight bytes, dtype, rate and the shape for GetInfo."""
    from services.tts.backends import voxcpm_model

    parameters = list(model.parameters())
    patch_work = work.per_patch(0, spec.timesteps)
    return {
        "parameter_count": sum(p.numel() for p in parameters),
        "weight_bytes": sum(p.numel() * p.element_size() for p in parameters),
        "dtype": model.config.dtype,
        "sample_rate": model.sample_rate,
        # the gRPC process counts a segment's tokens with it (services/tts/context.py)
        "tokenizer": model.text_tokenizer.tokenizer.backend_tokenizer.to_str(),
        "shape": voxcpm_model.shape_facts(model.config, model.sample_rate, spec.timesteps, spec.cfg_value)
        | dict(zip(("flops_per_patch_at_context_0", "bytes_per_patch_at_context_0"), patch_work, strict=True))
        | {"vae_flops_per_patch": work.vae_flops},
    }


def worker_main(spec: WorkerSpec, sock: socket.socket, cancel) -> None:
    """Entry point of a worker process."""
    import signal

    # The server drains in-flight streams on SIGINT/SIGTERM and then stops its workers; a Ctrl-C sent to the
    # whole process group must not kill them first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(_serve_worker(spec, sock, cancel))


async def _serve_worker(spec: WorkerSpec, sock: socket.socket, cancel) -> None:
    import torch

    from services.tts.backends import voxcpm_model

    channel = await Channel.open(sock)
    loop = asyncio.get_running_loop()
    # One thread does all the torch work (its intra-op thread count is set there), while the event loop keeps
    # the channel: patches are flushed as they are made.
    torch_thread = concurrent.futures.ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(spec.threads,))
    model = await loop.run_in_executor(torch_thread, load_model, spec)
    work = voxcpm_model.PatchWork(model.config, *voxcpm_model.vae_patch_work(model))
    await loop.run_in_executor(torch_thread, _warm_up, model, spec)
    channel.send(Ready(ready_payload(model, spec, work)))
    job = _Job(spec, model, work, channel, cancel)
    while (messages := await channel.receive()) is not None:
        for message in messages:
            if isinstance(message, Stop):
                await channel.close()
                return
            try:  # one job at a time, as the pool leases it
                await loop.run_in_executor(torch_thread, job.handle, message)
            except Exception as exc:  # reported to the request, the worker lives on (unless its device is lost)
                channel.send(WorkerFailed(message.job, f"{type(exc).__name__}: {exc}"))
                end_process_after(exc, log)


def _warm_up(model, spec: WorkerSpec) -> None:
    for _ in model.generate_streaming(target_text=WARM_UP_TEXT, max_len=2, inference_timesteps=spec.timesteps):
        pass


class _Job:
    """A worker's side of the jobs it serves: the model, and the current job's output format."""

    def __init__(self, spec: WorkerSpec, model, work, channel: Channel, cancel):
        self.spec, self.model, self.work, self.channel, self.cancel = spec, model, work, channel, cancel
        self.formatter = None

    def handle(self, message: Begin | Segment | End) -> None:
        import torch

        from services.tts.audio import AudioFormatter

        if isinstance(message, Begin):
            torch.manual_seed(message.seed)
            self.formatter = AudioFormatter(self.model.sample_rate, message.sample_rate_hz, message.pcm16)
        elif isinstance(message, Segment):
            self._speak(message)
        elif isinstance(message, End):
            self.cancel.clear()
            tail, samples = self.formatter.flush() if self.formatter else (b"", 0)
            self.formatter = None
            self.channel.send(Ended(message.job, tail, samples))

    def _speak(self, segment: Segment) -> None:
        model = self.model
        context = len(model.text_tokenizer(segment.text)) + 1  # text tokens + the audio-start token
        patches = 0
        stream = model.generate_streaming(
            target_text=segment.text,
            max_len=segment_max_len(self.spec, segment.text),
            inference_timesteps=segment.timesteps,
            cfg_value=segment.cfg_value,
        )
        try:
            for patch in stream:
                if self.cancel.is_set():
                    break
                audio, samples = self.formatter.convert(patch.numpy())
                flops, read_bytes = self.work.per_patch(context + patches, segment.timesteps)
                self.channel.send(Audio(segment.job, segment.index, audio, samples, flops, read_bytes))
                patches += 1
        finally:
            stream.close()  # restores the VAE's streaming hooks
        self.channel.send(SegmentDone(segment.job, segment.index, patches))


class VoxCPMBackend:
    def __init__(self, config: TtsConfig):
        self.config = config
        self.spec = WorkerSpec.from_config(config)
        self.work = service_metrics("tts")
        self.pool = WorkerPool(worker_main, self.spec, config.workers, config.max_queue, tts_metrics())
        self._facts: ModelFacts | None = None
        self.context: SegmentBudget | None = None  # set at start, from the worker's tokenizer
        self._limits = {
            "workers": config.workers,
            "max_queue": config.max_queue,
            "max_text_chars": config.max_text_chars,
            "threads_per_worker": config.threads_per_worker,
        }

    async def start(self) -> None:
        from importlib.metadata import version

        ready = await self.pool.start()
        self._facts = ModelFacts(
            backend="voxcpm",
            engine_version=version("voxcpm"),
            preset="checkpoint" if self.spec.checkpoint else self.spec.preset,
            source=self.spec.source,
            synthetic_weights=not self.spec.checkpoint,
            parameter_count=ready["parameter_count"],
            weight_bytes=ready["weight_bytes"],
            dtype=ready["dtype"],
            device=self.config.device,
            shape=ready["shape"],
        )
        positions = ready["shape"]["max_length"]
        self.context = SegmentBudget(ready["tokenizer"], positions, f"the model's max_length {positions}",
                                     functools.partial(segment_max_len, self.spec))  # fmt: skip

    async def stop(self) -> None:
        await self.pool.stop()

    def facts(self) -> ModelFacts:
        return self._facts

    def limits(self) -> dict[str, float]:
        return self._limits

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioPiece]:
        segments = aiter(request.segments)
        text = await anext(segments, None)
        if text is None:
            return
        async with self.pool.lease() as lease:
            lease.begin(request.seed, request.sample_rate_hz, request.pcm16)
            index, generation_s = 0, 0.0
            while text is not None:
                started = time.perf_counter()
                lease.segment(index, text, request.inference_timesteps, request.cfg_value)
                while isinstance(message := await lease.receive(), Audio):
                    self.work.record_work(message.flops, message.read_bytes)
                    yield AudioPiece(message.audio, message.samples, index, 1, lease.queue_s)
                generation_s += time.perf_counter() - started
                text = await anext(segments, None)
                index += 1
            lease.end()
            ended = await lease.receive()
        # outside the lease: the worker is already free while the closing piece goes out
        last = index - 1
        yield AudioPiece(ended.tail, ended.samples, last, 0, lease.queue_s, is_last=True, generation_s=generation_s)
