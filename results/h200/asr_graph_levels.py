"""The ASR service with CUDA graphs vs eager at a few fixed stream counts (320 ms chunks), through gRPC.

`python -m results.h200.asr_graph_levels --levels 1,64,512` starts two services side by side (nemotron-0.6b,
bf16, `--max-streams` = `--max-batch-streams` as the run plan sets them, `--graph-chunks 320`): one with
`--cuda-graphs true` (plus `--graph-args`), one with `--cuda-graphs false`. At each level, both in turn
(alternating which goes first), N streams of one clip each are sent as fast as the clients can (the bench-asr
probe: RTF = the slowest stream's wall time / its audio) by `--clients` processes. Per level and path it
prints the RTF, failed streams, and from the service's counters the steps taken, mean streams per step and
mean step time. A stream that fails is reported with its error, not retried.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shlex
import time

from services.asr.benchmark import ClientProcesses, clip_seconds, start_asr_service

CHUNK_MS = 320


def counters(service) -> tuple[float, float, float]:
    """(steps, streams stepped, seconds stepping) for 320 ms so far."""
    values = service.metrics()

    def total(name: str) -> float:
        return sum(v for k, v in values.items() if k.startswith(name) and f'chunk_ms="{CHUNK_MS}"' in k)

    return (
        total("voiceagent_asr_step_duration_seconds_count"),
        total("voiceagent_asr_step_batch_streams_sum"),
        total("voiceagent_asr_step_duration_seconds_sum"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--levels", default="1,64,512")
    parser.add_argument("--max-streams", type=int, default=1024)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (graphs ignored)")
    parser.add_argument("--graph-args", default="", help="extra flags for the graphs service")
    args = parser.parse_args()
    base = ["--graph-chunks", str(CHUNK_MS)]
    paths = {
        "graphs": [*base, "--cuda-graphs", "true", *shlex.split(args.graph_args)],
        "eager": [*base, "--cuda-graphs", "false"],
    }
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            name: pool.submit(
                start_asr_service,
                "cache-aware",
                args.preset,
                args.max_streams,
                args.threads,
                args.device,
                "bfloat16",
                flags,
            )
            for name, flags in paths.items()
        }
        services = {name: future.result() for name, future in futures.items()}
    print(f"both services SERVING after {time.perf_counter() - started:.0f} s; flags {paths}", flush=True)
    clients = ClientProcesses(args.clients)
    seconds = clip_seconds(CHUNK_MS)
    try:
        for index, streams in enumerate(int(level) for level in args.levels.split(",")):
            order = list(paths) if index % 2 == 0 else list(reversed(paths))
            for name in order:
                service = services[name]
                before = counters(service)
                try:
                    rtf, failure = clients.rtf(service.address, CHUNK_MS, streams, seconds, 0), ""
                except Exception as exc:  # noqa: BLE001 - a failed level is a result
                    rtf, failure = float("nan"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                steps, stepped, busy = (a - b for a, b in zip(counters(service), before, strict=True))
                print(
                    f"LEVEL {streams:5d} streams {name:6s}: RTF {rtf:.3f}, {steps:.0f} steps of "
                    f"{stepped / max(steps, 1):.1f} streams, mean step {1000 * busy / max(steps, 1):.1f} ms"
                    + (f", FAILED {failure}" if failure else ""),
                    flush=True,
                )
    finally:
        clients.close()
        for service in services.values():
            print(f"--- {service.name} log tail ---\n{service.output()[-1500:]}", flush=True)
            service.terminate()


if __name__ == "__main__":
    main()
