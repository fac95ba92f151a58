"""Where the ASR service's time goes at N streams: `.venv/asr/bin/python -m results.h200.asr_cpu_split --streams 896`.

Starts the cache-aware service (as bench-asr does), then for each N runs N real-time streams from K client
processes (`--clients`) and prints the stream RTF next to the CPU each process used per wall second, from
/proc: the gRPC process (all threads, and its main thread, which runs the asyncio loop), the engine
process, and the clients. A process whose main thread sits at ~1.0 CPU-s/s is the one that limits the
service. The service's own step histograms add the steps taken, the mean streams per step and the share of
the wall time spent stepping. Used on the lent H200, where the service carried fewer streams than NeMo driven directly.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import time

from services.asr.benchmark import EngineDirect, clip_seconds, service_rtf, start_asr_service
from voiceagent.serving.launcher import child_processes, proc_stat, sample_sum, scrape_samples

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) in seconds."""
    fields = proc_stat(pid, tid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def step_totals(metrics_url: str) -> tuple[float, float, float]:
    """(steps, streams stepped, seconds stepping) so far, from the service's own step histograms."""
    samples = scrape_samples(metrics_url)
    return (
        sample_sum(samples, "voiceagent_asr_step_batch_streams_count"),
        sample_sum(samples, "voiceagent_asr_step_batch_streams_sum"),
        sample_sum(samples, "voiceagent_asr_step_duration_seconds_sum"),
    )


def _client(address: str, chunk_ms: int, streams: int, seconds: float, go, results) -> None:
    """One client process: waits for `go` (imports done), runs its streams, reports (RTF, its CPU-s)."""
    go.wait()
    cpu = time.process_time()
    rtf = asyncio.run(service_rtf(address, chunk_ms, streams, seconds))
    results.put((rtf, time.process_time() - cpu))


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
    args = parser.parse_args()
    limit = max(int(n) for n in args.streams.split(","))
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
        ["--engine-process", args.engine_process],
    )
    try:
        server = service.proc.pid
        engines = child_processes(server, lambda command: b"spawn_main" in command)
        print(f"server pid {server}, engine pids {engines}; chunk {args.chunk_ms} ms, clips {seconds} s", flush=True)
        print(
            "streams | clients | RTF  | wall s | gRPC proc CPU-s/s | gRPC main thread | engine proc | clients "
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
                started = time.perf_counter()
                go.set()
                reports = [results.get() for _ in workers]
                wall = time.perf_counter() - started
                after = (cpu_s(server), cpu_s(server, server), sum(cpu_s(e) for e in engines))
                now = step_totals(service.metrics_url)
                steps, stepped, stepping = (a - b for a, b in zip(now, steps_before, strict=True))
                for worker in workers:
                    worker.join()
                rtfs = [rtf for rtf, _ in reports]
                client_cpu = sum(cpu for _, cpu in reports)
                used = [(a - b) / wall for a, b in zip(after, before, strict=True)]
                print(
                    f"{streams:7d} | {clients:7d} | {max(rtfs):.2f} | {wall:6.1f} | {used[0]:17.2f} | "
                    f"{used[1]:16.2f} | {used[2]:11.2f} | {client_cpu / wall:.2f} "
                    f"| {steps:5.0f} | {stepped / max(steps, 1):12.1f} "
                    f"| {stepping / max(steps, 1) * 1000:11.0f} | {stepping / wall:.2f}",
                    flush=True,
                )
    finally:
        service.terminate()


if __name__ == "__main__":
    main()
