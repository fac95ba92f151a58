"""Which capture set-up replays safely: the ASR engine with CUDA graphs, built as the service builds it, then
served (waves of streams and a long Recognize, through the backend's own asyncio loop and worker threads).

`python -m results.h200.asr_graph_bisect --variant NAME` (one process per variant: an illegal memory access
poisons the CUDA context) prints `RESULT NAME ok ...` or `RESULT NAME failed: ...`, and a digest of the
streams' token ids (graphs must give the eager path's tokens). Variants:
  eager        no graphs, no padded steps (the service with --cuda-graphs false)
  padded       the padded steps run eagerly (graphs replay the same kernels: the same digest)
  before       the capture set-up of the H200 main job: first and steady steps, all graphs in ONE shared
               pool, torch's default capture stream, cuBLAS workspaces left as cached
  before-steady  the same, steady steps only (first steps eager): the set-up of the measured v4 runs
  before-first   the same, first steps only
  fixed        the current code: one pool per padded step, the backend's own capture stream, cuBLAS
               workspaces released before and after capture, graphs never destroyed
  fixed-steady the same, steady steps only (--graph-first-steps false)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time

import numpy as np
import torch

from services.asr.backend import StreamSettings
from services.asr.backends.in_process import load_in_process
from services.asr.config import AsrConfig
from services.asr.engine.step_graphs import PaddedStep, buckets_up_to

CHUNK_MS = 320


def capture_as_before(backend, first_steps=(False, True)) -> None:
    """The main job's prepare_padded_steps: one pool shared by every padded step, default capture stream."""
    buckets = buckets_up_to(backend.max_batch_streams)
    pool = None
    for first in first_steps:
        history = 0 if first else backend.pre_encode_frames
        step = PaddedStep(backend, CHUNK_MS, history, buckets, backend.slot_count, True, pool)
        backend.padded[CHUNK_MS, history] = step
        pool = step.pool


async def serve(backend, waves: int, streams: int, seconds: float) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(0)

    async def one(name: str, audio: np.ndarray):
        async def pieces():
            for start in range(0, len(audio), 16 * CHUNK_MS):
                yield audio[start : start + 16 * CHUNK_MS]

        last = None
        async for update in backend.recognize(StreamSettings(name, CHUNK_MS, True), pieces()):
            last = update
        return last.token_ids

    tokens = []
    for wave in range(waves):
        clips = [
            rng.standard_normal(int(16000 * seconds * (1 + i % 3) / 3)).astype(np.float32) * 0.1 for i in range(streams)
        ]
        jobs = [one(f"w{wave}s{i}", clip) for i, clip in enumerate(clips)]
        long_clip = rng.standard_normal(16000 * 6).astype(np.float32) * 0.1  # stepped in its offline lane
        results = await asyncio.gather(*jobs, backend.transcribe(StreamSettings(f"w{wave}o", CHUNK_MS), long_clip))
        tokens += [*results[:-1], results[-1].token_ids]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True)
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--max-streams", type=int, default=64)
    parser.add_argument("--streams", type=int, default=12)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.5)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (no graphs)")
    args = parser.parse_args()
    variant = args.variant
    config = AsrConfig(
        preset=args.preset, device=args.device, dtype="bfloat16", max_streams=args.max_streams,
        max_batch_streams=args.max_streams, graph_chunks=str(CHUNK_MS), threads=args.threads,
        graph_first_steps=variant != "fixed-steady",
        cuda_graphs=variant not in ("eager", "padded"), padded_steps=variant != "eager",
    )  # fmt: skip
    started = time.perf_counter()
    backend = load_in_process(config)
    if variant.startswith("before"):
        first_steps = {"before": (False, True), "before-steady": (False,), "before-first": (True,)}[variant]
        backend.prepare_padded_steps = lambda: capture_as_before(backend, first_steps)
    elif variant not in ("fixed", "fixed-steady", "eager", "padded"):
        raise SystemExit(f"unknown variant {variant}")

    async def run():
        await backend.start()
        built = time.perf_counter() - started
        try:
            tokens = await serve(backend, args.waves, args.streams, args.seconds)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        finally:
            await backend.stop()
        return built, tokens

    try:
        built, tokens = asyncio.run(run())
    except BaseException as exc:  # noqa: BLE001 - the point is to report it
        print(f"RESULT {variant} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        raise SystemExit(1) from None
    graphs = {step.kind: len(step.graphs) for step in backend.padded.values()}
    digest = hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]
    print(
        f"RESULT {variant} ok: built+captured in {built:.1f} s, graphs {graphs}, {len(tokens)} transcripts, "
        f"{sum(map(len, tokens))} tokens, token digest {digest}",
        flush=True,
    )


if __name__ == "__main__":
    main()
