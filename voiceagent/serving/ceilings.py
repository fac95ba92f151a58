"""Device ceilings: memory read bandwidth and dense matmul peak, measured at start-up in a few seconds.

Every "bandwidth-bound vs compute-bound" verdict in this project is judged against these two numbers, so
they are measured on the machine the engine runs on, in the dtype it computes in, not taken from a data sheet.
Bandwidth is read bandwidth (a reduction over a buffer far larger than the caches), because decode steps
read weights; peak is the best of repeated square matmuls.

A probe that shares the machine with other work (another service loading, a benchmark) under-measures both, and
every utilisation derived from it comes out inflated. So the probe also records when it ran and how many CPU
cores other processes kept busy meanwhile (`background_cores`); a report flags a probe above `QUIET_CORES`.
"""

from __future__ import annotations

import dataclasses
import os
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
    measured_at_unix_s: float = 0.0  # when the probe ended
    method: str = ""  # what was measured, in words
    background_cores: float = -1.0  # CPU cores busy outside this process during the probe; -1 = unknown

    @property
    def quiet(self) -> bool:
        """True when the probe ran on a quiet machine (or nothing says otherwise)."""
        return self.background_cores < QUIET_CORES

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
            measured_at_unix_s=self.measured_at_unix_s,
            method=self.method,
            background_cores=self.background_cores,
        )


# Other processes keeping more than a quarter of a core busy during the probe count as load: an idle machine
# measures 0.0-0.1 here, another service loading its engine one core or more.
QUIET_CORES = 0.25
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


class BackgroundCpu:
    """CPU cores kept busy by every process but this one between `__init__` and `cores()` (Linux /proc/stat
    minus this process's own CPU time); -1 where /proc/stat cannot be read."""

    def __init__(self):
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                fields = [float(value) for value in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait
        busy_s = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
        own = os.times()
        return time.monotonic(), busy_s, own.user + own.system

    def cores(self) -> float:
        end = self._read()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return -1.0
        wall = end[0] - self._start[0]
        busy, own = end[1] - self._start[1], end[2] - self._start[2]
        return max(0.0, (busy - own) / wall)


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
    background = BackgroundCpu()
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
        measured_at_unix_s=time.time(),
        method=(
            f"start-up probe: best read of a {buffer_bytes >> 20} MiB float32 buffer, best {n}x{n} {dtype} matmul"
            + (f", {threads} thread(s)" if threads else "")
        ),
        background_cores=background.cores(),
    )
