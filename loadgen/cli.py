"""`python -m loadgen sweep|run|plan|worker`: the load generator's command line.

    python -m loadgen sweep --target llm --concurrency 1,2,4,8 --duration-s 20
    python -m loadgen sweep --target asr --concurrency 1,4,16 --requests 40 --workers 2
    python -m loadgen run            # `make run`: start the services, sweep everything, report, stop them
    python -m loadgen plan reports/<run> --sessions 100   # replicas per service, from measured sweeps
    python -m loadgen run --device cuda --only llm --folder DIR   # one part of a run; then:
    python -m loadgen combine --into RUN DIR...                   # the parts joined into one report

`--workers N` runs Locust's master in the sweep process and N worker processes beside it (one Python process
makes about one core of load); `worker` is how the sweep starts them, with the workload in LOADGEN_WORKLOAD.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from loadgen.workload import TARGETS, Endpoints, Lengths, Workload


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r}: expected integers like 1,2,4,8") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r}: levels must be ≥ 1")
    return sorted(set(levels))


def _presets(text: str) -> dict[str, str]:
    presets = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if not presets or set(presets) - {"asr", "llm", "tts"} or text.count("=") != len(presets):
        raise argparse.ArgumentTypeError(f"--presets {text!r}: expected SERVICE=PRESET,... with asr, llm or tts")
    return presets


def _stages(text: str) -> list[str]:
    from loadgen.main_job import STAGES

    chosen = [part.strip() for part in text.split(",") if part.strip()]
    if not chosen or set(chosen) - set(STAGES):
        raise argparse.ArgumentTypeError(f"--only {text!r}: expected some of {','.join(STAGES)}")
    return chosen


def _lengths(text: str) -> Lengths:
    try:
        return Lengths(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    defaults, endpoints = Workload(), Endpoints()
    group = parser.add_argument_group("workload (lengths: N, LOW-HIGH or lognormal:MEDIAN,SIGMA)")
    group.add_argument("--prompt-tokens", type=_lengths, default=defaults.prompt_tokens, help="LLM prompt tokens")
    group.add_argument("--output-tokens", type=_lengths, default=defaults.output_tokens, help="LLM output tokens")
    group.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false", help="stop at end-of-sequence")
    group.add_argument("--utterance-s", type=_lengths, default=defaults.utterance_s, help="ASR utterance seconds")
    group.add_argument("--chunk-ms", type=int, default=defaults.chunk_ms, help="ASR chunk (80,160,320,560,1120)")
    group.add_argument("--text-words", type=_lengths, default=defaults.text_words, help="TTS text words")
    group.add_argument("--inference-timesteps", type=int, default=None, help="TTS diffusion steps")
    group.add_argument("--reply-tokens", type=_lengths, default=defaults.reply_tokens, help="voice reply tokens")
    group.add_argument("--flush-words", type=int, default=defaults.flush_words, help="voice: words before 1st flush")
    group.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="deadline of one request")
    group = parser.add_argument_group("endpoints (defaults: the services' default ports)")
    for field in dataclasses.fields(Endpoints):
        group.add_argument(f"--{field.name.replace('_', '-')}", default=getattr(endpoints, field.name))


def workload_from(args: argparse.Namespace) -> Workload:
    if os.environ.get("LOADGEN_WORKLOAD"):
        return Workload.from_json(os.environ["LOADGEN_WORKLOAD"])
    endpoints = Endpoints(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Endpoints)})
    names = {field.name for field in dataclasses.fields(Workload)} - {"endpoints", "vocab_size"}
    return Workload(endpoints=endpoints, **{name: getattr(args, name) for name in names})


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__.split("\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    sweep = commands.add_parser("sweep", help="sweep one target over concurrency levels and write a report")
    sweep.add_argument("--target", choices=TARGETS, required=True)
    sweep.add_argument("--concurrency", type=_levels, default=_levels("1,2,4,8,16"), help="levels, e.g. 1,2,4,8")
    length = sweep.add_mutually_exclusive_group()
    length.add_argument("--duration-s", type=float, default=20.0, help="measuring time per level")
    length.add_argument("--requests", type=int, default=None, help="measured requests per level (instead)")
    sweep.add_argument("--warmup-s", type=float, default=3.0, help="load before measuring, per level")
    sweep.add_argument("--objective-s", type=float, default=None, help="p95 of the primary latency; stop past it")
    sweep.add_argument("--max-error-rate", type=float, default=0.05, help="stop after a level with more errors")
    sweep.add_argument("--workers", type=int, default=0, help="Locust worker processes (0: users run here)")
    sweep.add_argument("--reports", type=Path, default=Path("reports"), help="folder the run's folder goes in")
    add_workload_flags(sweep)

    worker = commands.add_parser("worker", help="a Locust worker process of a distributed sweep")
    worker.add_argument("--target", choices=TARGETS, required=True)
    worker.add_argument("--master-host", default="127.0.0.1")
    worker.add_argument("--master-port", type=int, required=True)
    add_workload_flags(worker)

    run = commands.add_parser("run", help="the main job: start the services, sweep all, report, stop them")
    run.add_argument("--reports", type=Path, default=Path("reports"))
    run.add_argument("--quick", action="store_true", help="short levels (a smoke run of the whole job)")
    run.add_argument("--no-peer", dest="peer", action="store_false", help="skip the side-by-side vllm serve run")
    run.add_argument("--preset", default="", help="one preset for all three services (e.g. tiny); default: each's own")
    run.add_argument("--presets", type=_presets, default={}, help="some services' presets, e.g. asr=fastconformer-100m")
    run.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU presets and sweeps (loadgen/run_plans.py); `make run DEVICE=cuda`",
    )
    run.add_argument(
        "--only",
        type=_stages,
        default=None,
        help="some stages of the run (asr,llm,tts,voice,peer): a run in parts, joined by `combine`",
    )
    run.add_argument("--folder", type=Path, default=None, help="write the run here (default: reports/<time>-run)")

    combine = commands.add_parser("combine", help="join the folders of a run made in parts into one report")
    combine.add_argument("parts", type=Path, nargs="+", help="the parts' folders (`run --only ... --folder DIR`)")
    combine.add_argument("--into", type=Path, required=True, help="the combined run's folder (created)")

    compare = commands.add_parser("compare", help="a running LLM service side by side with `vllm serve`")
    compare.add_argument("--rounds", type=int, default=3, help="interleaved rounds (ours, peer, ...) per level")
    compare.add_argument("--quick", action="store_true", help="short levels")
    compare.add_argument("--reports", type=Path, default=Path("reports"))
    compare.add_argument("--peer-args", default="", help="extra `vllm serve` flags, e.g. --peer-args=--enforce-eager")
    add_workload_flags(compare)

    from loadgen.analysis.plan import add_plan_arguments

    add_plan_arguments(commands.add_parser("plan", help="replicas per service for N voice sessions, from sweeps"))
    return root


def sweep_command(args: argparse.Namespace) -> int:
    from loadgen.report import run_folder, write_report
    from loadgen.sweep import SweepPlan, run_sweep

    plan = SweepPlan(
        target=args.target,
        concurrency=args.concurrency,
        duration_s=None if args.requests else args.duration_s,
        requests=args.requests,
        warmup_s=args.warmup_s,
        objective_s=args.objective_s,
        max_error_rate=args.max_error_rate,
        workers=args.workers,
    )
    folder = run_folder(args.reports, args.target)
    sweep = run_sweep(plan, workload_from(args), folder)
    _, text = write_report(sweep, folder)
    print(f"\n{text}\nreport: {folder / 'report.md'} (and report.html)")
    return 0 if sweep.levels else 1


def compare_command(args: argparse.Namespace) -> int:
    from loadgen.main_job import Stages
    from loadgen.peer import side_by_side
    from loadgen.report import run_folder

    workload = workload_from(args)
    folder = run_folder(args.reports, "compare")
    rows = side_by_side(workload.endpoints.llm, workload, folder / "peer", args.quick, Stages(), args.rounds,
                        tuple(args.peer_args.split()))  # fmt: skip
    print(f"\nturns and pooled rows: {folder / 'peer'}/turns.json, comparison.json")
    return 0 if rows and all(row["rounds"] for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "sweep":
        return sweep_command(args)
    if args.command == "plan":
        from loadgen.analysis.plan import plan_command

        return plan_command(args)
    if args.command == "compare":
        return compare_command(args)
    if args.command == "combine":
        from loadgen.combine import combine_parts

        return combine_parts(args.parts, args.into)
    if args.command == "worker":
        from loadgen.worker import run_worker

        return run_worker(args.target, args.master_host, args.master_port, workload_from(args))
    from loadgen.main_job import run_session

    return run_session(args.reports, quick=args.quick, peer=args.peer, preset=args.preset, presets=args.presets,
                       device=args.device, only=args.only, folder=args.folder)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
