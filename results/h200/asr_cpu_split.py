"""Where the ASR service's CPU goes at a given load: `python -m results.h200.asr_cpu_split --streams 896,1152`.

Starts the cache-aware service (as bench-asr does), then for each N runs N real-time streams from K client
processes (`--clients`) and prints the stream RTF next to the CPU each process used per wall second, from
/proc: the gRPC process (all threads, and its main thread, which runs the asyncio loop), the engine
process, and the clients. A process whose main thread sits at ~1.0 CPU-s/s is the one that limits the
service. Used on the lent H200, where the service carried fewer streams than NeMo driven directly.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from pathlib import Path

from services.asr.benchmark import clip_seconds, service_rtf, start_asr_service
from tests.harness import child_processes

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (or one of its threads) in seconds."""
    path = Path(f"/proc/{pid}/stat") if tid is None else Path(f"/proc/{pid}/task/{tid}/stat")
    fields = path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


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
    args = parser.parse_args()
    limit = max(int(n) for n in args.streams.split(","))
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
        seconds = clip_seconds(args.chunk_ms, args.clip_s)
        print(f"server pid {server}, engine pids {engines}; chunk {args.chunk_ms} ms, clips {seconds} s", flush=True)
        print("streams | clients | RTF  | wall s | gRPC proc CPU-s/s | gRPC main thread | engine proc | clients")
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
                started = time.perf_counter()
                go.set()
                reports = [results.get() for _ in workers]
                wall = time.perf_counter() - started
                after = (cpu_s(server), cpu_s(server, server), sum(cpu_s(e) for e in engines))
                for worker in workers:
                    worker.join()
                rtfs = [rtf for rtf, _ in reports]
                client_cpu = sum(cpu for _, cpu in reports)
                used = [(a - b) / wall for a, b in zip(after, before, strict=True)]
                print(
                    f"{streams:7d} | {clients:7d} | {max(rtfs):.2f} | {wall:6.1f} | {used[0]:17.2f} | "
                    f"{used[1]:16.2f} | {used[2]:11.2f} | {client_cpu / wall:.2f}",
                    flush=True,
                )
    finally:
        service.terminate()


if __name__ == "__main__":
    main()
