"""Side by side: our LLM service and `vllm serve` on the same model, preset and workload, at concurrency 1 and 16.

Each gets the machine to itself in turn (ours first, then the peer), the same random token-id prompts and
output lengths, greedy and ignore_eos, prefix caching off. Compared: TTFT p50 and tokens/s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc

from loadgen.processes import HttpProcess, ServiceProcess, peer_command
from loadgen.report import write_report
from loadgen.sweep import SweepPlan, free_port, run_sweep
from loadgen.workload import Workload
from voiceagent.v1 import common_pb2, llm_pb2_grpc

LEVELS = [1, 16]
TOLERANCE = 0.05  # within 5% counts as a match: closer than run-to-run noise on a shared 2-core machine


def _plan(target: str, quick: bool) -> SweepPlan:
    # No early stop: both sides run both levels whatever their latency.
    return SweepPlan(target, LEVELS, duration_s=4.0 if quick else 10.0, warmup_s=1.0 if quick else 2.0,
                     stop_early=False)  # fmt: skip


def _verdict(ours_ttft: float, peer_ttft: float, ours_tps: float, peer_tps: float) -> str:
    parts = []
    for what, ours, peer, lower_is_better in (("TTFT", ours_ttft, peer_ttft, True),
                                              ("tokens/s", ours_tps, peer_tps, False)):  # fmt: skip
        if not peer or not ours:
            parts.append(f"{what}: no data")
            continue
        better = ours <= peer if lower_is_better else ours >= peer
        close = abs(ours - peer) <= TOLERANCE * peer
        gap = abs(ours / peer - 1)
        parts.append(f"{what} " + ("beats" if better else "matches" if close else f"trails by {gap:.0%}"))
    return ", ".join(parts)


def compare(ours, peer) -> list[dict]:
    rows = []
    theirs = {level.concurrency: level for level in peer.levels}
    for level in ours.levels:
        other = theirs.get(level.concurrency)
        ours_ttft, ours_tps = level.latency["ttft_s"].p50, level.throughput
        peer_ttft, peer_tps = (other.latency["ttft_s"].p50, other.throughput) if other else (0.0, 0.0)
        rows.append({
            "concurrency": level.concurrency,
            "ours_ttft": f"{ours_ttft * 1000:.0f} ms", "peer_ttft": f"{peer_ttft * 1000:.0f} ms" if other else "—",
            "ours_tps": f"{ours_tps:.1f}", "peer_tps": f"{peer_tps:.1f}" if other else "—",
            "verdict": _verdict(ours_ttft, peer_ttft, ours_tps, peer_tps),
        })  # fmt: skip
    return rows


def side_by_side(llm: ServiceProcess, workload: Workload, folder: Path, quick: bool, stages) -> list[dict]:
    """Sweep our LLM at C=1 and 16, stop it, start `vllm serve` on the same model, sweep it; print both."""
    folder.mkdir()
    with grpc.insecure_channel(llm.address) as channel:
        info = llm_pb2_grpc.TextGeneratorStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=10)
    command = peer_command(info.model.preset, port := free_port())
    (folder / "ours").mkdir()
    ours = run_sweep(_plan("llm", quick), workload, folder / "ours", progress=lambda line: print(line, flush=True))
    write_report(ours, folder / "ours")
    llm.stop()

    stages.begin("starting vllm serve (the peer) on the same preset")
    base_url = f"http://127.0.0.1:{port}"
    peer_process = HttpProcess("vllm serve", command, folder / "vllm-serve.log", f"{base_url}/v1/models")
    try:
        peer_process.wait_ready(600)
        stages.begin("sweep the peer: concurrency 1 and 16")
        (folder / "vllm-serve").mkdir()
        peer_workload = dataclasses.replace(
            ours.workload, endpoints=dataclasses.replace(workload.endpoints, openai=base_url)
        )
        peer = run_sweep(_plan("openai", quick), peer_workload, folder / "vllm-serve",
                         progress=lambda line: print(line, flush=True))  # fmt: skip
        write_report(peer, folder / "vllm-serve")
    finally:
        peer_process.stop()
    rows = compare(ours, peer)
    print("\nside by side (same preset, same workload):")
    for row in rows:
        print(f"  C={row['concurrency']:>2}: TTFT p50 ours {row['ours_ttft']} vs vllm serve {row['peer_ttft']}; "
              f"tokens/s ours {row['ours_tps']} vs vllm serve {row['peer_tps']} — {row['verdict']}")  # fmt: skip
    return rows
