"""TTS service vs VoxCPM2 called directly: first audio, real-time factor, throughput by worker count.

`make bench-tts`. Same preset, weights, text, seed and threads on both sides, in one run:

- engine-direct: `VoxCPM2Model.generate_streaming` in this process (what a service can at best add nothing
  to): time to first audio = until the first patch is yielded; RTF = wall time / audio seconds;
- service: `python -m services.tts` with one worker, one request at a time over a real gRPC channel: time
  to first audio = until the first AudioChunk arrives at the client; RTF likewise from the client side.
Direct and service requests alternate, so drifting machine load hits both alike; medians are reported,
and the median of the paired differences as what the service adds.
Then throughput (audio seconds produced per wall second) of the service with 1, 2 and 4 workers, each
under as many concurrent clients as workers, two requests each, next to as many VoxCPM copies generating
side by side in their own processes (what the worker pool does, minus the service).

Threads: every worker (and the direct model) runs torch with `--threads` intra-op threads (default 1). The
models are small and their steps latency-bound, so a second thread buys little and, with several workers
on two cores, only oversubscribes them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import grpc

from services.tts.backends.voxcpm import WorkerSpec, segment_max_len
from services.tts.config import TTSConfig
from voiceagent.serving.launcher import running_service, venv_python
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

TEXT = "Streaming speech starts before the sentence ends."
SEED = 1


# Where the models run: set once from --device / --compile, used by every direct copy and every service.
PLACEMENT = {"device": "cpu", "compile": False}


def direct_runs(preset: str, threads: int, text: str):
    """A closure timing one direct streaming generation: (time to first audio, RTF, audio seconds)."""
    import torch

    from services.tts.backends.voxcpm import load_model

    spec = WorkerSpec.from_config(TTSConfig(preset=preset, threads_per_worker=threads, **PLACEMENT))
    torch.set_num_threads(threads)
    model = load_model(spec)
    max_len = segment_max_len(spec, text)

    def run() -> tuple[float, float, float]:
        torch.manual_seed(SEED)
        started = time.perf_counter()
        first, samples = None, 0
        for patch in model.generate_streaming(target_text=text, max_len=max_len, inference_timesteps=10):
            first = first if first is not None else time.perf_counter() - started
            samples += patch.numel()
        seconds = samples / model.sample_rate
        return first, (time.perf_counter() - started) / seconds, seconds

    run()  # warm-up, as the service's workers do
    return run


def _direct_worker(preset: str, threads: int, text: str, requests: int, barrier, results, placement) -> None:
    PLACEMENT.update(placement)  # a spawned process starts from the module's defaults
    run = direct_runs(preset, threads, text)
    barrier.wait()
    results.put(sum(run()[2] for _ in range(requests)))


def direct_throughput(preset: str, processes: int, threads: int, text: str, requests: int) -> float:
    """Audio seconds per second of `processes` VoxCPM copies generating side by side, no service in between."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    workers = [
        context.Process(target=_direct_worker, args=(preset, threads, text, requests, barrier, results, PLACEMENT))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()  # every copy is built and warmed up
    started = time.perf_counter()
    produced = sum(results.get() for _ in workers)
    elapsed = time.perf_counter() - started
    for worker in workers:
        worker.join()
    return produced / elapsed


def service_run(stub, text: str) -> tuple[float, float, float]:
    """(time to first audio, RTF, audio seconds) of one Synthesize call as the client sees it."""
    started = time.perf_counter()
    first, seconds = None, 0.0
    for chunk in stub.Synthesize(tts_pb2.SynthesizeRequest(text=text, config=tts_pb2.SynthesisConfig(seed=SEED))):
        first = first if first is not None else time.perf_counter() - started
        seconds += chunk.duration_s
    return first, (time.perf_counter() - started) / seconds, seconds


def service_args(preset: str, workers: int, threads: int) -> list[str]:
    return [
        "--preset", preset, "--workers", str(workers), "--threads-per-worker", str(threads),
        "--max-queue", "64", "--probe-ceilings", "false",
        "--device", PLACEMENT["device"], "--compile", str(PLACEMENT["compile"]).lower(),
    ]  # fmt: skip


def throughput(preset: str, workers: int, threads: int, text: str, requests_per_client: int) -> float:
    with (
        running_service("services.tts", venv_python("tts"), service_args(preset, workers, threads)) as service,
        grpc.insecure_channel(service.address) as channel,
    ):
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        service_run(stub, text)  # connection and first-request warm-up
        produced: list[float] = []

        def client() -> None:
            for _ in range(requests_per_client):
                produced.append(service_run(stub, text)[2])

        clients = [threading.Thread(target=client) for _ in range(workers)]
        started = time.perf_counter()
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        return sum(produced) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker and for direct runs")
    parser.add_argument("--rounds", type=int, default=9, help="direct/service pairs at concurrency 1")
    parser.add_argument("--workers", default="1,2,4", help="worker counts for the throughput table")
    parser.add_argument("--requests", type=int, default=2, help="requests per client in the throughput runs")
    parser.add_argument("--device", default="cpu", help="torch device of every model (cuda on a GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile + CUDA graphs (CUDA only)")
    args = parser.parse_args()
    PLACEMENT.update(device=args.device, compile=args.compile)

    print(
        f"preset {args.preset} on {args.device}{' compiled' if args.compile else ''}, {args.threads} torch thread(s) "
        f"per worker, text {len(TEXT)} chars, seed {SEED}"
    )
    direct = direct_runs(args.preset, args.threads, TEXT)
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "service": []}
    with (
        running_service("services.tts", venv_python("tts"), service_args(args.preset, 1, args.threads)) as service,
        grpc.insecure_channel(service.address) as channel,
    ):
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        service_run(stub, TEXT)
        for _ in range(args.rounds):
            results["direct"].append(direct()[:2])
            results["service"].append(service_run(stub, TEXT)[:2])
        round_trips = []
        for _ in range(20):
            started = time.perf_counter()
            stub.GetInfo(common_pb2.InfoRequest())
            round_trips.append(time.perf_counter() - started)

    def median(name: str, index: int) -> float:
        return statistics.median(run[index] for run in results[name])

    # Rounds alternate direct/service; paired differences cancel the machine's drifting load.
    pairs = list(zip(results["direct"], results["service"], strict=True))
    added_ms = statistics.median((served[0] - engine[0]) * 1000 for engine, served in pairs)
    added_rtf = statistics.median((served[1] / engine[1] - 1) * 100 for engine, served in pairs)
    print(f"\nconcurrency 1, medians of {args.rounds} alternating runs (load average {os.getloadavg()[0]:.1f})")
    print(f"{'':<16}{'first audio ms':>16}{'RTF':>8}")
    print(f"{'VoxCPM direct':<16}{median('direct', 0) * 1000:>16.1f}{median('direct', 1):>8.3f}")
    print(f"{'service (gRPC)':<16}{median('service', 0) * 1000:>16.1f}{median('service', 1):>8.3f}")
    print(f"{'service adds':<16}{added_ms:>+16.1f}{added_rtf:>+7.1f}%   (median of paired differences)")
    print("  targets: <= +5 ms first audio, <= +3% RTF")
    print(f"  unary GetInfo round trip on this machine now, median: {statistics.median(round_trips) * 1000:.1f} ms")

    print(f"\nthroughput (audio s per s): N concurrent clients x {args.requests} requests; direct = N VoxCPM processes")
    print(f"{'workers':>8}{'service':>10}{'direct':>10}{'service/direct':>16}")
    for workers in (int(w) for w in args.workers.split(",")):
        served = throughput(args.preset, workers, args.threads, TEXT, args.requests)
        engine = direct_throughput(args.preset, workers, args.threads, TEXT, args.requests)
        print(f"{workers:>8}{served:>10.2f}{engine:>10.2f}{served / engine:>15.2f}x", flush=True)
    print(f"  load average now {os.getloadavg()[0]:.1f} (2 cores)")


if __name__ == "__main__":
    main()
