"""TTS: batched service vs worker-pool service vs VoxCPM direct, by concurrency, in one run.

`make bench-tts`. Same preset, weights, text and threads everywhere. At each concurrency C, C clients start
together (or spread over `--ramp-s`) and each makes `--requests` Synthesize calls back to back over a real gRPC
channel of its own (its own connection: a pod of `--frontends` spreads connections), the clients spread over
`--client-processes`; each level ends with the clients' self-check: how late their processes woke up while they
ran, and their CPU):

- batched service: `python -m services.tts --backend batched --max-batch <max C> --frontends <--frontends>`:
  one model, the requests share every patch step;
- pool service: `--backend pool --workers <--pool-workers>`: one request per worker process, the rest queue;
- VoxCPM direct: `VoxCPM2Model.generate_streaming` in this process, one request at a time (the package has
  no batching), so only C=1 is measured on its own; its throughput at C = pool workers is that many copies
  generating side by side in their own processes (what the pool does, minus the service);
- batched engine direct: the batched engine (`BatchedVoxCPM`) in this process, C requests prefilled and
  stepped together, no gRPC and no engine process: what the batched service can at best do.

Per level: first audio p50/p95 (client-side, from the call to its first chunk), RTF p50/p95 (a request's
wall time / its audio seconds), aggregate audio-seconds per second (all audio / the level's wall time) and, for
the services, sustained audio-seconds per second: the audio whose chunks arrived while every client was in the
middle of its requests (from the last client's first audio to the first client's last chunk), over that
window, which leaves out the level's start (every client joining at once) and its tail (clients finishing).
For the batched service, its own counters over the level: steps, requests per step, step time, model
FLOPs and bytes per step and per second — what bounds the step — and "1st at": the mean number of steps from a
segment's text reaching the engine to its first patch, its own step included (1: it joined at the next boundary; 2:
it also waited for the step in flight; more: it waited for a slot or a prefill pass), so first audio reads as steps;
"slot ms", the mean wait for a batch slot in the gRPC process, and "svc fa", the service's own mean first audio (from
a request's first text to its first audio leaving the service): client fa - svc fa is the way to and from the
client, svc fa - slot ms - 1st at x step roughly the engine's channel both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import threading
import time

import grpc

from services.tts.backends.voxcpm import WorkerSpec, segment_max_len
from services.tts.config import COMPILED_PARTS, TtsConfig
from voiceagent.serving.launcher import child_processes, proc_stat, running_service, scrape_samples, venv_python
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc

TEXT = "Streaming speech starts before the sentence ends."
SEED = 1

# Where the models run: set once from --device / --compile, used by every direct copy and every service.
PLACEMENT = {
    "device": "cpu",
    "compile": False,
    "cache_positions": 2048,
    "vae_dtype": "float32",
    "solver_attention": "default",
    "compile_parts": ",".join(COMPILED_PARTS),
    "prefill_graphs": True,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def sustained_rate(chunks: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Audio seconds per second of the `chunks` (arrival time, audio seconds) that arrived in [start, end]; None
    when the window is empty (a client finished before the last one heard its first audio)."""
    if end <= start:
        return None
    return sum(seconds for at, seconds in chunks if start <= at <= end) / (end - start)


class Level:
    """One path at one concurrency: per-request (first audio s, RTF, audio s) and the wall time; for a service
    level also every chunk's (arrival, audio s) and the window in which every client was busy."""

    def __init__(
        self,
        runs: list[tuple[float, float, float]],
        wall_s: float,
        chunks: list[tuple[float, float]] | None = None,
        window: tuple[float, float] | None = None,
        audio_s: float | None = None,
        client_lag_s: float = 0.0,
        client_cpu: float = 0.0,
    ):
        self.runs, self.wall_s, self.chunks, self.window = runs, wall_s, chunks, window
        self.audio_s = sum(r[2] for r in runs) if audio_s is None else audio_s  # all audio, for the aggregate
        self.client_lag_s = client_lag_s  # service levels: the clients' self-check (see client_check)
        self.client_cpu = client_cpu  # and the busiest client process's CPU (cores)

    def row(self, name: str, concurrency: int) -> str:
        first = [r[0] * 1000 for r in self.runs]
        rtf = [r[1] for r in self.runs]
        throughput = self.audio_s / self.wall_s
        sustained = sustained_rate(self.chunks, *self.window) if self.chunks is not None and self.window else None
        return (
            f"{concurrency:>5} {name:<22}{percentile(first, 50):>9.0f}{percentile(first, 95):>9.0f}"
            f"{percentile(rtf, 50):>8.3f}{percentile(rtf, 95):>8.3f}{throughput:>10.2f}"
            + (f"{sustained:>10.2f}" if sustained is not None else f"{'-':>10}")
        )


HEADER = (
    f"{'C':>5} {'path':<22}{'fa p50':>9}{'fa p95':>9}{'RTF p50':>8}{'RTF p95':>8}{'audio s/s':>10}{'sustained':>10}"
)


# -- direct ---------------------------------------------------------------------------------------------
def direct_runs(preset: str, threads: int, text: str):
    """A closure timing one direct streaming generation: (time to first audio, RTF, audio seconds)."""
    import torch

    from services.tts.backends.voxcpm import load_model

    spec = WorkerSpec.from_config(TtsConfig(preset=preset, threads_per_worker=threads, **PLACEMENT))
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
    results.put([run() for _ in range(requests)])


def direct_copies(preset: str, processes: int, threads: int, text: str, requests: int) -> Level:
    """`processes` VoxCPM copies generating side by side, `requests` each, no service in between."""
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
    runs = [run for _ in workers for run in results.get()]
    elapsed = time.perf_counter() - started
    for worker in workers:
        worker.join()
    return Level(runs, elapsed)


def batched_engine(preset: str, threads: int, max_batch: int, cache_positions: int):
    """A closure running C requests through the batched engine in this process, `requests` rounds."""
    import torch

    from services.tts.backends.batched_engine import EngineSpec, build_engine

    config = TtsConfig(preset=preset, threads_per_worker=threads, **PLACEMENT)
    # as the service builds it: the same speed-ups, warm-up and CUDA graphs per bucket
    spec = EngineSpec(
        WorkerSpec.from_config(config),
        max_batch,
        cache_positions,
        vae_dtype=config.vae_dtype,
        solver_attention=config.solver_attention,
        prefill_graphs=config.prefill_graphs,
        compile_parts=config.compiled_parts,
    )
    engine, _, _ = build_engine(spec)
    tokens = engine.text_tokens(TEXT)
    limit = engine.patch_limit(len(tokens), segment_max_len(spec.model, TEXT))
    rate = engine.model.sample_rate

    def run(concurrency: int, requests: int) -> Level:
        runs = []
        started = time.perf_counter()
        for _ in range(requests):
            begun = time.perf_counter()
            generators = [torch.Generator().manual_seed(SEED) for _ in range(concurrency)]
            engine.prefill(list(range(concurrency)), [tokens] * concurrency)
            first, samples = None, 0
            for _ in range(limit):
                noise = torch.stack([engine.noise(g) for g in generators])
                audio, _ = engine.step(list(range(concurrency)), [10] * concurrency, [2.0] * concurrency, noise)
                first = first if first is not None else time.perf_counter() - begun
                samples += audio.shape[1]
            seconds = samples / rate
            runs += [(first, (time.perf_counter() - begun) / seconds, seconds)] * concurrency
        return Level(runs, time.perf_counter() - started)

    run(1, 1)
    run(max_batch, 1)  # warm-up at both ends
    return run


# -- services -------------------------------------------------------------------------------------------
def service_run(stub, text: str, chunks: list | None = None) -> tuple[float, float, float]:
    """(time to first audio, RTF, audio seconds) of one Synthesize call as the client sees it; each chunk's
    (arrival time, audio seconds) is appended to `chunks` if given."""
    started = time.perf_counter()
    first, seconds = None, 0.0
    for chunk in stub.Synthesize(tts_pb2.SynthesizeRequest(text=text, config=tts_pb2.SynthesisConfig(seed=SEED))):
        now = time.perf_counter()
        first = first if first is not None else now - started
        seconds += chunk.duration_s
        if chunks is not None:
            chunks.append((now, chunk.duration_s))
    return first, (time.perf_counter() - started) / seconds, seconds


def service_args(
    preset: str, backend: str, threads: int, workers: int, max_batch: int, frontends: int = 1
) -> list[str]:
    return ["--frontends", str(frontends)] * (frontends > 1) + [
        "--preset", preset, "--backend", backend, "--workers", str(workers), "--max-batch", str(max_batch),
        "--cache-positions", str(PLACEMENT["cache_positions"]),
        "--threads-per-worker", str(threads), "--max-queue", str(4 * max_batch), "--probe-ceilings", "false",
        "--device", PLACEMENT["device"], "--compile", str(PLACEMENT["compile"]).lower(),
        "--vae-dtype", PLACEMENT["vae_dtype"], "--solver-attention", PLACEMENT["solver_attention"],
        "--compile-parts", PLACEMENT["compile_parts"], "--prefill-graphs", str(PLACEMENT["prefill_graphs"]).lower(),
    ]  # fmt: skip


def _client_group(
    address: str, indices: list[int], concurrency: int, requests: int, ramp_s: float, barrier=None
) -> tuple:
    """Clients `indices` of `concurrency`, one thread and one channel each (see `service_level`).
    Returns (runs, chunks, spans, (start, end), lag p99 s): lag is how late a 5 ms sleep of this process woke up while
    its clients ran, the self-check that the client process kept up."""
    runs: list[tuple[float, float, float]] = []
    chunks: list[tuple[float, float]] = []
    spans: list[tuple[float, float]] = []  # per client: its first audio, its last chunk
    lags: list[float] = []
    with contextlib.ExitStack() as stack:
        stubs = {}
        for index in indices:  # a local subchannel pool: its own connection (gRPC shares one between channels)
            channel = stack.enter_context(
                grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            )
            grpc.channel_ready_future(channel).result(timeout=60)
            stubs[index] = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        if barrier is not None:
            barrier.wait()  # every client process is connected
        released = time.perf_counter()  # perf_counter is CLOCK_MONOTONIC: one clock for every process here
        cpu_from = time.process_time()  # this process's CPU, every thread: the clients' own cost
        steady_from = released + ramp_s * (concurrency - 1) / concurrency  # when the last client starts
        running = threading.Event()

        def client(index: int) -> None:
            mine: list[tuple[float, float]] = []
            time.sleep(max(0.0, released + ramp_s * index / concurrency - time.perf_counter()))
            for _ in range(requests):
                begun = time.perf_counter()
                run = service_run(stubs[index], TEXT, mine)
                if begun >= steady_from or not ramp_s:
                    runs.append(run)
            chunks.extend(mine)
            spans.append((mine[0][0], mine[-1][0]))

        def watch() -> None:
            while not running.is_set():
                before = time.perf_counter()
                time.sleep(0.005)
                lags.append(time.perf_counter() - before - 0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        clients = [threading.Thread(target=client, args=(i,)) for i in indices]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        running.set()
        watcher.join()
    ended = time.perf_counter()
    cpu = (time.process_time() - cpu_from) / max(ended - released, 1e-9)
    return runs, chunks, spans, (released, ended), percentile(lags or [0.0], 99), cpu


def _client_process(address, indices, concurrency, requests, ramp_s, barrier, results) -> None:
    results.put(_client_group(address, indices, concurrency, requests, ramp_s, barrier))


def service_level(address: str, concurrency: int, requests: int, ramp_s: float = 0.0, processes: int = 1) -> Level:
    """C clients making `requests` calls each, back to back, each on a channel (connection) of its own, spread over
    `processes` client processes (1: threads of this process). With `ramp_s`, client i starts i/C of it after the
    first, so their requests do not all start (and end) together; the first-audio and RTF percentiles then count
    only the requests started once every client had started (the steady state), the aggregate counts all."""
    processes = max(1, min(processes, concurrency))
    groups = [list(range(concurrency))[i::processes] for i in range(processes)]
    if processes == 1:
        parts = [_client_group(address, groups[0], concurrency, requests, ramp_s)]
    else:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(processes), context.Queue()
        workers = [
            context.Process(
                target=_client_process, args=(address, group, concurrency, requests, ramp_s, barrier, results)
            )
            for group in groups
        ]
        for worker in workers:
            worker.start()
        parts = [results.get() for _ in workers]
        for worker in workers:
            worker.join()
    runs = [run for part in parts for run in part[0]]
    chunks = [chunk for part in parts for chunk in part[1]]
    spans = [span for part in parts for span in part[2]]
    started, ended = min(part[3][0] for part in parts), max(part[3][1] for part in parts)
    window = (max(first for first, _ in spans), min(last for _, last in spans))
    audio_s = sum(seconds for _, seconds in chunks)
    lag, cpu = max(part[4] for part in parts), max(part[5] for part in parts)
    return Level(runs, ended - started, chunks, window, audio_s, lag, cpu)


def client_check(level: Level, concurrency: int, processes: int) -> str:
    """The clients' self-check line of a level: the worst client process's p99 wake-up lag, and the busiest one's CPU
    (a Python client process near one core is its GIL's limit, whatever its lag)."""
    lag_ms = 1000 * level.client_lag_s
    kept_up = lag_ms < 10 and level.client_cpu < 0.8
    verdict = "the clients kept up" if kept_up else "the clients may be the limit: use more --client-processes"
    spread = f"{concurrency:>5} clients in {min(processes, concurrency)} process(es)"
    return f"{spread}: wake-up lag p99 {lag_ms:.1f} ms, CPU {level.client_cpu:.2f} cores at most, {verdict}"


def counters(url: str) -> dict[str, float]:
    wanted = (
        "voiceagent_tts_step_requests_sum", "voiceagent_tts_step_requests_count",
        "voiceagent_tts_step_seconds_sum", "voiceagent_tts_prefill_seconds_sum",
        "voiceagent_tts_hidden_prefill_seconds_sum",
        "voiceagent_tts_step_launch_seconds_sum", "voiceagent_tts_step_pass_wait_seconds_sum",
        "voiceagent_tts_first_patch_steps_sum", "voiceagent_tts_first_patch_steps_count",
        "voiceagent_tts_model_flops_total", "voiceagent_tts_model_read_bytes_total",
        "voiceagent_tts_queue_seconds_sum", "voiceagent_tts_queue_seconds_count",
        "voiceagent_tts_time_to_first_audio_seconds_sum", "voiceagent_tts_time_to_first_audio_seconds_count",
    )  # fmt: skip
    found = dict.fromkeys(wanted, 0.0)
    for sample in scrape_samples(url):
        if sample.name in wanted:
            found[sample.name] += sample.value  # summed over labels (first audio is counted per RPC method)
    return found


class CounterTrace:
    """The service's counters sampled every `every_s` while a level runs (a thread of this process; perf_counter is
    CLOCK_MONOTONIC, the clients' clock too), so they can be read over the level's steady window alone: the level's
    totals average in its ramp and its tail, whose steps carry fewer rows and run faster."""

    def __init__(self, url: str, every_s: float = 0.25):
        self.url, self.every_s = url, every_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.samples.append((time.perf_counter(), counters(self.url)))
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> CounterTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter(), counters(self.url)))  # one after the level: the trace spans it

    def between(self, start: float, end: float) -> tuple[float, dict[str, float], dict[str, float]] | None:
        """(seconds, counters at the first sample inside [start, end], at the last one), or None with fewer than two
        samples inside."""
        inside = [(at, found) for at, found in self.samples if start <= at <= end]
        if len(inside) < 2:
            return None
        return inside[-1][0] - inside[0][0], inside[0][1], inside[-1][1]


def step_counters(before: dict[str, float], after: dict[str, float], concurrency: int) -> str:
    grew = {name: after[name] - before[name] for name in after}
    steps = grew["voiceagent_tts_step_requests_count"] or 1
    step_s = grew["voiceagent_tts_step_seconds_sum"]
    flops, read = grew["voiceagent_tts_model_flops_total"], grew["voiceagent_tts_model_read_bytes_total"]
    firsts = grew["voiceagent_tts_first_patch_steps_count"] or 1
    waits = grew["voiceagent_tts_queue_seconds_count"] or 1
    heard = grew["voiceagent_tts_time_to_first_audio_seconds_count"] or 1
    return (
        f"{concurrency:>5} {steps:>6.0f}{grew['voiceagent_tts_step_requests_sum'] / steps:>9.1f}"
        f"{1000 * step_s / steps:>9.1f}{1000 * grew['voiceagent_tts_prefill_seconds_sum'] / steps:>11.2f}"
        f"{1000 * grew['voiceagent_tts_hidden_prefill_seconds_sum'] / steps:>10.2f}"
        f"{grew['voiceagent_tts_first_patch_steps_sum'] / firsts:>8.2f}"
        f"{1000 * grew['voiceagent_tts_queue_seconds_sum'] / waits:>9.1f}"
        f"{1000 * grew['voiceagent_tts_time_to_first_audio_seconds_sum'] / heard:>9.1f}"
        f"{flops / steps / 1e9:>11.3f}{read / steps / 1e6:>10.1f}"
        f"{flops / max(step_s, 1e-9) / 1e9:>11.2f}{read / max(step_s, 1e-9) / 1e9:>10.2f}"
    )


def grpc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the service's gRPC process(es): the service process itself (its engine is a child
    process of its own) or, with `--frontends`, its front-end processes (the supervisor only watches)."""
    total = 0.0
    for each in (pid, *child_processes(pid, lambda command: command.startswith(b"tts-frontend-"))):
        fields = proc_stat(each)
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def delivery(
    level: Level,
    before: dict[str, float],
    after: dict[str, float],
    concurrency: int,
    patch_s: float,
    cpu_s: float,
    steady: tuple[float, dict[str, float], dict[str, float]] | None = None,
) -> str:
    """How fast a request's audio reached its client against how fast the engine stepped: the engine advances every
    running request by one patch per step, so a client's patches should come one step apart. Per steady-state
    request, (wall - first audio) / (patches - 1); and the gRPC processes' CPU (`cpu_s` over the level, in cores),
    which every patch goes through on its way out (session 24: at C=256 a request's cycle was ~27 steps for 20
    patches). The level's wall over its steps averages in the ramp and the tail (fewer rows, faster steps); `steady`
    (CounterTrace.between over the level's window) gives the steady state's ms between steps, rows per step and ms
    per step (launch to done), the step interval a client's patches are to be read against (session 26: 97.7 ms over
    the level, while the clients heard a patch every 127.6 ms), and of the step's ms its launch's host time and its
    wait for a prefill pass beside it once the device was done (on a GPU the rest is the device's; on a CPU the step
    is done at launch)."""
    steps = (after["voiceagent_tts_step_requests_count"] - before["voiceagent_tts_step_requests_count"]) or 1
    cpu = cpu_s / level.wall_s
    per_patch = [
        1000 * (rtf * seconds - first) / (patches - 1)
        for first, rtf, seconds in level.runs
        if (patches := round(seconds / patch_s)) > 1
    ]
    spread = f"{percentile(per_patch, 50):>12.1f}{percentile(per_patch, 95):>12.1f}" if per_patch else f"{'-':>24}"
    line = f"{concurrency:>5}{1000 * level.wall_s / steps:>12.1f}{spread}{cpu:>12.2f}"
    stepped = 0.0
    if steady is not None:
        seconds, first, last = steady
        stepped = last["voiceagent_tts_step_requests_count"] - first["voiceagent_tts_step_requests_count"]
    if not stepped:
        return line + f"{'-':>14}{'-':>8}{'-':>9}{'-':>10}{'-':>11}"

    def per_step(name: str) -> float:
        return (last[name] - first[name]) / stepped

    rows = per_step("voiceagent_tts_step_requests_sum")
    step_ms = 1000 * per_step("voiceagent_tts_step_seconds_sum")
    launch_ms = 1000 * per_step("voiceagent_tts_step_launch_seconds_sum")
    wait_ms = 1000 * per_step("voiceagent_tts_step_pass_wait_seconds_sum")
    return line + f"{1000 * seconds / stepped:>14.1f}{rows:>8.1f}{step_ms:>9.1f}{launch_ms:>10.2f}{wait_ms:>11.2f}"


DELIVERY_HEADER = (
    f"{'C':>5}{'step every':>12}{'patch p50':>12}{'patch p95':>12}{'gRPC CPU':>12}"
    f"{'steady every':>14}{'rows':>8}{'step ms':>9}{'launch ms':>10}{'pass wait':>11}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per model process and for direct runs")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="levels C")
    parser.add_argument("--requests", type=int, default=2, help="requests per client per level")
    parser.add_argument("--pool-workers", type=int, default=2, help="worker processes of the pool service")
    parser.add_argument(
        "--batched-threads",
        type=int,
        default=0,
        help="torch threads of the batched engine (default: pool workers x threads, the same cores)",
    )
    parser.add_argument(
        "--ramp-s",
        type=float,
        default=0.0,
        help="services: clients start spread over this many seconds (0: together); percentiles then count the "
        "requests started after the ramp",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="services: client processes the C clients are spread over (1: threads here)",
    )
    parser.add_argument(
        "--frontends", type=int, default=1, help="batched service: gRPC front-end processes on its one engine"
    )
    parser.add_argument("--rounds", type=int, default=5, help="direct runs at C=1")
    parser.add_argument("--skip", default="", help="paths to leave out: pool,direct,engine")
    parser.add_argument("--device", default="cpu", help="torch device of every model (cuda on a GPU)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="CUDA: pool and direct: VoxCPM's torch.compile + CUDA graphs; batched: the LocDiT solve and VAE compiled",
    )
    parser.add_argument("--cache-positions", type=int, default=2048, help="batched: cache positions per slot")
    parser.add_argument("--vae-dtype", default="float32", help="batched: the audio VAE's dtype (float32, bfloat16)")
    parser.add_argument("--solver-attention", default="default", help="batched, compiled: the LocDiT's attention")
    parser.add_argument(
        "--compile-parts", default=",".join(COMPILED_PARTS), help="batched, compiled: the step's parts (solver,vae,...)"
    )
    parser.add_argument(
        "--prefill-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batched, CUDA: prefill graphs per bucket (--no-prefill-graphs: eager prefill passes)",
    )
    args = parser.parse_args()
    if args.ramp_s and args.requests < 2:
        parser.error("--ramp-s needs --requests >= 2: percentiles count the requests started after the ramp")
    PLACEMENT.update(
        device=args.device,
        compile=args.compile,
        cache_positions=args.cache_positions,
        vae_dtype=args.vae_dtype,
        solver_attention=args.solver_attention,
        compile_parts=args.compile_parts,
        prefill_graphs=args.prefill_graphs,
    )
    levels = [int(c) for c in args.concurrency.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    top = max(levels)
    batched_threads = args.batched_threads or args.pool_workers * args.threads

    print(
        f"preset {args.preset} on {args.device}{f' compiled ({args.compile_parts})' if args.compile else ''} "
        f"(solver attention {args.solver_attention}), VAE {args.vae_dtype}, "
        f"{args.threads} torch "
        f"thread(s) per model process, text {len(TEXT)} chars, seed {SEED}, {args.requests} requests per client"
        f"{f' (clients ramped over {args.ramp_s:g} s)' if args.ramp_s else ''}; "
        f"pool: {args.pool_workers} workers; batched: max_batch {top}, "
        f"{batched_threads} torch threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    rows: dict[int, list[str]] = {c: [] for c in levels}
    steps: list[str] = []
    deliveries: list[str] = []  # per level: the clients' ms per patch against the engine's step interval
    checks: list[str] = []  # the clients' self-check per service level
    python = venv_python("tts")
    with (
        running_service(
            "services.tts", python, service_args(args.preset, "batched", batched_threads, 1, top, args.frontends)
        ) as service,
        grpc.insecure_channel(service.address) as channel,
    ):
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        service_run(stub, TEXT)  # connection and first-request warm-up
        shape = stub.GetInfo(common_pb2.InfoRequest()).model.shape
        print(
            f"batched service: {shape['graph_buckets']:.0f} CUDA graphs captured at start-up in "
            f"{shape['graph_capture_s']:.1f} s, {shape['cache_positions']:.0f} cache positions per slot",
            flush=True,
        )
        patch_s = shape["patch_ms"] / 1000
        for concurrency in levels:
            before, cpu = counters(service.metrics_url), grpc_cpu_s(service.proc.pid)
            with CounterTrace(service.metrics_url) as trace:
                level = service_level(service.address, concurrency, args.requests, args.ramp_s, args.client_processes)
            rows[concurrency].append(level.row("batched service", concurrency))
            after, cpu = counters(service.metrics_url), grpc_cpu_s(service.proc.pid) - cpu
            steps.append(step_counters(before, after, concurrency))
            steady = trace.between(*level.window) if level.window else None
            deliveries.append(delivery(level, before, after, concurrency, patch_s, cpu, steady))
            checks.append(client_check(level, concurrency, args.client_processes))
            print(rows[concurrency][-1], flush=True)
    if "direct" not in skip:
        direct = direct_runs(args.preset, args.threads, TEXT)
        runs = []
        started = time.perf_counter()
        for _ in range(args.rounds):
            runs.append(direct())
        if 1 in rows:
            rows[1].append(Level(runs, time.perf_counter() - started).row("VoxCPM direct", 1))
        if args.pool_workers in rows and args.pool_workers > 1:
            copies = direct_copies(args.preset, args.pool_workers, args.threads, TEXT, args.requests)
            rows[args.pool_workers].append(copies.row(f"VoxCPM direct x{args.pool_workers}", args.pool_workers))
    if "engine" not in skip:
        engine = batched_engine(args.preset, batched_threads, top, args.cache_positions)
        for concurrency in levels:
            rows[concurrency].append(engine(concurrency, args.requests).row("batched engine direct", concurrency))
    if "pool" not in skip:
        with (
            running_service(
                "services.tts", python, service_args(args.preset, "pool", args.threads, args.pool_workers, top)
            ) as service,
            grpc.insecure_channel(service.address) as channel,
        ):
            stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
            service_run(stub, TEXT)
            for concurrency in levels:
                level = service_level(service.address, concurrency, args.requests, args.ramp_s, args.client_processes)
                rows[concurrency].append(level.row(f"pool service x{args.pool_workers}", concurrency))
                checks.append(client_check(level, concurrency, args.client_processes))
                print(rows[concurrency][-1], flush=True)

    print(
        "\nfa = first audio (ms), RTF = request wall time / audio seconds, audio s/s = aggregate, sustained = "
        "audio s/s while every client was busy (see the module docstring)"
    )
    print(HEADER)
    for concurrency in levels:
        print("\n".join(rows[concurrency]))
    print("\nbatched service, its own counters per level (model-derived FLOPs and bytes, see PatchWork.per_step)")
    print(
        f"{'C':>5} {'steps':>6}{'req/step':>9}{'step ms':>9}{'prefill ms':>11}{'hidden ms':>10}{'1st at':>8}"
        f"{'slot ms':>9}{'svc fa':>9}{'GFLOP/step':>11}{'MB/step':>10}{'GFLOP/s':>11}{'GB/s':>10}"
    )
    print("\n".join(steps))
    print(
        "\nbatched service, delivery per level: ms between steps (level wall / steps), ms per patch as a client heard"
        " its request (steady state), the gRPC processes' CPU (cores); then, while every client was busy (the"
        " service's counters sampled every 0.25 s), ms between steps, rows per step and ms per step (launch to done)"
    )
    print(DELIVERY_HEADER)
    print("\n".join(deliveries))
    print("\nclients' self-check per service level (batched, then pool)")
    print("\n".join(checks))
    print(f"load average now {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    medians = {}
    for concurrency in levels:
        for row in rows[concurrency]:
            if "batched service" in row:
                medians[concurrency] = float(row.split()[-2])  # the aggregate, as this ratio always was
    if 1 in medians and 8 in medians:
        print(f"batched service throughput C=8 / C=1: {medians[8] / medians[1]:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
