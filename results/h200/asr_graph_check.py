"""Check and time the captured ASR step on a GPU: one chunk size's padded steady step, graph vs eager.

`python -m results.h200.asr_graph_check --preset nemotron-0.6b --chunk-ms 320 --max-streams 2048` builds the
cache-aware backend with CUDA graphs for that chunk size (buckets 1, 2, 4, ... max), then for each bucket
fills the bucket's rows with random mel input and random cache/decoder state in distinct slots, replays the
graph, restores the state, runs the same step eagerly, and compares encoder output, caches and tokens; then
times a replay against an eager step of the same rows (median of --repeats, after a synchronize each).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from services.asr.backends.in_process import load_in_process
from services.asr.config import AsrConfig


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--chunk-ms", type=int, default=320)
    parser.add_argument("--max-streams", type=int, default=2048)
    parser.add_argument("--device", default="cuda", help="cuda (graphs) or cpu (a smoke test of this script)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--time-buckets", default="1,64,256,1024,2048")
    args = parser.parse_args()
    started = time.perf_counter()
    config = AsrConfig(
        preset=args.preset, device=args.device, dtype="bfloat16", max_streams=args.max_streams,
        max_batch_streams=args.max_streams, graph_chunks=str(args.chunk_ms), features_in_step=False,
    )  # fmt: skip
    backend = load_in_process(config)
    built = time.perf_counter()
    backend.prepare_padded_steps()  # (the service does this after its warm-up)
    step = backend.padded[args.chunk_ms, backend.pre_encode_frames]  # the steady step (mel frames in)
    print(
        f"model built in {built - started:.1f} s; {len(step.graphs)} graphs for buckets {step.buckets} "
        f"captured in {step.capture_s:.1f} s; steady step: width {step.width} mel frames -> {step.frames} frames; "
        f"GPU memory reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB",
        flush=True,
    )
    generator = torch.Generator(device=args.device).manual_seed(0)
    state = [*backend.pools[step.context[0]], *backend.decoder.states, backend.decoder.outputs]
    timings = {int(b) for b in args.time_buckets.split(",")}
    with torch.inference_mode():
        for bucket in step.buckets:
            rows = max(1, bucket - 1) if bucket > 2 else bucket  # a padded batch where the bucket allows it
            order = torch.randperm(args.max_streams, generator=generator, device=args.device)
            slots = order[:rows].sort().values.tolist()
            for tensor in state[:2] + state[3:]:
                if tensor.is_floating_point():
                    tensor.normal_(generator=generator).mul_(0.5)
            backend.pools[step.context[0]][2].fill_(step.context[0])  # full left caches
            signal = torch.randn(rows, step.signal.shape[1], step.width, device=args.device, generator=generator)
            saved = [tensor.clone() for tensor in state]
            encoded_graph, tokens_graph = step.run(signal.to(step.signal.dtype), slots)
            encoded_graph = encoded_graph.float().clone()
            after_graph = [tensor.clone() for tensor in state]
            for tensor, copy in zip(state, saved, strict=True):
                tensor.copy_(copy)
            graphs, step.graphs = step.graphs, {}
            encoded_eager, tokens_eager = step.run(signal.to(step.signal.dtype), slots)
            step.graphs = graphs
            error = (encoded_graph - encoded_eager.float()).abs().max().item()
            pairs = zip(after_graph, state, strict=True)
            state_error = max((a.float() - b.float()).abs().max().item() for a, b in pairs)
            line = (
                f"bucket {bucket:5d} rows {rows:5d}: max |graph - eager| encoder {error:.3g}, state {state_error:.3g}, "
                f"tokens equal {tokens_graph == tokens_eager} ({sum(map(len, tokens_eager))} tokens)"
            )
            if bucket in timings:
                cast = signal.to(step.signal.dtype)
                one_step = lambda s=cast, at=slots: step.run(s, at)  # noqa: E731
                replay = timed(one_step, args.repeats)
                step.graphs = {}
                eager = timed(one_step, args.repeats)
                step.graphs = graphs
                line += f"; step {replay * 1e3:.1f} ms graph vs {eager * 1e3:.1f} ms eager"
            print(line, flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
