"""Where the cache-aware ASR step spends its device time at large batches (issue 17: "profile the step by kernel class
at the knee").

Builds the cache-aware backend in this process as the service does (nemotron-0.6b, bf16), and one chunk size's
steady padded step (services/asr/engine/step_graphs.py) with a CUDA graph per batch in --batch. Per batch B:
  a) the step as served: PaddedStep.run (inputs copied in, graph replayed, the token table read back), median of 10,
     and the graph replay alone, by CUDA events; the counted work (the service's FLOPs and bytes formulas) per step
     and the rates they imply;
  With --variants, the served step is timed first for each attention variant (its graphs captured anew): `manual`
  (NeMo's default: matmuls, a relative shift, masked softmax, as the presets run it) and `sdpa` (NeMo's own
  `use_pytorch_sdpa` path: one scaled_dot_product_attention with the positional term as a float bias) and `fused`
  (engine/fused_encoder.py, `--fused-encoder`: that, without per-row copies, and pointwise convolutions as GEMMs);
  the profile then runs on the first.
  b) the same step eagerly under torch.profiler (3 steps): device time by phase x kernel class. Phases are the
     `record_function` ranges of PaddedStep._forward (cache gather, encoder, cache scatter, decoder) and, inside the
     encoder, the module it ran in (pre-encode, feed-forward, self-attention, convolution, norms), set by hooks here;
     then the idle time between kernels and the top kernels.
`python3 -m results.h200.asr_profile --batch 1024,2048`; on a CPU (smoke test): `--device cpu --preset tiny --batch 4`.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from results.h200.kernel_profile import CLASSES, device_kernels, innermost, kernel_class, table, top_kernels
from services.asr.backends.in_process import load_in_process
from services.asr.config import AsrConfig
from services.asr.engine import fused_encoder
from services.asr.engine.step_graphs import PaddedStep

STEP_RANGES = ("cache gather", "encoder", "cache scatter", "decoder")  # PaddedStep._forward's
MODULE_PHASES = {  # NeMo module class -> phase (inside "encoder")
    "ConvSubsampling": "pre-encode",
    "ConformerFeedForward": "feed-forward",
    "RelPositionMultiHeadAttention": "self-attention",
    "ConformerConvolution": "convolution",
    "LayerNorm": "norms",
    "RelPositionalEncoding": "positions",
}
PHASES = (*STEP_RANGES[:2], *dict.fromkeys(MODULE_PHASES.values()), *STEP_RANGES[2:])
TIMED, PROFILED = 10, 3


def phase_hooks(encoder) -> list:
    """A `record_function` range around every encoder module of MODULE_PHASES (forward hooks; eager steps only)."""
    opened: list = []

    def enter(name):
        def hook(_module, _inputs):
            opened.append(record_function(name))
            opened[-1].__enter__()

        return hook

    def leave(_module, _inputs, _output):
        opened.pop().__exit__(None, None, None)

    handles = []
    for module in encoder.modules():
        if (phase := MODULE_PHASES.get(type(module).__name__)) is not None:
            handles += [module.register_forward_pre_hook(enter(phase)), module.register_forward_hook(leave)]
    return handles


def timed_ms(run, on_cuda: bool, repeat: int) -> float:
    """Median milliseconds of `run()` over `repeat` calls: CUDA events on a GPU, the wall clock on a CPU."""
    times = []
    for _ in range(repeat):
        if on_cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            run()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def set_attention(encoder, variant: str) -> None:
    """The encoder's self-attention as NeMo's manual path, its SDPA path, or the fused encoder (--variants)."""
    for module in encoder.modules():
        module.__dict__.pop("forward", None)  # the class's forward again (fused_encoder.install binds its own)
        if type(module).__name__ == "RelPositionMultiHeadAttention":
            module.use_pytorch_sdpa = variant == "sdpa"
    if variant == "fused":
        fused_encoder.install(encoder)


def time_step(step: PaddedStep, rows: int, on_cuda: bool, generator) -> tuple[torch.Tensor, list[int], float, float]:
    """The served step of `rows` streams and its graph replay alone, ms (median of TIMED); and its inputs."""
    slots = list(range(rows))
    signal = torch.randn(rows, step.signal.shape[1], step.width, device=step.device, generator=generator)
    signal = signal.to(step.signal.dtype)
    for _ in range(3):
        step.run(signal, slots)
    served = timed_ms(lambda: step.run(signal, slots), on_cuda, TIMED)
    replay = timed_ms(step.graphs[rows].replay, on_cuda, TIMED) if rows in step.graphs else float("nan")
    return signal, slots, served, replay


def profile_eager(step: PaddedStep, signal: torch.Tensor, slots: list[int], on_cuda: bool, fp32: bool) -> None:
    graphs, step.graphs = step.graphs, {}  # run() steps eagerly without graphs
    handles = phase_hooks(step.encoder)
    try:
        for _ in range(2):
            step.run(signal, slots)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
        with profile(activities=activities) as prof:
            began = time.perf_counter()
            for _ in range(PROFILED):
                with record_function("profiled step"):
                    step.run(signal, slots)
            wall_ms = (time.perf_counter() - began) * 1000 / PROFILED
    finally:
        for handle in handles:
            handle.remove()
        step.graphs = graphs
    events = prof.events()
    ranges = [e for e in events if e.device_type == DeviceType.CPU and e.name in PHASES]
    cells, by_kernel, count = collections.Counter(), {}, 0
    for kernel in device_kernels(events, on_cuda, (*PHASES, "profiled step")):
        phase = innermost(ranges, kernel.launched_us)
        cells[phase, kernel_class(kernel.name, fp32)] += kernel.duration_us
        by_kernel.setdefault(kernel.name, collections.Counter())[phase] += kernel.duration_us
        by_kernel[kernel.name]["count"] += 1
        count += 1
    kind = "device" if on_cuda else "CPU op self"
    table(f"b) eager step, {kind} time by phase x class", cells, [*PHASES, "outside phases", "unattributed"], PROFILED)
    print(f"eager step wall {wall_ms:.1f} ms; {count / PROFILED:.0f} {'kernels' if on_cuda else 'ops'} per step")
    print(f"\ntop 20 {'kernels' if on_cuda else 'ops'} by total time: ms per step, count per step, main phase, class")
    top_kernels(by_kernel, PROFILED, lambda name, _phase: kernel_class(name, fp32), 20)
    columns = {c: sum(v for (_, k), v in cells.items() if k == c) / PROFILED / 1000 for c in CLASSES}
    print("by class (ms per step): " + ", ".join(f"{c} {v:.2f}" for c, v in columns.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--chunk-ms", type=int, default=320)
    parser.add_argument("--batch", default="1024", help="batch sizes (streams per step), comma-separated")
    parser.add_argument("--no-profile", action="store_true", help="a) only")
    parser.add_argument("--variants", default="manual", help="attention variants to time: manual, sdpa, fused")
    args = parser.parse_args()
    batches, on_cuda = sorted(int(b) for b in args.batch.split(",")), args.device.startswith("cuda")
    started = time.perf_counter()
    config = AsrConfig(
        preset=args.preset, device=args.device, dtype=args.dtype, max_streams=max(batches),
        max_batch_streams=max(batches), graph_chunks="", threads=8,
    )  # fmt: skip
    backend = load_in_process(config)
    built = time.perf_counter() - started
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if on_cuda else None
    variants = args.variants.split(",")
    steps = {}  # every variant's step (and graphs) kept: graphs are never destroyed while others run
    for variant in reversed(variants):  # the first variant last, so it stands for the profile
        set_attention(backend.model.encoder, variant)
        steps[variant] = PaddedStep(
            backend, args.chunk_ms, backend.pre_encode_frames, batches, backend.slot_count, on_cuda, streams=streams
        )
    step = steps[variants[0]]
    shape = backend.shape
    device = torch.cuda.get_device_name() if on_cuda else "cpu"
    print(
        f"{args.preset} {args.dtype} on {device}, torch {torch.__version__}; built in {built:.1f} s, steady "
        f"{args.chunk_ms} ms step: {step.width} mel frames -> {step.frames} encoder "
        f"frames per row, left context {step.context[0]}; graphs for {sorted(step.graphs)} per variant "
        f"({', '.join(f'{v} {steps[v].capture_s:.1f} s' for v in variants)})",
        flush=True,
    )
    generator = torch.Generator(device=args.device).manual_seed(0)
    with torch.inference_mode():
        if len(variants) > 1:
            print("\nserved step (ms, median of 10) by attention variant: " + ", ".join(variants))
            for rows in batches:
                cells = []
                for variant in variants:
                    set_attention(backend.model.encoder, variant)
                    *_, served, replay = time_step(steps[variant], rows, on_cuda, generator)
                    cells.append(f"{variant} {served:.2f} (replay {replay:.2f})")
                print(f"  B = {rows}: " + "; ".join(cells), flush=True)
        set_attention(backend.model.encoder, variants[0])
        for rows in batches:
            signal, slots, served, replay = time_step(step, rows, on_cuda, generator)
            keys = step.context[0] + step.frames
            flops = shape.step_flops(rows, step.frames, keys, step.width, step.frames + step.drop)
            read = shape.step_read_bytes(rows, with_cache=True)
            print(
                f"\n===== B = {rows}, {variants[0]} attention: a) step as served {served:.2f} ms (graph replay alone "
                f"{replay:.2f} ms), median of {TIMED}; {rows * args.chunk_ms / served:.0f} real-time streams if one "
                f"step per chunk; counted {flops / 1e12:.2f} TFLOP and {read / 1e9:.2f} GB per step -> "
                f"{flops / served / 1e9:.0f} TFLOP/s, {read / served / 1e6:.0f} GB/s",
                flush=True,
            )
            if not args.no_profile:
                profile_eager(step, signal, slots, on_cuda, backend.dtype == torch.float32)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
