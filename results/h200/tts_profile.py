"""Where the batched VoxCPM2 step spends its time (issue 16): one engine, B requests stepping together.

Builds the batched engine in this process as services/tts/benchmark.py does (bf16 model, float32 VAE, CUDA
graphs per batch bucket), prefills B requests, then per B:
  a) the step as the service runs it (graph replay), timed with CUDA events: ms per step, audio-s/s;
  b) the same step eagerly (attention over the whole cache, as the graph captures it) under torch.profiler:
     device time by kernel class and by phase (the `record_function` ranges of BatchedVoxCPM), the idle time
     between kernels per step, and the top kernels;
  c) the model-derived FLOPs of the step by phase (PatchWork) and the dtype each phase runs in.
With --variants, first the speed-ups of BatchedVoxCPM applied one after another (cumulative), each timed as
served at the largest batch after capturing its graph again: base (cuDNN benchmark mode), fold (weight norm
folded), compile (LocDiT estimator compiled), compile-math, -flash, -efficient, -cudnn (compiled, attention held to
that kernel), compile-lms, compile-lm-glue,
compile-vae (those parts compiled too), vae-bf16 (the VAE in bf16). A variant that fails is reported and undone;
then a) to c) run on what stands.
`python3 results/h200/tts_profile.py --batch 128,16`; on a CPU: `--device cpu --preset tiny --batch 4`.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import functools
import statistics
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from results.h200.kernel_profile import device_kernels, innermost, kernel_class, table, top_kernels
from services.tts.backends import voxcpm_model
from services.tts.backends.batched_model import SOLVER_ATTENTION, BatchedVoxCPM
from services.tts.backends.voxcpm import WorkerSpec, load_model
from services.tts.benchmark import TEXT
from services.tts.config import TtsConfig

# the record_function ranges of BatchedVoxCPM.step, in step order
# fmt: off
PHASES = ("input copy", "locdit solve", "local encoder", "vae decode", "stop head", "base lm", "residual lm",
          "host copy")
# fmt: on
TIMESTEPS, CFG_VALUE = 10, 2.0  # the service's defaults
TIMED, PROFILED = 20, 3  # steps timed as served, steps profiled eagerly


@torch.inference_mode()  # as the engine steps: no autograd graph kept (with one, B=128 ran out of the H200's memory)
def eager_step(engine: BatchedVoxCPM, slots: list[int], noise: torch.Tensor):
    """BatchedVoxCPM.step's eager path, but with attention over the whole cache as its CUDA graph runs it."""
    with record_function("input copy"):
        rows = torch.tensor(slots, dtype=torch.long, device=engine.device)
        cfg = torch.full((len(slots), 1, 1), CFG_VALUE, device=engine.device, dtype=engine.dtype)
        noise = noise.to(engine.device, engine.dtype)
    audio, stop = engine._advance(rows, noise, cfg, [TIMESTEPS] * len(slots), engine.max_length)
    with record_function("host copy"):
        return audio.cpu(), stop.tolist()


def timed_ms(run, on_cuda: bool, repeat: int = 1) -> float:
    """Milliseconds per `run()`: CUDA events around `repeat` calls on a GPU, the wall clock on a CPU."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if on_cuda else []
    begun = time.perf_counter()
    for event in events[:1]:
        event.record()
    for _ in range(repeat):
        run()
    if not on_cuda:
        return (time.perf_counter() - begun) * 1000 / repeat
    events[1].record()
    events[1].synchronize()
    return events[0].elapsed_time(events[1]) / repeat


def profile_eager(engine: BatchedVoxCPM, slots: list[int], steps: int, on_cuda: bool) -> dict[str, float]:
    """b) `steps` eager steps under torch.profiler: time by phase x kernel class, launch gaps, top kernels."""
    noise = lambda: torch.randn(len(slots), engine.feat_dim, engine.patch_size)
    for _ in range(2):
        eager_step(engine, slots, noise())
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])) as prof:
        begun = time.perf_counter()
        for _ in range(steps):
            with record_function("profiled step"):
                eager_step(engine, slots, noise())
        wall_ms = (time.perf_counter() - begun) * 1000 / steps
    events = prof.events()
    ranges = [e for e in events if e.device_type == DeviceType.CPU and e.name in PHASES]
    step_starts = sorted(
        e.time_range.start for e in events if e.device_type == DeviceType.CPU and e.name == "profiled step"
    )
    fp32_model = engine.dtype == torch.float32
    cells, by_kernel, per_step = collections.Counter(), {}, collections.defaultdict(list)
    for k in device_kernels(events, on_cuda, (*PHASES, "profiled step")):
        phase = innermost(ranges, k.launched_us)
        cells[phase, kernel_class(k.name, fp32_model or phase == "vae decode")] += k.duration_us
        by_kernel.setdefault(k.name, collections.Counter())[phase] += k.duration_us
        by_kernel[k.name]["count"] += 1
        if isinstance(k.launched_us, float):  # steps follow each other: the last one begun before the launch
            per_step[bisect.bisect(step_starts, k.launched_us) - 1].append(k)
    kind = "device" if on_cuda else "CPU op self"
    table(f"b) eager step, {kind} time by phase x class", cells, [*PHASES, "outside phases", "unattributed"], steps)
    print(f"eager step wall {wall_ms:.1f} ms (host-bound where far above the {kind} time)")
    for step, kernels in sorted(per_step.items()) if on_cuda else ():
        span = max(k.start_us + k.duration_us for k in kernels) - min(k.start_us for k in kernels)
        idle = span - sum(k.duration_us for k in kernels)  # one stream: kernels do not overlap
        print(
            f"step {step}: {len(kernels)} kernels, span {span / 1000:.2f} ms, idle between kernels "
            f"{idle / 1000:.2f} ms ({idle / span:.0%})"
        )
    print(f"\ntop 15 {'kernels' if on_cuda else 'ops'} by total time: ms per step, count per step, main phase, class")
    classify = lambda name, phase: kernel_class(name, fp32_model or phase == "vae decode")  # noqa: E731
    top_kernels(by_kernel, steps, classify, 15)
    return {phase: sum(v for (p, _), v in cells.items() if p == phase) / steps / 1000 for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="voxcpm2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", default="128", help="batch sizes, comma-separated (e.g. 128,16)")
    parser.add_argument("--cache-positions", type=int, default=512, help="per slot, as tts_batched.sh runs it")
    parser.add_argument("--variants", default="", help="e.g. base,fold,compile,compile-math,vae-bf16 (cumulative)")
    parser.add_argument("--sweep-only", action="store_true", help="with --variants: stop after timing them")
    args = parser.parse_args()
    batches, on_cuda = [int(b) for b in args.batch.split(",")], args.device.startswith("cuda")

    spec = WorkerSpec.from_config(TtsConfig(preset=args.preset, device=args.device, threads_per_worker=4))
    torch.set_num_threads(spec.threads)
    started = time.perf_counter()
    model = load_model(dataclasses.replace(spec, compile=False))  # as the batched engine builds it
    work = voxcpm_model.PatchWork(model.config, *voxcpm_model.vae_patch_work(model))  # before the engine's VAE hooks
    engine = BatchedVoxCPM(model, max(batches), args.cache_positions)
    tokens = engine.text_tokens(TEXT)
    context = len(tokens) + 1
    assert context + 3 + 2 * TIMED < engine.max_length, "the timed steps would overrun the cache"
    parts = (model.feat_decoder, model.feat_encoder, model.audio_vae, model.stop_head, model.base_lm, model.residual_lm)
    modules = dict(zip(PHASES[1:7], parts, strict=True))
    dtypes = {name: str(next(module.parameters()).dtype).removeprefix("torch.") for name, module in modules.items()}
    print(f"{args.preset} on {torch.cuda.get_device_name() if on_cuda else 'cpu'}, torch {torch.__version__}, built "
          f"in {time.perf_counter() - started:.1f} s; cache {engine.max_length} positions, prefix {context} tokens, "
          f"{TIMESTEPS} diffusion steps, cfg {CFG_VALUE}\ndtypes: {dtypes}")  # fmt: skip

    def fill(rows: int) -> list[int]:
        engine.prefill(list(range(rows)), [tokens] * rows)
        return list(range(rows))

    def served_step(slots: list[int]):
        noise = torch.randn(len(slots), engine.feat_dim, engine.patch_size)
        return engine.step(slots, [TIMESTEPS] * len(slots), [CFG_VALUE] * len(slots), noise)

    audio, _ = served_step(fill(max(batches)))  # warm-up, as the engine does before capturing
    patch_s = audio.shape[1] / model.sample_rate
    if on_cuda:
        started = time.perf_counter()
        engine.capture_graphs(sorted(set(batches)), TIMESTEPS, CFG_VALUE)  # the service captures every bucket
        print(f"CUDA graphs for {sorted(engine.graphs)} captured in {time.perf_counter() - started:.1f} s")

    variants = [v for v in args.variants.split(",") if v]
    if variants:
        rows = max(batches)
        slots = fill(rows)
        print(f"\nspeed-ups, cumulative, at B = {rows}: step as served, median of {TIMED}")
        solver_ms: dict[str, float] = {}
        for variant in variants:
            began = time.perf_counter()
            decoder = model.feat_decoder
            before = decoder.estimator, engine._lm_step, engine._vae_decode
            try:
                if variant == "fold":
                    engine.fold_weight_norm()
                elif variant == "compile" or variant.removeprefix("compile-") in SOLVER_ATTENTION:
                    engine.compile(("solver",), variant.removeprefix("compile").removeprefix("-") or "default")
                elif variant.startswith("compile-"):  # compile-lms, compile-vae
                    engine.compile((variant.removeprefix("compile-"),))
                elif variant == "vae-bf16":
                    engine.set_vae_dtype(torch.bfloat16)
                if on_cuda:
                    engine.graphs.clear()
                    engine.capture_graphs([rows], TIMESTEPS, CFG_VALUE)
                set_up_s = time.perf_counter() - began
                slots = fill(rows)
                for _ in range(3):
                    served_step(slots)
                ms = statistics.median(timed_ms(functools.partial(served_step, slots), on_cuda) for _ in range(TIMED))
            except Exception as exc:  # report, undo, go on with the others
                print(f"  {variant:<14} FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                decoder.estimator, engine._lm_step, engine._vae_decode = before
                engine.graphs.clear()
                if on_cuda:
                    engine.capture_graphs([rows], TIMESTEPS, CFG_VALUE)
                continue
            if variant == "compile" or variant.removeprefix("compile-") in SOLVER_ATTENTION:
                solver_ms[variant.removeprefix("compile").removeprefix("-") or "default"] = ms
            print(f"  {variant:<14} {ms:8.2f} ms -> {rows * patch_s / (ms / 1000):7.1f} audio-s/s "
                  f"(set-up and capture {set_up_s:.1f} s)", flush=True)  # fmt: skip
        if solver_ms:  # what results/h200 stages pass on as --solver-attention
            print(f"fastest solver attention: {min(solver_ms, key=solver_ms.get)}", flush=True)
        if args.sweep_only:
            return
        if on_cuda:  # the buckets of a) to c), with everything applied
            engine.graphs.clear()
            engine.capture_graphs(sorted(set(batches)), TIMESTEPS, CFG_VALUE)

    for rows in batches:
        print(f"\n===== B = {rows} ({rows} requests, {patch_s * 1000:.0f} ms of audio each per step) =====")
        slots = fill(rows)
        for _ in range(3):  # prefill settled: every row generating
            served_step(slots)
        ms = statistics.median(timed_ms(functools.partial(served_step, slots), on_cuda) for _ in range(TIMED))
        mode = "CUDA graph, device time by events" if rows in engine.graphs else "eager, wall time"
        print(f"a) step as served ({mode}): {ms:.2f} ms, median of {TIMED} -> "
              f"{rows * patch_s / (ms / 1000):.1f} audio-s/s (RTF {ms / 1000 / patch_s:.3f})")  # fmt: skip
        if rows in engine.graphs:
            replay_ms = timed_ms(engine.graphs[rows].graph.replay, on_cuda, TIMED)
            print(f"   graph replay alone (no input copies, no host copy): {replay_ms:.2f} ms per step")
        phase_ms = profile_eager(engine, fill(rows), PROFILED, on_cuda)

        print(f"\nc) GFLOP per step at B={rows} (PatchWork.per_phase), attention over {context} / {engine.max_length} "
              f"positions (the prefix / the graph's span), dtype, eager time from b)")  # fmt: skip
        short, full = work.per_phase(context, TIMESTEPS), work.per_phase(engine.max_length, TIMESTEPS)
        for name in short:
            rate = f"{rows * full[name] / phase_ms[name] / 1e9:8.2f} TFLOP/s" if phase_ms.get(name) else ""
            print(f"{name:<14}{rows * short[name] / 1e9:>9.2f} / {rows * full[name] / 1e9:>9.2f} "
                  f"{dtypes.get(name, ''):>9} {phase_ms.get(name, 0.0):>8.3f} ms {rate}")  # fmt: skip
        print(f"{'total':<14}{rows * sum(short.values()) / 1e9:>9.2f} / {rows * sum(full.values()) / 1e9:>9.2f}")


if __name__ == "__main__":
    main()
