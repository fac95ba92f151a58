"""VoxCPM2 backend: a pool of worker processes, each running one VoxCPM2 model, streaming patch by patch.

`worker_main` runs in each worker process (heavy imports happen there, not in the server process): it loads
the model, measures the per-patch work, warms up and then serves "begin / segment* / end" jobs, sending every
160 ms patch the moment `VoxCPM2Model.generate_streaming` yields it, already in the requested format.
`VoxCPMBackend` is the server-side half: it leases a worker per request and relays its patches.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from services.tts.backend import AudioPiece, SynthesisRequest
from services.tts.config import TTSConfig
from services.tts.context import SegmentBudget
from services.tts.metrics import TTSMetrics
from services.tts.pool import WorkerPool
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.metrics import service_metrics

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
    def from_config(cls, config: TTSConfig) -> WorkerSpec:
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


def worker_main(spec: WorkerSpec, conn, cancel) -> None:
    """Entry point of a worker process."""
    import signal

    import torch

    from services.tts.audio import AudioFormatter
    from services.tts.backends import voxcpm_model

    # The server drains in-flight streams on SIGINT/SIGTERM and then stops its workers; a Ctrl-C sent to the
    # whole process group must not kill them first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(spec.threads)
    model = load_model(spec)
    work = voxcpm_model.PatchWork(model.config, *voxcpm_model.vae_patch_work(model))
    for _ in model.generate_streaming(target_text=WARM_UP_TEXT, max_len=2, inference_timesteps=spec.timesteps):
        pass
    conn.send(("ready", ready_payload(model, spec, work)))
    formatter = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        kind, job = message[0], message[1] if len(message) > 1 else None
        try:
            if kind == "stop":
                return
            if kind == "begin":
                seed, rate, pcm16 = message[2:]
                torch.manual_seed(seed)
                formatter = AudioFormatter(model.sample_rate, rate, pcm16)
            elif kind == "segment":
                index, text, timesteps, cfg_value = message[2:]
                context = len(model.text_tokenizer(text)) + 1  # text tokens + the audio-start token
                patches = 0
                stream = model.generate_streaming(
                    target_text=text,
                    max_len=segment_max_len(spec, text),
                    inference_timesteps=timesteps,
                    cfg_value=cfg_value,
                )
                try:
                    for patch in stream:
                        if cancel.is_set():
                            break
                        audio, samples = formatter.convert(patch.numpy())
                        conn.send(("audio", job, index, audio, samples, *work.per_patch(context + patches, timesteps)))
                        patches += 1
                finally:
                    stream.close()  # restores the VAE's streaming hooks
                conn.send(("segment_done", job, index, patches))
            elif kind == "end":
                cancel.clear()
                tail = formatter.flush() if formatter else (b"", 0)
                formatter = None
                conn.send(("ended", job, *tail))
        except Exception as exc:  # reported to the request, the worker lives on
            conn.send(("error", job, f"{type(exc).__name__}: {exc}"))


class VoxCPMBackend:
    def __init__(self, config: TTSConfig, metrics: TTSMetrics):
        self.config = config
        self.spec = WorkerSpec.from_config(config)
        self.metrics = metrics
        self.work = service_metrics("tts")
        self.pool = WorkerPool(worker_main, self.spec, config.workers, config.max_queue, metrics)
        self.facts: ModelFacts | None = None
        self.context: SegmentBudget | None = None  # set at start, from the worker's tokenizer
        self.limits = {
            "workers": config.workers,
            "max_queue": config.max_queue,
            "max_text_chars": config.max_text_chars,
            "threads_per_worker": config.threads_per_worker,
        }

    async def start(self) -> None:
        from importlib.metadata import version

        ready = await self.pool.start()
        self.facts = ModelFacts(
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

    async def synthesize(self, request: SynthesisRequest) -> AsyncIterator[AudioPiece]:
        segments = aiter(request.segments)
        text = await anext(segments, None)
        if text is None:
            return
        async with self.pool.lease() as lease:
            lease.send("begin", request.seed, request.sample_rate_hz, request.pcm16)
            index, generation_s = 0, 0.0
            while text is not None:
                started = time.perf_counter()
                lease.send("segment", index, text, request.inference_timesteps, request.cfg_value)
                while (message := await lease.receive())[0] == "audio":
                    _, _, _, audio, samples, flops, read_bytes = message
                    self.work.record_work(flops, read_bytes)
                    yield AudioPiece(audio, samples, index, 1, lease.queue_s)
                generation_s += time.perf_counter() - started
                text = await anext(segments, None)
                index += 1
            lease.send("end")
            _, _, tail, samples = await lease.receive()
        # outside the lease: the worker is already free while the closing piece goes out
        yield AudioPiece(tail, samples, index - 1, 0, lease.queue_s, is_last=True, generation_s=generation_s)
