"""The batched TTS engine's host time per step, without a model: services/tts/backends/batched_engine.py's own
_Scheduler stepping R running requests whose steps are instant (a stand-in engine returning zero audio of voxcpm2's
patch, 7,680 float32 samples), its Patches and Stepped messages going out over real Channels (Unix socket pairs) to
front ends that only drain their sockets (threads, no event loop). What is left per step is the engine process's own
work between two launches: the requests' noise from their own generators, the launch call, the rows' bookkeeping, the
per-step FLOP/byte model, pickling and writing the step's audio. On the GPU that work sits between one step's end and
the next one's launch (results/h200/README.md §3j: 22-27 ms per step outside the step's graph at 243-364 rows). With
a device time per step (the last two rows: 50 ms), the step is waited for as on a GPU, and what the host does while it
waits is hidden: ms per step - device ms is the host's gap between two launches.

.venv/tts/bin/python results/cpu/tts_step_host_2026-12-07/step_host.py   (from the repository root)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from services.tts.backends.batched_engine import EngineSpec, Join, Speak, _Scheduler  # noqa: E402
from services.tts.backends.voxcpm import WorkerSpec  # noqa: E402
from services.tts.config import TtsConfig  # noqa: E402
from voiceagent.serving.channel import Channel  # noqa: E402

SAMPLES = 7680  # voxcpm2: 4 latent frames x 1,920 samples at 48 kHz = 160 ms


class _Done:
    """A step done `device_s` after its launch (0: at launch, as on a CPU; more: as a device running it while the
    host goes on, as on a GPU): zero audio, no stop."""

    def __init__(self, rows: int, samples: int, device_s: float):
        self.audio, self.rows = torch.zeros(rows, samples), rows
        self.done_at = time.perf_counter() + device_s

    def ready(self) -> bool:
        return time.perf_counter() >= self.done_at

    def wait(self) -> None:
        time.sleep(max(0.0, self.done_at - time.perf_counter()))

    def result(self):
        return self.audio, [False] * self.rows


class _InstantEngine:
    prefill_stream = None  # prefill before the step (nothing waits once every request runs)
    max_length = 512

    def __init__(self, feat_dim: int, patch_size: int, dtype: torch.dtype, samples: int, device_s: float):
        self.feat_dim, self.patch_size, self.dtype, self.samples = feat_dim, patch_size, dtype, samples
        self.device_s = device_s

    def noise(self, generator: torch.Generator) -> torch.Tensor:  # as BatchedVoxCPM.noise
        return torch.randn((1, self.feat_dim, self.patch_size), generator=generator, dtype=self.dtype)[0]

    def launch(self, slots, timesteps, cfg_values, noise) -> _Done:
        return _Done(len(slots), self.samples, self.device_s)

    def text_tokens(self, text: str) -> list[int]:
        return [1] * 15

    def patch_limit(self, tokens: int, most: int) -> int:
        return 1 << 30  # never done: every request stays in the batch

    def prefill(self, slots, tokens) -> None:
        pass


class PatchWork:
    """Stands in for voxcpm_model.PatchWork (which needs the model); the real one's cost per step is measured apart."""

    def per_step(self, contexts, timesteps) -> tuple[float, float]:
        return 0.0, 0.0


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed under it at the end of a run
        while sock.recv(1 << 20):
            pass


async def per_step_ms(rows: int, frontends: int, samples: int, seconds: float, device_ms: float = 0) -> list[float]:
    engine = _InstantEngine(64, 4, torch.bfloat16, samples, device_ms / 1000)  # voxcpm2's feat_dim, patch_size, dtype
    channels, pairs = [], []
    for _ in range(frontends):
        mine, theirs = socket.socketpair()
        threading.Thread(target=_drain, args=(theirs,), daemon=True).start()
        channels.append(await Channel.open(mine))
        pairs.append(theirs)
    spec = EngineSpec(WorkerSpec.from_config(TtsConfig(preset="voxcpm2")), rows, 512)
    scheduler = _Scheduler(engine, PatchWork(), channels, spec)
    for request in range(rows):
        channel = request % frontends
        scheduler.dispatch(Join(request, request, 10, 2.0), channel)
        scheduler.dispatch(Speak(request, 0, "Streaming speech starts before the sentence ends."), channel)
    stamps: list[float] = []  # when each step began (its noise, its launch): one step's interval to the next
    step = scheduler._step

    async def stamped(batch, prefill_s):
        stamps.append(time.perf_counter())
        await step(batch, prefill_s)

    scheduler._step = stamped
    loop = asyncio.ensure_future(scheduler.run())
    await asyncio.sleep(0.5 + seconds)  # the prefill and the first steps, then the measured ones
    begun = next(at for at in stamps if at >= stamps[0] + 0.5)
    samples_ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False) if a >= begun]
    loop.cancel()
    for channel in channels:
        await channel.close()
    for sock in pairs:
        sock.close()
    return samples_ms


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, host CPUs {len(os.sched_getaffinity(0))}")
    columns = f"{'samples/row':>12}{'device ms':>10}{'ms per step p50':>16}{'min':>8}{'max':>8}"
    print(f"{'rows':>5}{'front ends':>11}{columns}")
    runs = ((64, 1, SAMPLES, 0), (256, 1, SAMPLES, 0), (256, 4, SAMPLES, 0), (256, 4, 0, 0), (384, 4, SAMPLES, 0))
    runs += ((256, 4, SAMPLES, 50), (384, 4, SAMPLES, 50))  # a device step of 50 ms: what of the host's work it hides
    for rows, frontends, samples, device_ms in runs:
        found = asyncio.run(per_step_ms(rows, frontends, samples, 4.0, device_ms))
        spread = f"{statistics.median(found):>16.2f}{min(found):>8.2f}{max(found):>8.2f}"
        print(f"{rows:>5}{frontends:>11}{samples:>12}{device_ms:>10}{spread}")


if __name__ == "__main__":
    main()
