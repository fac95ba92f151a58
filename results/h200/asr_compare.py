"""Two builds of the ASR service, compared in the same minutes: the tree here against a base tree (`--base DIR`, e.g.
`git archive <commit> services voiceagent` with the generated stubs copied in), each started as its own service with
the same flags, their capacity searches interleaved probe by probe (services/asr/benchmark.py `capacities`, the
order alternating from one round of probes to the next). Streams are paced in real time by default (bench-asr
--paced: a probe passes while per-chunk latency p95 < the chunk), from several client processes.

Used on the lent GPU, where a machine of another kind than last time (H100 for H200) makes earlier figures no
baseline: `python3 -m results.h200.asr_compare --base .base --chunks 320,80 --service-args "--frontends 4"`.
"""

from __future__ import annotations

import argparse
import shlex
import stat
import time
from pathlib import Path

from services.asr.benchmark import ClientProcesses, capacities, clip_seconds
from voiceagent.serving.launcher import start_service, venv_python


def base_python(base: Path) -> str:
    """An interpreter that runs in `base`: `python -m services.asr` then imports the base tree's code."""
    wrapper = base / "python-here"
    wrapper.write_text(f'#!/bin/sh\ncd "{base.resolve()}" && exec "{venv_python("asr")}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the base tree (services/, voiceagent/ with its stubs)")
    parser.add_argument("--preset", default="nemotron-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--chunks", default="320")
    parser.add_argument("--max-streams", type=int, default=4096, help="search limit (each service has 64 slots more)")
    parser.add_argument("--start-streams", type=int, default=512)
    parser.add_argument("--precision", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--clip-s", type=float, default=6.4)
    parser.add_argument("--throughput", action="store_true", help="bench-asr's RTF probes instead of paced streams")
    parser.add_argument("--service-args", default="", help="flags for both services (one string)")
    parser.add_argument(
        "--warm-up-streams",
        type=int,
        default=-1,
        help="one untimed probe of this many streams per service before each search (-1: the start streams, 0: none): "
        "a service's first large batches pay one-time costs (session 17: its first probe at 1,024 read 1.43, 960 "
        "then 0.77)",
    )
    parser.add_argument("--builds", default="base,here", help="which to start: base, here or both (interleaved)")
    args = parser.parse_args()
    chunks = [int(chunk) for chunk in args.chunks.split(",")]
    paced = not args.throughput
    flags = ["--preset", args.preset, "--max-streams", str(args.max_streams + 64)]
    flags += ["--max-batch-streams", str(args.max_streams), "--device", args.device, "--dtype", args.dtype]
    flags += ["--graph-chunks", ",".join(map(str, chunks)), "--probe-ceilings", "false"]
    flags += shlex.split(args.service_args)
    started = time.perf_counter()
    # one alone: two services may not fit a GPU; the base tree is needed (and written to) only when it runs
    builds = {
        name: base_python(Path(args.base)) if name == "base" else venv_python("asr") for name in args.builds.split(",")
    }
    services = {}
    clients = None
    try:
        for name, python in builds.items():
            services[name] = start_service("services.asr", python, flags)
        for name, service in services.items():
            service.wait_serving(900)
            print(f"{name}: serving at {service.address} ({time.perf_counter() - started:.0f} s)", flush=True)
        clients = ClientProcesses(args.clients)
        value = "p95/chunk" if paced else "RTF"
        found = {}
        for chunk_ms in chunks:
            seconds = clip_seconds(chunk_ms, args.clip_s)
            measures = [
                lambda n, a=service.address, c=chunk_ms, s=seconds: clients.probe(a, c, n, s, 0, paced)
                for service in services.values()
            ]
            warm = args.start_streams if args.warm_up_streams < 0 else args.warm_up_streams
            for name, measure in zip(services, measures, strict=True):
                if warm:
                    print(f"    warm-up: {warm} streams, {value} ({name}) {measure(warm):.2f}, not counted", flush=True)
            results = capacities(
                measures, args.max_streams, runs=args.runs, precision=args.precision, start=args.start_streams,
                labels=[f"{value} ({name})" for name in services],
            )  # fmt: skip
            found[chunk_ms] = dict(zip(services, results, strict=True))
            for name, (streams, at) in found[chunk_ms].items():
                print(f"  {name} {chunk_ms} ms: {streams} streams ({value} {at:.2f})", flush=True)
    finally:
        if clients is not None:
            clients.close()
        for service in services.values():
            service.terminate()
    criterion = "paced, per-chunk latency p95 < chunk" if paced else "RTF < 1"
    print(
        f"\nreal-time streams ({criterion}), preset {args.preset}, {args.device} {args.dtype}; "
        f"flags {args.service_args or '(defaults)'}; base {args.base}; {args.clients} client processes; "
        f"clips {args.clip_s:g} s; search from {args.start_streams}, precision {args.precision}; "
        f"warm-up probe {args.start_streams if args.warm_up_streams < 0 else args.warm_up_streams}"
    )
    print("chunk_ms | " + " | ".join(builds))
    for chunk_ms, result in found.items():
        print(f"{chunk_ms:8d} | " + " | ".join(f"{n} ({at:.2f})" for n, at in result.values()))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
