"""A concurrency sweep: for each level, Locust runs `concurrency` closed-loop users against the target.

Per level: spawn the users, warm up, open the measuring window (scrape the service's counters), run for a fixed
duration or request count, close the gate and let in-flight requests finish (scrape again), then judge whether
the level saturated the service (errors, or the objective latency's p95 past the objective) and stop if so.
With `workers`, Locust's master runs here and the users run in worker processes (one process tops out at about
one core); workers forward every record to the master as a Locust message.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gevent
import psutil
from locust.env import Environment

from loadgen import scrape
from loadgen.levels import PRIMARY_LATENCY, level_result
from loadgen.results import LevelResult, RequestRecord, ServerCounters, ServiceFacts
from loadgen.users import USERS, LoadContext
from loadgen.workload import Workload

# gRPC services each target's counters come from (the voice turn loads all three; the peer exports none of ours).
SERVICES = {"asr": ("asr",), "llm": ("llm",), "tts": ("tts",), "voice": ("asr", "llm", "tts"), "openai": ()}
DEFAULT_OBJECTIVE_S = {"llm": 2.0, "openai": 2.0, "asr": 1.0, "tts": 2.0, "voice": 3.0}
# One Python process tops out near one core; past this share of it, the generator may be what limits the level.
LOADGEN_CPU_WARNING = 0.8
# Closed-loop users each keep one request in flight: fewer in flight on average than this share of the offered
# concurrency means the generator, not the service, held them back (or requests failed fast).
ACHIEVED_WARNING = 0.8
# A metrics endpoint that has not answered in this long is recorded as not scraped for the level.
SCRAPE_TIMEOUT_S = 10.0


@dataclasses.dataclass
class SweepPlan:
    target: str
    concurrency: list[int]
    duration_s: float | None = 20.0  # per level, after warm-up; None when `requests` sets the level's length
    requests: int | None = None
    warmup_s: float = 3.0
    objective_s: float | None = None  # p95 of the target's primary latency; None = DEFAULT_OBJECTIVE_S
    max_error_rate: float = 0.05
    stop_early: bool = True  # False: run every level whatever its errors and latency (side-by-side runs)
    stop_past_realtime: bool = False  # also stop after the first level whose streams fell behind real time
    workers: int = 0  # 0: users run in this process; N: a Locust master here and N local worker processes
    drain_timeout_s: float = 60.0
    level_timeout_s: float = 300.0

    @property
    def objective(self) -> float:
        return self.objective_s if self.objective_s is not None else DEFAULT_OBJECTIVE_S[self.target]


@dataclasses.dataclass
class Sweep:
    target: str
    facts: ServiceFacts
    levels: list[LevelResult]
    warnings: list[str]
    plan: SweepPlan
    workload: Workload


class RecordSink:
    """Collects records on the master (stamped with the current level) for aggregation and requests.jsonl."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[RequestRecord] = []
        self.concurrency = 0

    def __call__(self, record: RequestRecord) -> None:
        record.concurrency = self.concurrency
        self.records.append(record)

    def take(self, started_from: float, started_until: float) -> list[RequestRecord]:
        """The level's measured records (sent inside the window); the rest (warm-up) are dropped."""
        measured = [record for record in self.records if started_from <= record.started_s <= started_until]
        self.records = []
        with self.path.open("a", encoding="utf-8") as jsonl:
            for record in measured:
                jsonl.write(json.dumps(dataclasses.asdict(record)) + "\n")
        return measured


def target_facts(target: str, workload: Workload) -> ServiceFacts:
    endpoints = workload.endpoints
    if target == "openai":
        try:  # the peer serves the same preset as our LLM service; its facts are the model's facts
            return dataclasses.replace(
                scrape.service_facts("llm", endpoints.llm, tls=endpoints.tls), service="openai", backend="peer"
            )
        except Exception:  # noqa: BLE001 — the peer can be measured without our service running
            return ServiceFacts("openai", "peer", "", "", "", "", 0, 0, 0.0, 0.0)
    parts = [
        scrape.service_facts(service, getattr(endpoints, service), tls=endpoints.tls) for service in SERVICES[target]
    ]
    return parts[0] if len(parts) == 1 else scrape.combined_facts(target, parts)


class _Cpu:
    """CPU seconds of this process and its Locust workers (not the services a session started), and of the
    whole machine, between two reads."""

    def __init__(self, workers: list[subprocess.Popen]):
        self.processes = [psutil.Process(), *(psutil.Process(worker.pid) for worker in workers)]
        self.read()

    def _each_s(self) -> list[float]:
        times = []
        for process in self.processes:
            try:
                cpu = process.cpu_times()
                times.append(cpu.user + cpu.system)
            except psutil.Error:
                times.append(0.0)
        return times

    def read(self) -> tuple[float, float]:
        """(load-generator cores, machine busy cores) since the previous read; `busiest` is then the cores of
        the busiest load-generator process (the one that would limit a level first)."""
        now, each, machine = time.monotonic(), self._each_s(), psutil.cpu_times()
        loadgen_s = sum(each)
        machine_s = machine.user + machine.system + getattr(machine, "nice", 0.0)
        result = (0.0, 0.0)
        self.busiest = 0.0
        if hasattr(self, "_last"):
            wall = now - self._last[0]
            result = ((loadgen_s - self._last[1]) / wall, (machine_s - self._last[2]) / wall)
            self.busiest = max((b - a for a, b in zip(self._last[3], each, strict=False)), default=0.0) / wall
        self._last = (now, loadgen_s, machine_s, each)
        return result


class _Runner:
    """Locust's runner, local or master + worker processes, behind the three things a level needs."""

    def __init__(self, plan: SweepPlan, workload: Workload, sink: RecordSink, connect_timeout_s: float = 60):
        self.environment = Environment(user_classes=[USERS[plan.target]])
        self.workers: list[subprocess.Popen] = []
        self.drained = 0
        if not plan.workers:
            self.context = LoadContext(workload, sink)
            self.environment.loadgen = self.context
            self.runner = self.environment.create_local_runner()
            return
        port = free_port()
        self.runner = self.environment.create_master_runner("127.0.0.1", port)
        self.runner.register_message("loadgen_record", lambda msg, **_: sink(RequestRecord(**msg.data)))
        self.runner.register_message("loadgen_drained", lambda msg, **_: self._worker_drained())
        command = [sys.executable, "-m", "loadgen", "worker", "--master-port", str(port), "--target", plan.target]
        env = {**os.environ, "LOADGEN_WORKLOAD": workload.to_json()}
        self.workers = [subprocess.Popen(command, env=env) for _ in range(plan.workers)]
        deadline = time.monotonic() + connect_timeout_s
        while len(self.runner.clients.ready) < plan.workers:
            if time.monotonic() > deadline:
                # Stop them all before failing: a connected worker left behind would outlive the sweep (and
                # hold its caller's output pipes) until its own 60 s heartbeat timeout; a hung one, for ever.
                states = [
                    f"pid {w.pid} " + ("running" if w.poll() is None else f"exited {w.returncode}")
                    for w in self.workers
                ]
                connected = len(self.runner.clients.ready)
                self.runner.quit()
                self._stop_workers(timeout_s=5)
                raise TimeoutError(
                    f"{connected} of {plan.workers} Locust workers connected in {connect_timeout_s:g} s "
                    f"({', '.join(states)})"
                )
            gevent.sleep(0.2)

    def _worker_drained(self) -> None:
        self.drained += 1

    def start(self, users: int, timeout_s: float = 60) -> None:
        self.runner.start(users, spawn_rate=max(users, 1))
        deadline = time.monotonic() + timeout_s
        while self.runner.state != "running" and time.monotonic() < deadline:
            gevent.sleep(0.1)
        if self.workers:
            self.runner.send_message("loadgen_gate", {"accepting": True})
        else:
            self.context.accepting = True

    def drain(self, timeout_s: float) -> None:
        if not self.workers:
            self.context.drain(timeout_s)
        else:
            self.drained = 0
            self.runner.send_message("loadgen_gate", {"accepting": False, "drain_timeout_s": timeout_s})
            deadline = time.monotonic() + timeout_s + 5
            while self.drained < len(self.workers) and time.monotonic() < deadline:
                gevent.sleep(0.05)
        self.runner.stop()

    def close(self) -> None:
        self.runner.quit()
        self._stop_workers(timeout_s=10)
        if not self.workers:
            self.context.close()

    def _stop_workers(self, timeout_s: float) -> None:
        """Wait for the workers to quit (the master told them to), killing any still there after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            try:
                worker.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape_all(target: str, workload: Workload) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Every metrics endpoint of the target: (samples by service, why each endpoint that failed did). A replica
    saturated on its CPU share may not answer within the timeout: its counters go missing, the sweep goes on."""
    samples, failed = {}, {}
    for service in SERVICES[target]:
        url = workload.endpoints.metrics_url(service)
        try:
            samples[service] = scrape.scrape(url, SCRAPE_TIMEOUT_S)
        except (OSError, ValueError) as error:  # timeouts, refused connections, HTTP errors, unparsable text
            failed[service] = f"{url}: {type(error).__name__}: {error}"
    return samples, failed


def _server_counters(target: str, before, after, duration_s: float) -> ServerCounters:
    """Counter rates of the services scraped both before and after the level (none where a scrape failed)."""
    parts = {
        service: scrape.counters(service, before[service], after[service], duration_s)
        for service in before
        if service in after
    }
    if len(parts) == 1:
        return next(iter(parts.values()))
    return scrape.sum_counters(parts) if parts else ServerCounters()


def saturated(level: LevelResult, plan: SweepPlan) -> str:
    """Why this level saturated the target (the sweep stops after it), or ""."""
    total = level.requests + level.errors
    if not level.requests:
        return "no request succeeded"
    if total and level.errors / total > plan.max_error_rate:
        return f"{level.errors} of {total} requests failed (> {plan.max_error_rate:.0%})"
    primary = PRIMARY_LATENCY[plan.target]
    if primary in level.latency and level.latency[primary].p95 > plan.objective:
        return f"{primary} p95 {level.latency[primary].p95:.3f} s > objective {plan.objective:.3f} s"
    if plan.stop_past_realtime and level.realtime_ok is False:
        return "streams fell behind real time"
    return ""


def run_sweep(plan: SweepPlan, workload: Workload, out_dir: Path, progress: Callable[[str], None] = print) -> Sweep:
    facts = target_facts(plan.target, workload)
    if not workload.vocab_size:
        vocab = facts.shape.get("vocab_size") or facts.shape.get("llm.vocab_size") or 0
        workload = dataclasses.replace(workload, vocab_size=int(vocab))
    sink = RecordSink(out_dir / "requests.jsonl")
    runner = _Runner(plan, workload, sink)
    cpu = _Cpu(runner.workers)
    levels: list[LevelResult] = []
    warnings: list[str] = []
    if facts.peak_flops_per_s and not facts.ceilings_quiet:
        warnings.append(
            f"{facts.service}'s device ceilings were measured under load ({facts.ceilings_background_cores:.2f} CPU "
            "cores busy elsewhere during its probe): they are too low, so utilisations and verdicts are inflated"
        )
    try:
        for concurrency in plan.concurrency:
            sink.concurrency = concurrency
            progress(f"{plan.target}: concurrency {concurrency}: warming up {plan.warmup_s:g} s")
            runner.start(concurrency)
            gevent.sleep(plan.warmup_s)
            before, scrape_failed = _scrape_all(plan.target, workload)
            window_start = time.time()
            cpu.read()
            _measure(plan, sink, window_start)
            window_end = time.time()
            runner.drain(plan.drain_timeout_s)
            duration_s = time.time() - window_start
            loadgen_cpu, machine_cpu = cpu.read()
            after, failed_after = _scrape_all(plan.target, workload)
            scrape_failed.update(failed_after)
            server = _server_counters(plan.target, before, after, duration_s)
            measured = sink.take(window_start, window_end)
            level = level_result(plan.target, concurrency, measured, duration_s, server, loadgen_cpu)
            # Little's law over the window: requests started per second × their mean time in flight.
            window_s = max(window_end - window_start, 1e-9)
            level.extra["achieved_concurrency"] = sum(record.latency_s for record in measured) / window_s
            level.extra.update(machine_cpu_cores=machine_cpu, loadgen_processes=float(1 + plan.workers),
                               loadgen_busiest_process_cores=cpu.busiest)  # fmt: skip
            if scrape_failed:
                level.extra["metrics_scrape_failures"] = float(len(scrape_failed))
                warnings += [
                    f"concurrency {concurrency}: {service}'s metrics were not scraped ({why}): its server counters "
                    "are missing at this level"
                    for service, why in scrape_failed.items()
                ]
                progress(f"{plan.target}: concurrency {concurrency}: not scraped: {'; '.join(scrape_failed.values())}")
            warnings += _self_check(level, plan)
            level.stopped_early = saturated(level, plan) if plan.stop_early else ""
            levels.append(level)
            progress(_progress_line(plan.target, level))
            if level.stopped_early:
                progress(f"{plan.target}: stopping after concurrency {concurrency}: {level.stopped_early}")
                break
    finally:
        runner.close()
    return Sweep(plan.target, facts, levels, warnings, plan, workload)


def _measure(plan: SweepPlan, sink: RecordSink, window_start: float) -> None:
    if plan.requests is None:
        gevent.sleep(plan.duration_s or 0)
        return
    deadline = time.monotonic() + plan.level_timeout_s
    while time.monotonic() < deadline:
        if sum(record.started_s >= window_start for record in sink.records) >= plan.requests:
            return
        gevent.sleep(0.05)


def _self_check(level: LevelResult, plan: SweepPlan) -> list[str]:
    """Warnings when the load generator itself may have limited the level."""
    warnings = []
    processes = 1 + plan.workers
    per_process = max(level.loadgen_cpu / processes, level.extra.get("loadgen_busiest_process_cores", 0.0))
    if per_process > LOADGEN_CPU_WARNING:
        warnings.append(
            f"concurrency {level.concurrency}: the load generator used {level.loadgen_cpu:.2f} cores over "
            f"{processes} process(es) (the busiest {per_process:.0%} of a core); it may be the bottleneck — add "
            "--workers"
        )
    achieved = level.extra.get("achieved_concurrency")
    # Judged only where each user completed two requests or more: with fewer, the window's edges dominate.
    if (
        achieved is not None
        and level.requests >= 2 * level.concurrency
        and achieved < ACHIEVED_WARNING * level.concurrency
    ):
        warnings.append(
            f"concurrency {level.concurrency}: only {achieved:.1f} requests were in flight on average "
            f"({achieved / level.concurrency:.0%} of the offered {level.concurrency}): the generator did not keep "
            "its users busy"
        )
    cores = psutil.cpu_count() or 1
    machine = level.extra.get("machine_cpu_cores", 0.0)
    if machine > 0.9 * cores and level.loadgen_cpu > 0.25 * cores:
        warnings.append(
            f"concurrency {level.concurrency}: the machine was {machine / cores:.0%} busy and the load generator "
            f"took {level.loadgen_cpu:.2f} of its {cores} cores: it competes with the service it measures"
        )
    return warnings


def _progress_line(target: str, level: LevelResult) -> str:
    primary = PRIMARY_LATENCY[target]
    latency = level.latency.get(primary)
    realtime = "" if level.realtime_ok is None else f", real time {'yes' if level.realtime_ok else 'NO'}"
    return (
        f"{target}: concurrency {level.concurrency}: {level.requests} ok, {level.errors} errors, "
        f"{level.throughput:.1f} {level.throughput_unit}, {primary} p50 {latency.p50 * 1000 if latency else 0:.0f} ms "
        f"p95 {latency.p95 * 1000 if latency else 0:.0f} ms{realtime}, load generator {level.loadgen_cpu:.2f} cores"
    )
