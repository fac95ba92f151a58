"""A model of the ASR `ready` step policy with overlapped steps, for one chunk size: what the batch wait does to
paced capacity on a GPU. Not a measurement: a discrete-event replay of services/asr/engine/batching.py's loop
(`_gather_ready`, `_step_batch`, `drain`) over N real-time streams whose chunks complete at uniformly spread phases,
with a step's device time, and the host time to launch and to read back a step, linear in its rows.

Constants fitted to the H100 of results/h200/README.md v6 (nemotron-0.6b, bf16, graphs, 320 ms): device 6 ms + 0.113
ms per row (64.4 ms at 512 rows, 121 at 1,024, 237 at 2,048); launch 2 ms + 0.024 ms per row (the py-spy split: 70
of 405 step-thread samples launching, 38 steps in 7 s at 539 rows); read-back 1 ms + 0.01 ms per row (a guess). No
network, no client jitter, no front ends: it puts the policy's own latency on top of the step. At 1,024 streams with
the wait counted from the loop's look (the code v6 measured) it gives 538 rows per step (measured: 539) and p95 per
chunk 0.77 (measured 0.99, with the transport this leaves out).

    python3 -m results.h200.asr_policy_model [--streams 512,1024,...] [--wait 0.25]
"""

from __future__ import annotations

import argparse
import random


def simulate(
    streams: int,
    policy: str,
    chunk_s: float = 0.320,
    wait: float = 0.25,
    device: tuple[float, float] = (0.006, 0.113e-3),
    launch: tuple[float, float] = (0.002, 0.024e-3),
    collect: tuple[float, float] = (0.001, 0.010e-3),
    seconds: float = 8.0,
    seed: int = 1,
) -> tuple[float, float, float]:
    """p95 per-chunk latency over the chunk, mean rows per step and the device's busy fraction, after a quarter of
    the run. policy: 'look' (the wait starts when the loop looks, after reading the step in flight back), 'completion'
    (the wait is counted from the oldest ready chunk's completion; the step in flight is read back once it has run,
    or the next is launched beside it when the wait is over first) or 'none' (no wait)."""
    rng = random.Random(seed)
    due = [rng.random() * chunk_s + chunk_s for _ in range(streams)]  # each stream's next chunk completes
    in_step = [False] * streams
    latencies: list[float] = []
    steps: list[tuple[int, float]] = []
    now = device_free = 0.0
    in_flight: tuple[float, list[int], list[float]] | None = None  # device done at, rows, their completion times

    def ready() -> list[int]:
        return [i for i in range(streams) if not in_step[i] and due[i] <= now]

    def read_back(flight) -> float:
        done_at, rows, completed = flight
        end = max(now, done_at) + collect[0] + collect[1] * len(rows)
        for row, at in zip(rows, completed, strict=True):
            in_step[row] = False
            latencies.append(end - at)
        return end

    while now < seconds:
        rows = ready()
        if not rows:
            pending = [due[i] for i in range(streams) if not in_step[i]]
            if in_flight is not None and (not pending or in_flight[0] <= min(pending)):
                now, in_flight = read_back(in_flight), None
            else:
                now = max(now, min(pending))
            continue
        waiting = sum(1 for i in range(streams) if not in_step[i])
        if len(rows) < waiting and policy != "none":
            last_due = max(due[i] for i in range(streams) if not in_step[i])
            if policy == "look":
                if in_flight is not None:
                    now, in_flight = read_back(in_flight), None
                    continue
                now = min(now + wait * chunk_s, max(now, last_due))
            else:
                deadline = min(due[i] for i in rows) + wait * chunk_s
                if deadline > now:
                    if in_flight is not None and in_flight[0] <= deadline:
                        now, in_flight = read_back(in_flight), None
                        continue
                    now = deadline if in_flight is not None else min(deadline, max(now, last_due))
            rows = ready()
        completed = [due[i] for i in rows]
        for i in rows:
            in_step[i] = True
            due[i] += chunk_s
        now += launch[0] + launch[1] * len(rows)
        step_s = device[0] + device[1] * len(rows)
        device_free = max(now, device_free) + step_s
        steps.append((len(rows), step_s))
        earlier, in_flight = in_flight, (device_free, rows, completed)
        if earlier is not None:
            now = read_back(earlier)
    settled = sorted(latencies[len(latencies) // 4 :])
    p95 = settled[int(0.95 * len(settled))]
    kept = steps[len(steps) // 4 :]
    return p95 / chunk_s, sum(r for r, _ in kept) / len(kept), sum(s for _, s in steps) / now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="128,512,1024,1536,2048,2304,2560,2816")
    parser.add_argument("--wait", type=float, default=0.25, help="batch wait, a fraction of the chunk")
    args = parser.parse_args()
    policies = {
        "look": f"wait {args.wait:g} from the loop's look (before)",
        "completion": f"wait {args.wait:g} from completion",
        "none": "no wait",
    }
    print("streams | " + " | ".join(f"{label}: p95/chunk, rows/step, device busy" for label in policies.values()))
    for streams in (int(n) for n in args.streams.split(",")):
        cells = []
        for policy in policies:
            p95, rows, busy = simulate(streams, policy, wait=args.wait)
            cells.append(f"{p95:5.2f} {rows:6.0f} {busy:4.2f}")
        print(f"{streams:7d} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
