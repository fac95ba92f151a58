"""What the results/h200 profilers share: torch.profiler kernels by class, placed in the `record_function` range
(phase) their launch fell in, and the phase x class table (tts_profile.py, asr_profile.py)."""

from __future__ import annotations

import collections
import re

from torch.autograd import DeviceType

CLASSES = ("bf16 GEMM", "fp32 GEMM/conv", "attention", "copies", "elementwise/reduction", "other")
# launched_us: host time of its launch, which places it in a record_function range (or a range's name)
Kernel = collections.namedtuple("Kernel", "name start_us duration_us launched_us")


def kernel_class(name: str, fp32: bool) -> str:
    """A kernel's class by its name; `fp32`: its phase computes in float32 (a GEMM there is not bf16)."""
    n = name.lower()
    if re.search(r"flash|fmha|attention|softmax|sdpa", n):
        return "attention"
    if re.search(r"conv|fprop|dgrad|wgrad|winograd|implicit|im2col|col2im", n):
        return "fp32 GEMM/conv"
    if re.search(r"gemm|gemv|nvjet|xmma|cutlass|cublas|matmul|aten::(add|b|baddb)?mm$|aten::linear", n):
        fp32 = fp32 or re.search(r"sgemm|tf32|f32f32|s1688gemm|fp32", n)
        return "fp32 GEMM/conv" if fp32 and "bf16" not in n else "bf16 GEMM"
    if re.search(r"memcpy|memset|copy|catarray|\bcat\b|index|gather|scatter|fill|clone|contiguous|zero_|aten::to$", n):
        return "copies"
    if re.search(r"elementwise|vectorized|reduce|norm|unrolled|pointwise|triton|at::native|aten::", n):
        return "elementwise/reduction"
    return "other"


def device_kernels(events, on_cuda: bool, range_names: tuple[str, ...]) -> list[Kernel]:
    """Kernels (CUDA) or leaf op time (CPU: aten ops by self time), with the host time they were issued at; a kernel
    whose launch is not seen is placed by the device-side `record_function` range (of `range_names`) it falls in."""
    if not on_cuda:
        return [
            Kernel(e.name, e.time_range.start, e.self_cpu_time_total, e.time_range.start)
            for e in events
            if e.name.startswith("aten::") and e.self_cpu_time_total > 0
        ]
    # a kernel's host side: the op that launched it (linked id), else its runtime call (same correlation id)
    ops = {
        e.id: e.time_range.start
        for e in events
        if e.device_type == DeviceType.CPU
        and not getattr(e, "linked_correlation_id", 0)
        and not e.name.startswith("cu")
    }
    launches = {e.id: e.time_range.start for e in events if e.device_type == DeviceType.CPU and e.name.startswith("cu")}
    annotations = [e for e in events if e.device_type == DeviceType.CUDA and e.name in range_names]
    kernels, skipped = [], {id(a) for a in annotations}
    for e in events:
        if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False) or id(e) in skipped:
            continue
        launched = ops.get(getattr(e, "linked_correlation_id", 0)) or launches.get(e.id)
        if launched is None:  # no host side seen: place it by the device-side range it falls in
            inside = [a for a in annotations if a.time_range.start <= e.time_range.start <= a.time_range.end]
            launched = min(inside, key=lambda a: a.time_range.elapsed_us()).name if inside else None
        kernels.append(Kernel(e.name, e.time_range.start, e.time_range.elapsed_us(), launched))
    return kernels


def innermost(ranges, when) -> str:
    if isinstance(when, str) or when is None:  # already named by a device-side range, or unplaced
        return when or "unattributed"
    inside = [r for r in ranges if r.time_range.start <= when <= r.time_range.end]
    return min(inside, key=lambda r: r.time_range.elapsed_us()).name if inside else "outside phases"


def table(title: str, cells: dict, rows, steps: int, columns=CLASSES) -> None:
    print(f"\n{title} (ms per step)\n{'':<22}" + "".join(f"{c[:13]:>14}" for c in (*columns, "total")))
    for row in rows:
        values = [cells.get((row, c), 0.0) / steps / 1000 for c in columns]
        if sum(values):
            print(f"{row:<22}" + "".join(f"{v:>14.3f}" for v in (*values, sum(values))))
    totals = [sum(cells.get((r, c), 0.0) for r in rows) / steps / 1000 for c in columns]
    print(f"{'total':<22}" + "".join(f"{v:>14.3f}" for v in (*totals, sum(totals))))


def top_kernels(by_kernel: dict[str, collections.Counter], steps: int, classify, count: int) -> None:
    """Print the `count` kernels (ops on a CPU) with the most time: ms and launches per step, the phase holding most
    of their time, their class (`classify(name, phase)`). `by_kernel`: name -> Counter of us per phase and "count"."""
    totals = {name: sum(v for p, v in c.items() if p != "count") for name, c in by_kernel.items()}
    for name in sorted(totals, key=totals.get, reverse=True)[:count]:
        phase = max((p for p in by_kernel[name] if p != "count"), key=by_kernel[name].get)
        print(
            f"{totals[name] / steps / 1000:>8.3f} {by_kernel[name]['count'] / steps:>6.0f}  {phase:<15} "
            f"{classify(name, phase):<22} {name[:110]}"
        )
