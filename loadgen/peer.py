"""Side by side: our LLM service and `vllm serve` on the same model, preset and workload, at concurrency 1 and 16.

Both servers stay up and take turns: per round and level, one short sweep of ours then one of the peer (the
order flips every round), so a drift of the machine (another tenant, thermal state, a noisy neighbour) lands on
both sides instead of deciding the verdict. The verdict pools the rounds and states their spread; it says
"beats" or "trails" only when the pooled difference exceeds the spread of the per-round differences. Same
random token-id prompts and output lengths, greedy and ignore_eos, prefix caching off. Compared: TTFT p50 and
tokens/s.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

from loadgen.processes import PEER_PRIVATE_TMP, HttpProcess, peer_command
from loadgen.results import LevelResult
from loadgen.sweep import SweepPlan, free_port, run_sweep
from loadgen.workload import Workload
from voiceagent.serving.tls import open_channel
from voiceagent.v1 import common_pb2, llm_pb2_grpc

LEVELS = [1, 16]
ROUNDS = 3
MIN_SPREAD = 0.02  # closer than 2% is a match whatever the rounds say: below what one level can resolve


@dataclasses.dataclass
class Turn:
    """One short sweep of one side at one level in one round."""

    side: str  # "ours" | "peer"
    round: int
    concurrency: int
    started_s: float
    ttft_p50_s: float
    tokens_per_s: float
    requests: int
    errors: int


@dataclasses.dataclass
class Comparison:
    """One metric at one level, pooled over the rounds."""

    metric: str  # "TTFT p50" | "tokens/s"
    ours: float  # pooled: median of the rounds' TTFT p50, mean of the rounds' tokens/s
    peer: float
    ratios: list[float]  # ours / peer per round
    lower_is_better: bool

    @property
    def ratio(self) -> float:
        return self.ours / self.peer if self.peer else 0.0

    @property
    def spread(self) -> float:
        """Half the range of the per-round ratios: how far one round can sit from another."""
        return (max(self.ratios) - min(self.ratios)) / 2 if len(self.ratios) > 1 else 0.0

    def verdict(self) -> str:
        if not self.ours or not self.peer:
            return f"{self.metric}: no data"
        gap = self.ratio - 1
        spread = f"±{self.spread:.0%} over {len(self.ratios)} rounds"
        if abs(gap) <= max(self.spread, MIN_SPREAD):
            return f"{self.metric} matches ({gap:+.0%}, {spread})"
        better = gap < 0 if self.lower_is_better else gap > 0
        return f"{self.metric} {'beats' if better else 'trails'} by {abs(gap):.0%} ({spread})"


def compare(turns: list[Turn]) -> list[dict]:
    """Rows per level: pooled TTFT and tokens/s of each side, their spread and the verdict."""
    rows = []
    for concurrency in sorted({turn.concurrency for turn in turns}):
        at = [turn for turn in turns if turn.concurrency == concurrency]
        rounds = sorted({turn.round for turn in at})
        pairs = []
        for number in rounds:
            ours = [turn for turn in at if turn.round == number and turn.side == "ours"]
            peer = [turn for turn in at if turn.round == number and turn.side == "peer"]
            if ours and peer and ours[0].requests and peer[0].requests:
                pairs.append((ours[0], peer[0]))
        ttft = Comparison(
            "TTFT p50",
            statistics.median(o.ttft_p50_s for o, _ in pairs) if pairs else 0.0,
            statistics.median(p.ttft_p50_s for _, p in pairs) if pairs else 0.0,
            [o.ttft_p50_s / p.ttft_p50_s for o, p in pairs if p.ttft_p50_s],
            lower_is_better=True,
        )
        tokens = Comparison(
            "tokens/s",
            statistics.fmean(o.tokens_per_s for o, _ in pairs) if pairs else 0.0,
            statistics.fmean(p.tokens_per_s for _, p in pairs) if pairs else 0.0,
            [o.tokens_per_s / p.tokens_per_s for o, p in pairs if p.tokens_per_s],
            lower_is_better=False,
        )
        rows.append({
            "concurrency": concurrency,
            "rounds": len(pairs),
            "ours_ttft": f"{ttft.ours * 1000:.0f} ms" if pairs else "—",
            "peer_ttft": f"{ttft.peer * 1000:.0f} ms" if pairs else "—",
            "ours_tps": f"{tokens.ours:.1f}" if pairs else "—",
            "peer_tps": f"{tokens.peer:.1f}" if pairs else "—",
            "verdict": f"{ttft.verdict()}; {tokens.verdict()}",
        })  # fmt: skip
    return rows


def _turn(side: str, number: int, level: LevelResult, started_s: float) -> Turn:
    ttft = level.latency.get("ttft_s")
    return Turn(side, number, level.concurrency, started_s, ttft.p50 if ttft and ttft.count else 0.0,
                level.throughput, level.requests, level.errors)  # fmt: skip


def side_by_side(
    llm_address: str,
    workload: Workload,
    folder: Path,
    quick: bool,
    stages,
    rounds: int = ROUNDS,
    peer_args: tuple[str, ...] = (),
    service_args: tuple[str, ...] = (),
) -> list[dict]:
    """Start `vllm serve` on our LLM's preset beside it, alternate short sweeps of both, return the rows.
    `service_args`: the flags our service was started with beyond the preset (device, dtype, GPU memory share),
    so that the peer's engine is built the same way."""
    folder.mkdir()
    with open_channel(llm_address, workload.endpoints.tls) as channel:
        info = llm_pb2_grpc.TextGeneratorStub(channel).GetInfo(common_pb2.InfoRequest(), timeout=10)
    command = [*peer_command(info.model.preset, port := free_port(), service_args), *peer_args]
    stages.begin("starting vllm serve (the peer) on the same preset, beside our LLM service")
    base_url = f"http://127.0.0.1:{port}"
    peer_process = HttpProcess(
        "vllm serve", command, folder / "vllm-serve.log", f"{base_url}/v1/models", private_tmp=PEER_PRIVATE_TMP
    )
    sides = {
        "ours": ("llm", workload),
        "peer": ("openai", dataclasses.replace(workload, endpoints=dataclasses.replace(workload.endpoints,
                                                                                         openai=base_url))),
    }  # fmt: skip
    turns: list[Turn] = []
    try:
        peer_process.wait_ready(600)
        stages.begin(f"side by side: {rounds} interleaved rounds at concurrency {', '.join(map(str, LEVELS))}")
        for number in range(1, rounds + 1):
            order = ("ours", "peer") if number % 2 else ("peer", "ours")
            for concurrency in LEVELS:
                for side in order:
                    target, side_workload = sides[side]
                    plan = SweepPlan(target, [concurrency], duration_s=4.0 if quick else 8.0,
                                     warmup_s=1.0 if quick else 2.0, stop_early=False)  # fmt: skip
                    out = folder / f"round{number}-c{concurrency}-{side}"
                    out.mkdir()
                    started = time.time()
                    sweep = run_sweep(plan, side_workload, out, progress=lambda line: None)
                    for level in sweep.levels:
                        turns.append(_turn(side, number, level, started))
                        print(f"  round {number}, C={concurrency}, {side}: TTFT p50 {turns[-1].ttft_p50_s * 1000:.0f}"
                              f" ms, {level.throughput:.1f} tokens/s", flush=True)  # fmt: skip
    finally:
        peer_process.stop()
    rows = compare(turns)
    (folder / "turns.json").write_text(json.dumps([dataclasses.asdict(t) for t in turns], indent=1), encoding="utf-8")
    (folder / "comparison.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print("\nside by side (same preset, same workload, interleaved rounds pooled):")
    for row in rows:
        print(f"  C={row['concurrency']:>2}: TTFT p50 ours {row['ours_ttft']} vs vllm serve {row['peer_ttft']}; "
              f"tokens/s ours {row['ours_tps']} vs vllm serve {row['peer_tps']} — {row['verdict']}")  # fmt: skip
    return rows
