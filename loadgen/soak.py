"""A soak: the three services and the voice turn under steady load for a long time, with cancels and abrupt
disconnects mixed in, to prove that nothing leaks.

It starts the services (ports the OS picks), runs one loadgen sweep level per target for the whole duration
(the same Locust users `make sweep` uses, each in its own process) at about 70 % of that target's knee in a
run's results (`--from-run reports/<run>`; by default the newest `reports/*-run`, see `soak_levels`),
and meanwhile every `--disrupt-every-s` cancels an LLM stream after its first token and kills a client
process in the middle of a TTS or an ASR stream (alternately). Every 5 s it samples each service's resident
memory and open file descriptors (the gRPC process and its engine/worker children). Passes when:
- the sweeps recorded no errors, and the services answered nothing but OK and CANCELLED;
- afterwards every busy gauge is back to 0 within 30 s (RPCs in flight, LLM running/waiting, ASR streams and offline
  calls, TTS busy workers and queue);
- resident memory grows no faster than `--max-rss-mb-per-h` per service and open descriptors by at most
  `--max-fd-growth`, both measured from the end of the first third (warm-up: allocator pools, compile and
  tokenizer caches) to the end; the slopes (memory and descriptors) are least-squares fits, reported per hour.
  Memory fails only when its floor grows too: a leak raises the lowest resident size (the floor of the steady
  window's last third against that of its first third, per hour), while allocator churn of a few tens of MiB
  moves the fitted slope of a short run by hundreds of MiB/h either way (a 3-minute soak once fitted +632 MiB/h
  to an LLM whose memory went from 4,593 to 4,552 MiB).

    python -m loadgen.soak --duration-s 1800                # make soak: levels from the newest reports/*-run
    python -m loadgen.soak --from-run results/cpu/run-2026-12-03   # levels from that run's knees
    python -m loadgen.soak --duration-s 180 --preset tiny   # the short version tests/loadgen/test_soak.py runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from loadgen.processes import ServiceProcess, service_process
from loadgen.report import run_folder
from voiceagent.serving.launcher import scrape_samples
from voiceagent.v1 import llm_pb2, llm_pb2_grpc

SERVICES = ("asr", "llm", "tts")
TARGETS = ("asr", "llm", "tts", "voice")
SAMPLE_EVERY_S = 5.0
IDLE_WITHIN_S = 30.0  # busy gauges must read 0 within this long once the load stopped
# The three services load at once, on a shared 2-core machine: at load average 35-86 the 3-minute soak once failed
# because the LLM was not ready in time (its bounds were then 900 s per service and 1,080 s for the whole test).
READY_TIMEOUT_S = 1500.0
EXPECTED_CODES = ("OK", "CANCELLED")
KNEE_SHARE = 0.7  # each target runs at about this share of its knee
# Without a run to read knees from (or with --preset, whose knees no run measured): small fixed levels that the
# tiny presets hold on 2 cores with all four targets at once.
DEFAULT_LEVELS = {"asr": 2, "llm": 4, "tts": 1, "voice": 1}
# The workload a run's sweeps used, passed on so the soak offers the requests its knees were measured with.
WORKLOAD_FLAGS = ("prompt_tokens", "output_tokens", "utterance_s", "chunk_ms", "text_words", "reply_tokens",
                  "flush_words", "timeout_s", "inference_timesteps")  # fmt: skip
BUSY_GAUGES = {  # service -> gauges that must read 0 once the load stops
    "asr": ("voiceagent_asr_rpc_in_flight", "voiceagent_asr_active_streams", "voiceagent_asr_offline_requests"),
    "llm": ("voiceagent_llm_rpc_in_flight", "voiceagent_llm_requests_running", "voiceagent_llm_requests_waiting"),
    "tts": ("voiceagent_tts_rpc_in_flight", "voiceagent_tts_busy_workers", "voiceagent_tts_queued_requests"),
}

# A client that opens a stream, says "open" once audio or a hypothesis arrived, and waits to be killed (it
# gives up after 60 s without an answer, so a disruption never waits for ever).
_DISCONNECTING_CLIENT = """
import sys, time, grpc
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2, tts_pb2, tts_pb2_grpc
kind, address = sys.argv[1], sys.argv[2]
channel = grpc.insecure_channel(address)
if kind == "tts":
    call = tts_pb2_grpc.SpeechSynthesizerStub(channel).Synthesize(
        tts_pb2.SynthesizeRequest(text="This stream is cut off in the middle of a sentence. " * 3), timeout=60)
else:
    config = asr_pb2.RecognitionConfig(
        sample_rate_hz=16000, encoding=common_pb2.AUDIO_ENCODING_FLOAT32, chunk_ms=320, interim_results=True)
    def requests():
        yield asr_pb2.StreamingRecognizeRequest(config=config)
        yield asr_pb2.StreamingRecognizeRequest(audio=bytes(16000 * 4))
        time.sleep(600)
    call = asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(requests(), timeout=60)
next(call)
print("open", flush=True)
time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            found += [int(entry.name), *_children(int(entry.name))]
    return found


def footprint(pid: int) -> tuple[float, int]:
    """Resident MiB and open descriptors of `pid` and all its descendants."""
    rss_kib, fds = 0, 0
    for process in (pid, *_children(pid)):
        try:
            status = Path(f"/proc/{process}/status").read_text()
            rss_kib += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            fds += len(list(Path(f"/proc/{process}/fd").iterdir()))
        except (OSError, StopIteration):
            continue  # gone meanwhile
    return rss_kib / 1024, fds


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) samples, per hour."""
    if len(samples) < 2:
        return 0.0
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_v = sum(v for _, v in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return 0.0 if not spread else 3600 * sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread


def floor_growth_per_hour(samples: list[tuple[float, float]]) -> float:
    """How fast the lowest value rises: the minimum of the last third of (seconds, value) samples against the
    minimum of the first third, over the time between the two thirds' middles, per hour."""
    third = len(samples) // 3
    if third < 1:
        return 0.0
    first, last = samples[:third], samples[-third:]
    between_s = (last[0][0] + last[-1][0]) / 2 - (first[0][0] + first[-1][0]) / 2
    if between_s <= 0:
        return 0.0
    return 3600 * (min(v for _, v in last) - min(v for _, v in first)) / between_s


def newest_run(reports: Path) -> Path | None:
    """The newest `make run` folder under `reports` with at least one target's results.json."""
    runs = [run for run in sorted(reports.glob("*-run")) if any(run.glob("*/results.json"))]
    return runs[-1] if runs else None


def knee_level(results: dict) -> tuple[int, str]:
    """About 70 % of one target's capacity in a sweep's results.json, and why.

    The capacity is the throughput knee, or for real-time targets (ASR, TTS, the voice turn) the real-time limit
    when that is lower (past it streams fall behind, however much throughput still grows); with neither, the
    highest level measured without errors (a lower bound: the sweep stopped before a knee)."""
    analysis = results.get("analysis", {})
    knee, realtime = analysis.get("knee_concurrency"), analysis.get("realtime_limit")
    found = [(knee, "knee"), (realtime, "real-time limit")]
    found = [(value, name) for value, name in found if value]
    if found:
        capacity, name = min(found)
    else:
        clean = [level["concurrency"] for level in results.get("levels", []) if not level.get("errors")]
        if not clean:
            raise ValueError("no level without errors")
        capacity, name = max(clean), "highest level without errors (no knee measured)"
    level = max(1, round(KNEE_SHARE * capacity))
    return level, f"{level} = {KNEE_SHARE:.0%} of C={capacity}, the {name}"


def soak_levels(args: argparse.Namespace) -> dict:
    """Which concurrency, preset and workload each target soaks at, and why.

    `--from-run RUN` reads RUN/<target>/results.json; without it the newest `reports/*-run` (unless --preset is
    given: no run measured that preset's knees); without a run, DEFAULT_LEVELS. An explicit --asr/--llm/--tts/
    --voice wins. The run's presets and workload come along, so the services and requests are the ones the knees
    were measured on. The knees were each measured alone; the soak runs all four at once on the same machine."""
    run = args.from_run
    if run is None and not args.preset:
        run = newest_run(args.reports)
    plan: dict = {"run": str(run) if run else None, "presets": {}, "workload": [], "levels": {}}
    for target in TARGETS:
        explicit = getattr(args, target)
        results_file = run / target / "results.json" if run else None
        if explicit is not None:
            plan["levels"][target] = {"concurrency": explicit, "why": "set on the command line"}
        elif results_file and results_file.is_file():
            level, why = knee_level(json.loads(results_file.read_text()))
            plan["levels"][target] = {"concurrency": level, "why": f"{why} in {results_file}"}
        else:
            why = f"no {results_file}" if results_file else ("--preset given" if args.preset else "no run found")
            plan["levels"][target] = {"concurrency": DEFAULT_LEVELS[target], "why": f"fixed default ({why})"}
    if run and not args.preset:
        for name in SERVICES:
            results_file = run / name / "results.json"
            if results_file.is_file():
                plan["presets"][name] = json.loads(results_file.read_text())["facts"].get("preset", "")
        first = next(iter(sorted(run.glob("*/results.json"))), None)
        if first:
            workload = json.loads(first.read_text())["workload"]
            for name in WORKLOAD_FLAGS:
                value = workload.get(name)
                if value is not None:
                    value = value["spec"] if isinstance(value, dict) else value
                    plan["workload"] += [f"--{name.replace('_', '-')}", str(value)]
            if workload.get("ignore_eos") is False:
                plan["workload"].append("--no-ignore-eos")
    return plan


class Disruptor:
    """Every `every_s`: one LLM stream cancelled after its first token, one client killed mid-stream."""

    def __init__(self, services: dict[str, ServiceProcess], every_s: float):
        self.services, self.every_s = services, every_s
        self.counts = {"cancelled": 0, "disconnected": 0, "failed": 0}
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cancel(self) -> None:
        with grpc.insecure_channel(self.services["llm"].address) as channel:
            request = llm_pb2.GenerateRequest(
                text="cancel me", sampling=llm_pb2.SamplingParams(max_tokens=200, ignore_eos=True)
            )
            call = llm_pb2_grpc.TextGeneratorStub(channel).Generate(request, timeout=60)
            next(call)
            call.cancel()

    def _disconnect(self, kind: str) -> None:
        client = subprocess.Popen(
            [sys.executable, "-c", _DISCONNECTING_CLIENT, kind, self.services[kind].address],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            if client.stdout.readline().strip() != "open":
                raise RuntimeError(f"the {kind} client did not open its stream")
        finally:
            client.kill()  # abrupt: no cancel, the connection just drops
            client.wait()

    def _run(self) -> None:
        turn = 0
        while not self.stop.wait(self.every_s):
            for name, action in (("cancelled", self._cancel), ("disconnected", None)):
                try:
                    if action is None:
                        self._disconnect("tts" if turn % 2 == 0 else "asr")
                    else:
                        action()
                    self.counts[name] += 1
                except Exception as exc:  # recorded: a disruption that could not be made is a finding too
                    self.counts["failed"] += 1
                    self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            turn += 1


def _endpoint_flags(services: dict[str, ServiceProcess]) -> list[str]:
    flags = []
    for name, service in services.items():
        flags += [f"--{name}", service.address, f"--{name}-metrics", service.metrics_url]
    return flags


def _rpc_codes(url: str, service: str) -> dict[str, float]:
    codes: dict[str, float] = {}
    for sample in scrape_samples(url):
        if sample.name == f"voiceagent_{service}_rpc_requests_total" and sample.value:
            codes[sample.labels["code"]] = codes.get(sample.labels["code"], 0) + sample.value
    return codes


def _busy(url: str, gauges: tuple[str, ...]) -> dict[str, float]:
    samples = scrape_samples(url)
    return {gauge: sum(sample.value for sample in samples if sample.name == gauge) for gauge in gauges}


def run_soak(args: argparse.Namespace) -> dict:
    plan = soak_levels(args)
    folder = run_folder(args.reports, "soak")
    (folder / "levels.json").write_text(json.dumps(plan, indent=1))
    for target, level in plan["levels"].items():
        print(f"soak: {target} at C={level['concurrency']}: {level['why']}", flush=True)
    services = {}
    for name in SERVICES:
        preset = args.preset or plan["presets"].get(name, "")
        flags = ["--preset", preset] if preset else []
        services[name] = service_process(name, folder / f"{name}.log", [*flags, "--probe-ceilings", "false"])
    sweeps: list[subprocess.Popen] = []
    disruptor = Disruptor(services, args.disrupt_every_s)
    try:
        ready_s = wait_all_serving(services, args.ready_timeout_s)
        for target in TARGETS:
            if concurrency := plan["levels"][target]["concurrency"]:
                command = [sys.executable, "-m", "loadgen", "sweep", "--target", target,
                           "--concurrency", str(concurrency), "--duration-s", str(args.duration_s),
                           "--warmup-s", "5", "--reports", str(folder / "sweeps"),
                           *plan["workload"], *_endpoint_flags(services)]  # fmt: skip
                log = (folder / f"sweep-{target}.log").open("w")
                sweeps.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        started = time.monotonic()
        disruptor.thread.start()
        footprints: dict[str, list[tuple[float, float, int]]] = {name: [] for name in SERVICES}
        while any(sweep.poll() is None for sweep in sweeps):
            for name, service in services.items():
                service.check_alive()
                rss_mib, fds = footprint(service.proc.pid)
                footprints[name].append((time.monotonic() - started, rss_mib, fds))
            time.sleep(SAMPLE_EVERY_S)
        disruptor.stop.set()
        disruptor.thread.join(120)
        time.sleep(3)  # the last cancelled or dropped streams are released
        return _verdict(args, folder, services, sweeps, disruptor, footprints, plan, ready_s)
    finally:
        disruptor.stop.set()
        for sweep in sweeps:
            if sweep.poll() is None:
                sweep.kill()
        for service in services.values():
            service.stop()


def wait_all_serving(services: dict[str, ServiceProcess], timeout_s: float) -> dict[str, float]:
    """Until every service's health says SERVING (they load in parallel), under one deadline; how long each
    took. A service that exits first or misses the deadline raises, naming it, its log and the load average."""
    started, deadline, ready_s = time.monotonic(), time.monotonic() + timeout_s, {}
    for name, service in services.items():
        try:
            service.wait_serving(max(1.0, deadline - time.monotonic()))
        except (TimeoutError, RuntimeError) as error:
            load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
            late_s = time.monotonic() - started
            raise RuntimeError(f"soak: {name} not SERVING {late_s:.0f} s after the start (bound {timeout_s:g} s, "
                               f"load average {load}); log {service.log}") from error  # fmt: skip
        ready_s[name] = round(service.serving_at - service.started_at, 1)
        print(f"soak: {name} SERVING after {ready_s[name]} s", flush=True)
    return ready_s


def _verdict(args, folder, services, sweeps, disruptor, footprints, plan, ready_s) -> dict:
    problems: list[str] = []
    sweep_errors = {}
    for results in sorted((folder / "sweeps").glob("*/results.json")):
        data = json.loads(results.read_text())
        sweep_errors[data["target"]] = sum(level["errors"] for level in data["levels"])
    for target, errors in sweep_errors.items():
        if errors:
            problems.append(f"{target} sweep: {errors} errors")
    if len(sweep_errors) != len(sweeps):
        problems.append(f"only {len(sweep_errors)} of {len(sweeps)} sweeps wrote results (see sweep-*.log)")
    report: dict = {"duration_s": args.duration_s, "levels": plan["levels"], "from_run": plan["run"],
                    "presets": plan["presets"], "workload": plan["workload"],
                    "disruptions": disruptor.counts, "ready_s": ready_s, "services": {}}  # fmt: skip
    problems += disruptor.failures
    for name, service in services.items():
        codes = _rpc_codes(service.metrics_url, name)
        busy, waited = _busy(service.metrics_url, BUSY_GAUGES[name]), time.monotonic()
        while any(busy.values()) and time.monotonic() - waited < IDLE_WITHIN_S:
            time.sleep(0.5)
            busy = _busy(service.metrics_url, BUSY_GAUGES[name])
        samples = footprints[name]
        steady = [sample for sample in samples if sample[0] >= samples[-1][0] / 3]
        rss_slope = slope_per_hour([(t, rss) for t, rss, _ in steady])
        rss_floor = floor_growth_per_hour([(t, rss) for t, rss, _ in steady])
        fd_slope = slope_per_hour([(t, fds) for t, _, fds in steady])
        fd_growth = steady[-1][2] - steady[0][2] if steady else 0
        report["services"][name] = {
            "rpc_codes": codes,
            "busy_after": busy,
            "idle_after_s": round(time.monotonic() - waited, 1),
            "rss_mib_start": samples[0][1] if samples else 0,
            "rss_mib_end": samples[-1][1] if samples else 0,
            "rss_mib_per_hour": round(rss_slope, 1),
            "rss_floor_mib_per_hour": round(rss_floor, 1),
            "fds_start": samples[0][2] if samples else 0,
            "fds_end": samples[-1][2] if samples else 0,
            "fd_growth_after_warmup": fd_growth,
            "fds_per_hour": round(fd_slope, 1),
            "samples_s_rss_mib_fds": [(round(t, 1), round(rss, 1), fds) for t, rss, fds in samples],
        }
        if unexpected := {code: count for code, count in codes.items() if code not in EXPECTED_CODES}:
            problems.append(f"{name}: unexpected status codes {unexpected}")
        if any(busy.values()):
            problems.append(f"{name}: busy after the load stopped: {busy}")
        if min(rss_slope, rss_floor) > args.max_rss_mb_per_h:
            problems.append(
                f"{name}: resident memory grows {rss_slope:.0f} MiB/h, its floor {rss_floor:.0f} MiB/h "
                f"(bound {args.max_rss_mb_per_h:g})"
            )
        if fd_growth > args.max_fd_growth:
            problems.append(f"{name}: {fd_growth} more open descriptors (bound {args.max_fd_growth})")
    report["sweep_errors"] = sweep_errors
    report["problems"] = problems
    (folder / "soak.json").write_text(json.dumps(report, indent=1))
    report["folder"] = str(folder)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=1800.0, help="load time (30 min)")
    parser.add_argument("--preset", default="", help="one preset for all three services (e.g. tiny)")
    parser.add_argument("--from-run", type=Path, default=None, help="a run folder whose knees set the levels")
    for target, what in (("asr", "ASR streams"), ("llm", "LLM streams"), ("tts", "TTS streams"), ("voice", "turns")):
        parser.add_argument(f"--{target}", type=int, default=None, help=f"{what} (default: ~70 %% of the knee)")
    parser.add_argument("--disrupt-every-s", type=float, default=10.0, help="a cancel and a disconnect this often")
    parser.add_argument("--max-rss-mb-per-h", type=float, default=50.0, help="bound on resident memory growth")
    parser.add_argument("--max-fd-growth", type=int, default=8, help="bound on open descriptors gained")
    parser.add_argument("--reports", type=Path, default=Path("reports"), help="folder the soak's folder goes in")
    parser.add_argument("--ready-timeout-s", type=float, default=READY_TIMEOUT_S,
                        help="bound on the three services' start-up (health SERVING), together")  # fmt: skip
    report = run_soak(parser.parse_args(argv))
    printed = json.loads(json.dumps(report))
    for service in printed["services"].values():
        del service["samples_s_rss_mib_fds"]  # kept in soak.json
    print(json.dumps(printed, indent=1))
    print("soak: PASS" if not report["problems"] else "soak: FAIL\n  " + "\n  ".join(report["problems"]))
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
