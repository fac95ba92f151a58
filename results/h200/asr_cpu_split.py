"""Where the ASR service's time goes at N streams: `.venv/asr/bin/python -m results.h200.asr_cpu_split --streams 896`.

Starts the cache-aware service (as bench-asr does), then for each N runs N real-time streams from K client
processes (`--clients`) and prints the stream RTF next to the CPU each process used per wall second, from
/proc: the gRPC process (all threads, and its main thread, which runs the asyncio loop), the engine
process, and the clients. A process whose main thread sits at ~1.0 CPU-s/s is the one that limits the
service. The service's own step histograms add the steps taken, the mean streams per step and the share of
the wall time spent stepping. Used on the lent H200, where the service carried fewer streams than NeMo driven directly.

`--service-args` adds service flags (e.g. "--step-policy clocked --frontends 4 --graph-chunks 320"); with front ends
the service is several processes, so each level also prints every process under the service's: its CPU-s/s, that
of its busiest thread (named) and that of its main thread, which runs its event loop. `--py-spy DIR` records each
of those processes with py-spy (raw, folded stacks) during each level, into DIR/<streams>_<pid>.txt. `--paced` runs
real-time streams instead (bench-asr --paced: a piece sent when its last sample is due, starts spread over one period)
and reports per-chunk latency p95 over the chunk; each process's line also gives its CPU per stream-step (the
service's stream-steps of the level), which does not depend on how many steps the clients' pace allowed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import shlex
import subprocess
import time
from pathlib import Path

from services.asr.benchmark import EngineDirect, clip_seconds, probe_value, service_results, start_asr_service
from voiceagent.serving.launcher import child_processes, proc_stat, sample_sum, scrape_samples

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) in seconds."""
    fields = proc_stat(pid, tid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, their children, ...)."""
    found, frontier = [], [pid]
    while frontier:
        children = child_processes(frontier.pop(), lambda command: True)
        found += children
        frontier += children
    return found


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of `pid`, keyed 'tid name'."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            name = (task / "comm").read_text().strip()
            threads[f"{task.name} {name}"] = cpu_s(pid, int(task.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return threads


def per_process(pids: list[int]) -> dict[int, tuple[float, dict[str, float]]]:
    out = {}
    for pid in pids:
        try:
            out[pid] = (cpu_s(pid), thread_cpu(pid))
        except (OSError, ValueError, IndexError):
            continue
    return out


def role(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words[-3:] if w)[-60:]


def step_totals(metrics_url: str) -> tuple[float, float, float]:
    """(steps, streams stepped, seconds stepping) so far, from the service's own step histograms."""
    samples = scrape_samples(metrics_url)
    return (
        sample_sum(samples, "voiceagent_asr_step_batch_streams_count"),
        sample_sum(samples, "voiceagent_asr_step_batch_streams_sum"),
        sample_sum(samples, "voiceagent_asr_step_duration_seconds_sum"),
    )


def _client(address: str, chunk_ms: int, streams: int, seconds: float, paced: bool, go, results) -> None:
    """One client process: waits for `go` (imports done), runs its streams, reports (its RTFs, or with `paced` its
    partials' latencies; its CPU-s)."""
    go.wait()
    cpu = time.process_time()
    try:
        values = asyncio.run(service_results(address, chunk_ms, streams, seconds, paced=paced))
    except Exception as error:  # a refused or failed stream: the level reports it instead of waiting for ever
        print(f"client of {streams} streams failed: {error!r}"[:300], flush=True)
        values = [math.nan]
    results.put((values, time.process_time() - cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--chunk-ms", type=int, default=320)
    parser.add_argument("--streams", default="896,1152")
    parser.add_argument("--clients", default="1,4", help="client process counts to try at each N")
    parser.add_argument("--clip-s", type=float, default=4.8, help="clip length (longer: set-up costs matter less)")
    parser.add_argument("--engine-process", default="true")
    parser.add_argument("--engine-direct", action="store_true", help="first, NeMo driven directly at each N")
    parser.add_argument("--service-args", default="", help="extra service flags (one string)")
    parser.add_argument("--py-spy", default="", help="a folder: py-spy records of every service process per level")
    parser.add_argument(
        "--paced",
        action="store_true",
        help="real-time streams (bench-asr --paced): the level's value is per-chunk latency p95 / the chunk, not RTF",
    )
    args = parser.parse_args()
    # slots for twice the largest N: each front end admits its share, and clients' channels may not spread evenly
    limit = 2 * max(int(n) for n in args.streams.split(","))
    seconds = clip_seconds(args.chunk_ms, args.clip_s)
    if args.engine_direct:  # the same N without gRPC: one batched step of all N per chunk
        engine = EngineDirect(args.preset, args.threads, args.device, args.dtype)
        engine.rtf(args.chunk_ms, 1, seconds)  # warm-up
        for streams in (int(n) for n in args.streams.split(",")):
            rtf = engine.rtf(args.chunk_ms, streams, seconds)
            steps = math.ceil(seconds * 1000 / args.chunk_ms)
            print(
                f"engine-direct {streams} streams: RTF {rtf:.2f}, {steps} steps of {streams}, "
                f"{rtf * seconds / steps * 1000:.0f} ms per step",
                flush=True,
            )
        del engine
    service = start_asr_service(
        "cache-aware",
        args.preset,
        limit,
        args.threads,
        args.device,
        args.dtype,
        ["--engine-process", args.engine_process, *shlex.split(args.service_args)],
    )
    try:
        server = service.proc.pid
        engines = child_processes(server, lambda command: b"spawn_main" in command)
        tree = [server, *descendants(server)]
        print(f"server pid {server}, engine pids {engines}; chunk {args.chunk_ms} ms, clips {seconds} s", flush=True)
        for pid in tree:
            print(f"  process {pid}: {role(pid)}", flush=True)
        value = "p95/chunk" if args.paced else "RTF"
        print(
            f"streams | clients | {value} | wall s | gRPC proc CPU-s/s | gRPC main thread | engine proc | clients "
            "| steps | streams/step | ms per step | stepping share of wall"
        )
        context = multiprocessing.get_context("spawn")
        for streams in (int(n) for n in args.streams.split(",")):
            for clients in (int(k) for k in args.clients.split(",")):
                results, go = context.Queue(), context.Event()
                workers = [
                    context.Process(
                        target=_client,
                        args=(
                            service.address,
                            args.chunk_ms,
                            streams // clients + (i < streams % clients),
                            seconds,
                            args.paced,
                            go,
                            results,
                        ),
                    )
                    for i in range(clients)
                ]
                for worker in workers:
                    worker.start()
                time.sleep(5)  # imports done: the clients wait on `go`
                before = (cpu_s(server), cpu_s(server, server), sum(cpu_s(e) for e in engines))
                steps_before = step_totals(service.metrics_url)
                processes_before = per_process(tree)
                started = time.perf_counter()
                go.set()
                spies = []
                if args.py_spy:
                    Path(args.py_spy).mkdir(parents=True, exist_ok=True)
                    spies = [
                        subprocess.Popen(
                            [
                                "py-spy",
                                "record",
                                "--pid",
                                str(pid),
                                "--duration",
                                str(max(1, int(seconds) - 1)),
                                "--rate",
                                "200",
                                "--format",
                                "raw",
                                "--threads",
                                "--nonblocking",
                                "--output",
                                f"{args.py_spy}/{streams}_{pid}.txt",
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )  # fmt: skip
                        for pid in tree
                    ]
                reports = [results.get() for _ in workers]
                wall = time.perf_counter() - started
                processes_after = per_process(tree)
                for spy in spies:
                    spy.wait(timeout=30)
                after = (cpu_s(server), cpu_s(server, server), sum(cpu_s(e) for e in engines))
                now = step_totals(service.metrics_url)
                steps, stepped, stepping = (a - b for a, b in zip(now, steps_before, strict=True))
                for worker in workers:
                    worker.join()
                values = [value for share, _ in reports for value in share]
                failed = any(math.isnan(value) for value in values)
                worst = math.nan if failed else probe_value(values, args.chunk_ms, args.paced)
                client_cpu = sum(cpu for _, cpu in reports)
                used = [(a - b) / wall for a, b in zip(after, before, strict=True)]
                print(
                    f"{streams:7d} | {clients:7d} | {worst:.2f} | {wall:6.1f} | {used[0]:17.2f} | "
                    f"{used[1]:16.2f} | {used[2]:11.2f} | {client_cpu / wall:.2f} "
                    f"| {steps:5.0f} | {stepped / max(steps, 1):12.1f} "
                    f"| {stepping / max(steps, 1) * 1000:11.0f} | {stepping / wall:.2f}",
                    flush=True,
                )
                for pid, (total, threads) in processes_after.items():
                    if pid not in processes_before:
                        continue
                    before_total, before_threads = processes_before[pid]
                    used_by = {name: (cpu - before_threads.get(name, 0.0)) / wall for name, cpu in threads.items()}
                    busiest = max(used_by, key=used_by.get)
                    main_thread = next((name for name in used_by if name.split()[0] == str(pid)), busiest)
                    per_step = 1e6 * wall / max(stepped, 1)  # us of CPU per stream-step, per CPU-s/s
                    print(
                        f"    pid {pid} ({role(pid)}): {(total - before_total) / wall:.2f} CPU-s/s, busiest thread "
                        f"{busiest} {used_by[busiest]:.2f}, main thread (event loop) {used_by[main_thread]:.2f}; "
                        f"per stream-step: {(total - before_total) / wall * per_step:.0f} us, main thread "
                        f"{used_by[main_thread] * per_step:.0f} us",
                        flush=True,
                    )
    finally:
        service.terminate()


if __name__ == "__main__":
    main()
