"""Device ceilings: memory read bandwidth and dense matmul peak, measured at start-up in a few seconds.

Every "bandwidth-bound vs compute-bound" verdict in this project is judged against these two numbers, so
they are measured on the machine the engine runs on, in the dtype it computes in, not taken from a data sheet.
Bandwidth is read bandwidth (a reduction over a buffer far larger than the caches), because decode steps
read weights; peak is the best of repeated square matmuls.
"""

from __future__ import annotations

import dataclasses
import platform
import time

from voiceagent.v1 import common_pb2


@dataclasses.dataclass(frozen=True)
class DeviceCeilings:
    device: str
    device_name: str
    dtype: str
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    probe_s: float
    threads: int = 0

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this device."""
        return self.peak_flops_per_s / self.memory_bandwidth_bytes_per_s if self.memory_bandwidth_bytes_per_s else 0.0

    def to_proto(self) -> common_pb2.DeviceCeilings:
        return common_pb2.DeviceCeilings(
            device=self.device,
            device_name=self.device_name,
            dtype=self.dtype,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
            peak_flops_per_s=self.peak_flops_per_s,
            ridge_flops_per_byte=self.ridge_flops_per_byte,
            probe_s=self.probe_s,
            threads=self.threads,
        )


UNMEASURED = DeviceCeilings("unmeasured", "", "", 0.0, 0.0, 0.0)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _best_time(run, sync, repeats: int, budget_s: float) -> float:
    """Best wall time of `run` over `repeats` tries (after one warm-up), stopping early past `budget_s`."""
    run()
    sync()
    best = float("inf")
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return best


def measure_ceilings(device: str = "cpu", dtype: str = "float32", budget_s: float = 3.0) -> DeviceCeilings:
    """Measure read bandwidth (bytes/s) and matmul peak (FLOP/s) of `device` in `dtype`."""
    import torch

    started = time.perf_counter()
    torch_dtype = getattr(torch, dtype)
    on_cuda = device.startswith("cuda")
    if on_cuda:
        sync = torch.cuda.synchronize
        name = torch.cuda.get_device_name(torch.device(device))
        buffer_bytes, n, threads = 2 << 30, 8192, 0
    else:
        sync = lambda: None  # noqa: E731 - CPU work is synchronous
        name = _cpu_name()
        buffer_bytes, n, threads = 512 << 20, 1024, torch.get_num_threads()

    # Read bandwidth: reduce a buffer far larger than the last-level cache; every byte is read once.
    buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)
    read_s = _best_time(buffer.sum, sync, repeats=8, budget_s=budget_s / 2)
    bandwidth = buffer_bytes / read_s
    buffer = None  # free it before the matmul operands are allocated

    # Matmul peak in the serving dtype: 2·n³ FLOPs per product.
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    matmul_s = _best_time(lambda: a @ b, sync, repeats=20, budget_s=budget_s / 2)
    peak = 2 * n**3 / matmul_s
    return DeviceCeilings(
        device=device,
        device_name=name,
        dtype=dtype,
        memory_bandwidth_bytes_per_s=bandwidth,
        peak_flops_per_s=peak,
        probe_s=time.perf_counter() - started,
        threads=threads,
    )
