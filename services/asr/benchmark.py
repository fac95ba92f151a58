"""Real-time stream capacity per chunk size: NeMo driven directly vs the gRPC service, cache-aware vs buffered.

`make bench-asr`. For each chunk size it finds the largest number of concurrent streams N whose per-stream
real-time factor stays below 1, where RTF = wall time to recognise a stream's clip / clip duration, all N
streams started together with their audio available (throughput capacity: the work of N real-time streams
fits in real time). Three ways of serving them:

- engine-direct: NeMo's own batched streaming loop in this process, no gRPC — features for the N clips,
  NeMo's CacheAwareStreamingAudioBuffer, then `conformer_stream_step` over all N per chunk (the ceiling);
- service cache-aware: N gRPC streams against `python -m services.asr` (its batching loop);
- service buffered: the same against `--backend buffered` (a 4 s window re-encoded per chunk).

`--paced` measures the service paths the way issue 17 states its target instead: N real-time streams, each sending
its audio as it would arrive (a piece once its last sample is due), started spread over one chunk period (users do
not start in phase), and a probe passes while the p95 of per-chunk latency, over every partial of every stream, is
below one chunk. A partial's latency is its arrival at the client minus the moment the client sent the last sample
it needed (its frames plus the STFT's 16 ms look-ahead): the engine, both gRPC hops and the front end included.
Engine-direct stays a throughput capacity (NeMo's loop steps all N streams once per chunk, so its per-chunk latency
is its step time: RTF < 1 is the same test).

Capacity is searched by doubling N, then bisecting between the last pass and the first failure; a probe's
RTF is the median of `--runs` runs at that N (one run's RTF swings by a third on this VM). All servers
are up before the first probe, and the paths' searches for one chunk size are interleaved probe by probe
(`--trials` times, the median kept): a shared machine's speed drifts by tens of percent over minutes, so the paths
compared in one row must be measured in the same minutes. Clips are whole chunks (see clip_seconds).
The default preset is `fastconformer-small` (~14M), not the service's CPU default `fastconformer-100m`:
on a 2-core machine the 100M model cannot carry one real-time stream even driven directly, so its table
is all zeros (`--preset fastconformer-100m` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import math
import multiprocessing
import shlex
import statistics
import sys
import time
from collections.abc import Sequence

import grpc
import numpy as np

from voiceagent.serving.launcher import start_service, venv_python
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2

CHUNK_MS = (80, 160, 320, 560, 1120)
# A mel frame centred on sample 160·t needs samples up to 160·t + 256 (engine/features.py STFT_HALF_WINDOW; not
# imported: that module imports torch, and client processes need only grpc and numpy).
LOOKAHEAD_SAMPLES = 256


def clip_seconds(chunk_ms: int, minimum_s: float = 1.6) -> float:
    """At least `minimum_s` and four chunks (several steady steps at every chunk size), and whole
    chunks: the first chunk is 70 ms short of the others (the causal subsampling emits frame 0 from one 10 ms
    mel frame), so a clip of k chunks is k x chunk - 70 ms. NeMo's CacheAwareStreamingAudioBuffer silently
    drops a partial last chunk while the service recognises every frame; with whole chunks both paths do the
    same steps over the same frames."""
    chunks = math.ceil(max(minimum_s, 4 * chunk_ms / 1000) / (chunk_ms / 1000))
    return (chunks * chunk_ms - 70) / 1000


def clips(count: int, seconds: float) -> list[np.ndarray]:
    rng = np.random.default_rng(count)
    return [(rng.standard_normal(round(seconds * 16000)) * 0.1).astype(np.float32) for _ in range(count)]


# --- engine-direct -----------------------------------------------------------------------------------------
class EngineDirect:
    def __init__(self, preset: str, threads: int, device: str = "cpu", dtype: str = "float32"):
        import torch

        torch.set_num_threads(threads)
        from services.asr.config import AsrConfig
        from services.asr.engine import fastconformer

        self.torch = torch
        self.model, _ = fastconformer.build_model(AsrConfig(preset=preset).preset_file)
        self.model = self.model.to(device)
        self.device = device
        self.dtype = getattr(torch, dtype)
        for module in (self.model.encoder, self.model.decoder, self.model.joint):  # as the service does
            module.to(self.dtype)

    def rtf(self, chunk_ms: int, streams: int, seconds: float) -> float:
        from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

        from services.asr.engine.fastconformer import context_for_chunk_ms

        torch, model = self.torch, self.model
        audio = clips(streams, seconds)
        with torch.inference_mode():
            started = time.perf_counter()
            model.encoder.set_default_att_context_size(context_for_chunk_ms(model, chunk_ms))
            buffer = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False)
            signal = torch.from_numpy(np.stack(audio)).to(self.device)
            length = torch.full((streams,), signal.shape[1], device=self.device)
            mel, mel_len = model.preprocessor(input_signal=signal, length=length)
            for index in range(streams):
                buffer.append_processed_signal(mel[index : index + 1, :, : mel_len[index]].to(self.dtype))
            channel, time_cache, length = model.encoder.get_initial_cache_state(batch_size=streams, dtype=self.dtype)
            hypotheses = None
            for step, (chunk, chunk_len) in enumerate(iter(buffer)):
                drop = 0 if step == 0 else model.encoder.streaming_cfg.drop_extra_pre_encoded
                (_, _, channel, time_cache, length, hypotheses) = model.conformer_stream_step(
                    processed_signal=chunk,
                    processed_signal_length=chunk_len,
                    cache_last_channel=channel,
                    cache_last_time=time_cache,
                    cache_last_channel_len=length,
                    keep_all_outputs=buffer.is_buffer_empty(),
                    previous_hypotheses=hypotheses,
                    drop_extra_pre_encoded=drop,
                    return_transcription=True,
                )
            if self.device != "cpu":
                torch.cuda.synchronize()
            return (time.perf_counter() - started) / seconds


# --- the service -------------------------------------------------------------------------------------------
def piece_samples(chunk_ms: int, piece_ms: int) -> int:
    """Samples per audio message: `piece_ms`, or with 0 the larger of one chunk and 100 ms. A piece shorter than
    a chunk cannot make a step earlier (a step needs its whole chunk) but costs a gRPC message each."""
    return 16 * (piece_ms or max(chunk_ms, 100))


async def _one_stream(stub, chunk_ms: int, audio: np.ndarray, piece: int) -> float:
    async def messages():
        config = asr_pb2.RecognitionConfig(
            sample_rate_hz=16000, encoding=common_pb2.AUDIO_ENCODING_FLOAT32, chunk_ms=chunk_ms, interim_results=True
        )
        yield asr_pb2.StreamingRecognizeRequest(config=config)
        for start in range(0, len(audio), piece):
            yield asr_pb2.StreamingRecognizeRequest(audio=audio[start : start + piece].tobytes())

    started = time.perf_counter()
    async for response in stub.StreamingRecognize(messages()):
        if response.is_final:
            break
    return (time.perf_counter() - started) / (len(audio) / 16000)


async def _paced_stream(stub, chunk_ms: int, audio: np.ndarray, piece: int, delay_s: float) -> list[float]:
    """One real-time stream (see the module docstring, `--paced`): the latency in seconds of each of its partials."""
    await asyncio.sleep(delay_s)
    started = time.perf_counter()
    sent: list[tuple[int, float]] = []  # (samples sent so far, when)

    async def messages():
        config = asr_pb2.RecognitionConfig(
            sample_rate_hz=16000, encoding=common_pb2.AUDIO_ENCODING_FLOAT32, chunk_ms=chunk_ms, interim_results=True
        )
        yield asr_pb2.StreamingRecognizeRequest(config=config)
        for begin in range(0, len(audio), piece):
            end = min(begin + piece, len(audio))
            await asyncio.sleep(max(0.0, started + end / 16000 - time.perf_counter()))  # its last sample is due
            sent.append((end, time.perf_counter()))
            yield asr_pb2.StreamingRecognizeRequest(audio=audio[begin:end].tobytes())

    latencies = []
    async for response in stub.StreamingRecognize(messages()):
        arrived = time.perf_counter()
        needed = len(audio) if response.is_final else round(response.audio_processed_s * 16000) + LOOKAHEAD_SAMPLES
        when = next((at for total, at in sent if total >= min(needed, len(audio))), None)
        if when is not None:
            latencies.append(arrived - when)
        if response.is_final:
            break
    return latencies


def p95_over_chunk(latencies: list[float], chunk_ms: int) -> float:
    """`--paced`'s probe value: p95 of per-chunk latency / the chunk (< 1 passes, as RTF < 1 does)."""
    if not latencies or not np.isfinite(latencies).all():  # no partial, or a stream that failed
        return float("inf")
    return float(np.percentile(latencies, 95)) / (chunk_ms / 1000)


# Connections per client process: a pod of several gRPC front ends (--frontends) shares its port by SO_REUSEPORT,
# which spreads connections, not streams, so a client with one channel loads one front end. On the H200, 4 client
# processes of one channel each left four front ends at 0.40, 0.20, 0.20 and 0.04 CPU-s/s (results/h200/README.md, v5).
CHANNELS_PER_CLIENT = 4


def _channels(address: str, streams: int) -> list[grpc.aio.Channel]:
    # a local subchannel pool each: otherwise gRPC shares one connection between channels to the same target
    return [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(min(CHANNELS_PER_CLIENT, max(1, streams)))
    ]


async def service_results(
    address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int = 0, paced: bool = False
) -> list[float]:
    """`streams` gRPC streams from this process: each one's RTF, or with `paced` (real-time streams started evenly
    over one chunk period) the latency of every partial of every stream."""
    channels = _channels(address, streams)
    try:
        stubs = [asr_pb2_grpc.SpeechRecognizerStub(channel) for channel in channels]
        piece = piece_samples(chunk_ms, piece_ms)
        runs = [
            _paced_stream(stubs[index % len(stubs)], chunk_ms, clip, piece, index / streams * chunk_ms / 1000)
            if paced
            else _one_stream(stubs[index % len(stubs)], chunk_ms, clip, piece)
            for index, clip in enumerate(clips(streams, seconds))
        ]
        per_stream = await asyncio.gather(*runs, return_exceptions=True)
    finally:
        for channel in channels:
            await channel.close()
    # A stream the service failed fails the probe (inf), and says why once; the search goes on (a probe beyond the
    # service's means may fail where a smaller one passes).
    failed = [result for result in per_stream if isinstance(result, BaseException)]
    if failed:
        first = failed[0]
        why = f"{first.code().name}: {first.details()}" if isinstance(first, grpc.aio.AioRpcError) else repr(first)
        print(f"    {len(failed)} of {streams} streams failed, the first with {why}", file=sys.stderr, flush=True)
    return [
        value
        for result in per_stream
        for value in ([float("inf")] if isinstance(result, BaseException) else result if paced else [result])
    ]


def probe_value(results: list[float], chunk_ms: int, paced: bool) -> float:
    """A probe passes below 1: the slowest stream's RTF, or with `paced` the p95 of the latencies over the chunk."""
    return p95_over_chunk(results, chunk_ms) if paced else max(results)


async def service_latencies(
    address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int = 0
) -> list[float]:
    """`--paced`: per-chunk latencies of `streams` real-time streams started evenly over one chunk period."""
    return await service_results(address, chunk_ms, streams, seconds, piece_ms, paced=True)


async def service_rtf(address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int = 0) -> float:
    return max(await service_results(address, chunk_ms, streams, seconds, piece_ms))


_CLIENT_LOOP: asyncio.AbstractEventLoop | None = None


def _client_share(address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int, paced: bool):
    """One client process's share of the streams (grpc.aio keeps its callbacks on one loop per process)."""
    global _CLIENT_LOOP
    _CLIENT_LOOP = _CLIENT_LOOP or asyncio.new_event_loop()
    return _CLIENT_LOOP.run_until_complete(service_results(address, chunk_ms, streams, seconds, piece_ms, paced))


class ClientProcesses:
    """N gRPC streams split over `count` client processes: one Python process is near its limit at ~900
    streams on the H200 host (results/h200/README.md), which would make the client the bottleneck."""

    def __init__(self, count: int):
        self.count = count
        context = multiprocessing.get_context("spawn")  # the parent holds a grpc.aio loop: no fork
        self.pool = concurrent.futures.ProcessPoolExecutor(count, mp_context=context)
        list(self.pool.map(abs, range(count)))  # start every worker before the first probe

    def probe(self, address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int, paced: bool) -> float:
        """The probe value (`probe_value`) over every client process's results."""
        shares = [streams // self.count + (index < streams % self.count) for index in range(self.count)]
        futures = [
            self.pool.submit(_client_share, address, chunk_ms, share, seconds, piece_ms, paced)
            for share in shares
            if share
        ]
        return probe_value([value for future in futures for value in future.result()], chunk_ms, paced)

    def rtf(self, address: str, chunk_ms: int, streams: int, seconds: float, piece_ms: int) -> float:
        return self.probe(address, chunk_ms, streams, seconds, piece_ms, paced=False)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


# --- capacity search ---------------------------------------------------------------------------------------
def median_trial(trials: list[tuple[int, float]]) -> tuple[int, float]:
    """The (N, RTF) of the trial with the median capacity (the lower middle one of an even count); a path
    not measured is (0, nan). One capacity search on this VM lands within about ±15 % of another."""
    if not trials:
        return 0, float("nan")
    return sorted(trials)[(len(trials) - 1) // 2]


def median_of(measure, runs: int, label: str = "RTF"):
    """A probe's RTF is the median of `runs` runs at that N. One run is not enough: on this VM the same path at
    the same N measures RTF 1.06 and 1.39 a few seconds apart, so single-run (or best-of) probes made each
    capacity a draw: two such runs on one morning put the service at 72 % and at 100 % of engine-direct.
    Runs stop once a majority falls on one side of RTF 1 (the median's side is then decided)."""

    def measured(streams: int) -> float:
        rtfs: list[float] = []
        majority = runs // 2 + 1
        while len(rtfs) < runs:
            rtfs.append(measure(streams))
            print(f"    probe: {streams} streams, {label} {rtfs[-1]:.2f}", flush=True)
            if max(sum(r < 1 for r in rtfs), sum(r >= 1 for r in rtfs)) >= majority:
                break
        return statistics.median(rtfs)

    return measured


def capacity_search(limit: int, precision: float = 0.0, start: int = 1):
    """A generator: yields the N to probe next, is sent the RTF measured there, returns (largest N <= limit
    with RTF < 1, its RTF). Doubling from `start`, then bisection; with `precision` p the bisection stops
    once the first failing N is within p·N of the last passing one (fewer probes, on a GPU). A failure at
    `start` itself bisects down from it."""
    passed, passed_rtf, failed = 0, float("nan"), None
    streams = start
    while streams <= limit:
        rtf = yield streams
        if rtf >= 1:
            failed = streams
            break
        passed, passed_rtf = streams, rtf
        streams *= 2
    upper = failed if failed is not None else limit + 1
    if passed == 0 and start > 1:  # failed at `start` itself: bisect between 0 and it
        while upper - passed > max(1, precision * upper):
            middle = (passed + upper) // 2
            rtf = yield middle
            if rtf < 1:
                passed, passed_rtf = middle, rtf
            else:
                upper = middle
    while upper - passed > max(1, precision * passed) and passed > 0:
        middle = (passed + upper) // 2
        rtf = yield middle
        if rtf < 1:
            passed, passed_rtf = middle, rtf
        else:
            upper = middle
    return passed, passed_rtf


def capacities(
    measures: list, limit: int, runs: int = 3, precision: float = 0.0, start: int = 1, labels: Sequence[str] = ()
) -> list[tuple[int, float]]:
    """The capacity of each of several paths, their searches interleaved probe by probe (the order of the
    paths alternating from one round of probes to the next), so that every path is measured in the same
    minutes: a shared machine's speed drifts by tens of percent over a few minutes."""
    labels = list(labels) or ["RTF"] * len(measures)
    measures = [median_of(measure, runs, label) for measure, label in zip(measures, labels, strict=True)]
    searches = [capacity_search(limit, precision, start) for _ in measures]
    probes: list[int | None] = [search.send(None) for search in searches]
    results: list[tuple[int, float] | None] = [None] * len(measures)
    round_index = 0
    while any(result is None for result in results):
        order = range(len(measures)) if round_index % 2 == 0 else reversed(range(len(measures)))
        for index in order:
            if results[index] is not None:
                continue
            try:
                probes[index] = searches[index].send(measures[index](probes[index]))
            except StopIteration as done:
                results[index] = done.value
        round_index += 1
    return results


def start_asr_service(
    backend: str, preset: str, limit: int, threads: int, device: str, dtype: str, extra: Sequence[str] = ()
):
    args = ["--preset", preset, "--backend", backend, "--max-streams", str(limit), "--max-batch-streams", str(limit)]
    args += ["--threads", str(threads), "--device", device, "--dtype", dtype, *extra]
    service = start_service("services.asr", venv_python("asr"), args + ["--probe-ceilings", "false"])
    deadline = time.monotonic() + 600
    while True:  # a health check can time out while a large model warms up on a busy machine
        try:
            service.wait_serving(600)
            return service
        except grpc.RpcError:
            if time.monotonic() > deadline:
                service.terminate()
                raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="fastconformer-small")
    parser.add_argument("--max-streams", type=int, default=64, help="search limit")
    parser.add_argument("--chunks", default=",".join(map(str, CHUNK_MS)))
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: leaves a core to gRPC and to the clients)"
    )
    parser.add_argument("--device", default="cpu", help="torch device of the engine and the services (cuda on a GPU)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 (encoder, decoder and caches)")
    parser.add_argument(
        "--only", default="engine,cache-aware,buffered", help="which of engine, cache-aware, buffered to measure"
    )
    parser.add_argument(
        "--piece-ms", type=int, default=0, help="audio per client message (0: one chunk, at least 100 ms)"
    )
    parser.add_argument(
        "--clip-s",
        type=float,
        default=1.6,
        help="shortest clip in seconds (whole chunks): a stream's set-up is a fixed cost a longer clip amortises",
    )
    parser.add_argument(
        "--clients", type=int, default=1, help="client processes the service's streams are split over (1: this one)"
    )
    parser.add_argument("--start-streams", type=int, default=1, help="the capacity search doubles from this N")
    parser.add_argument(
        "--paced",
        action="store_true",
        help="service paths: real-time streams, pass while per-chunk latency p95 < the chunk (module docstring)",
    )
    parser.add_argument(
        "--service-args", default="", help="extra flags for the services, e.g. '--cuda-graphs false' (one string)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per probe (its RTF is their median)")
    parser.add_argument(
        "--trials", type=int, default=3, help="interleaved capacity searches per chunk size (the median one counts)"
    )
    parser.add_argument(
        "--precision", type=float, default=0.0, help="stop bisecting within this fraction of N (0: exact)"
    )
    args = parser.parse_args()
    search = {"runs": args.runs, "precision": args.precision, "start": args.start_streams}
    only = args.only.split(",")
    chunks = [int(c) for c in args.chunks.split(",")]
    started = time.perf_counter()
    service_value = "p95/chunk" if args.paced else "RTF"  # what the service columns' values are

    # Every server is up before the first probe, and each chunk size is measured on every path back to back
    # (engine-direct, then the services): the machine's speed drifts over minutes (other tenants, clocks),
    # so the paths compared in one row should be measured in the same minute, not minutes apart.
    services = {}
    try:
        for backend in ("cache-aware", "buffered"):
            if backend in only:
                services[backend] = start_asr_service(
                    backend, args.preset, args.max_streams, args.threads, args.device, args.dtype,
                    shlex.split(args.service_args),
                )  # fmt: skip
        clients = ClientProcesses(args.clients) if args.clients > 1 and services else None
        engine = EngineDirect(args.preset, args.threads, args.device, args.dtype) if "engine" in only else None
        # Keep the collector off the objects torch and NeMo made at import (the service does the same): full
        # collections walking them would slow engine-direct and the gRPC clients alike.
        gc.freeze()
        loop = asyncio.new_event_loop()  # one loop for every client: grpc.aio keeps callbacks on it
        direct, cache_aware, buffered = ({c: [] for c in chunks} for _ in range(3))  # (N, RTF) per trial
        for chunk_ms in chunks:
            seconds = clip_seconds(chunk_ms, args.clip_s)
            paths = []  # (label, measure(N) -> RTF or p95 latency / chunk, where the capacity goes, its value's name)
            if engine:
                engine.rtf(chunk_ms, 1, seconds)  # warm-up
                paths.append(
                    ("engine-direct      ", lambda n, c=chunk_ms, s=seconds: engine.rtf(c, n, s), direct, "RTF")
                )
            for backend, results in (("cache-aware", cache_aware), ("buffered", buffered)):
                if backend in services:
                    address = services[backend].address
                    if clients:
                        measure = lambda n, c=chunk_ms, a=address, s=seconds: clients.probe(  # noqa: E731
                            a, c, n, s, args.piece_ms, args.paced
                        )
                    else:
                        measure = lambda n, c=chunk_ms, a=address, s=seconds: probe_value(  # noqa: E731
                            loop.run_until_complete(service_results(a, c, n, s, args.piece_ms, args.paced)),
                            c,
                            args.paced,
                        )
                    paths.append((f"service {backend:11s}", measure, results, service_value))
            # Each trial interleaves the paths' searches probe by probe; the table reports each path's median trial.
            for trial in range(args.trials):
                found = capacities(
                    [measure for _, measure, _, _ in paths], args.max_streams, **search,
                    labels=[value for *_, value in paths],
                )  # fmt: skip
                for (label, _, results, _), (streams, rtf) in zip(paths, found, strict=True):
                    results[chunk_ms].append((streams, rtf))
                    print(f"  {label} {chunk_ms:5d} ms: {streams} streams (trial {trial + 1})", flush=True)
    finally:
        if "clients" in locals() and clients:
            clients.close()
        for service in services.values():
            service.terminate()

    criterion = (
        "service paths paced in real time: per-chunk latency p95 / chunk < 1 (p95/chunk); engine-direct RTF < 1"
        if args.paced
        else "per-stream RTF < 1"
    )
    print(
        f"\nreal-time stream capacity ({criterion}), preset {args.preset}, device {args.device} {args.dtype}, "
        f"{args.threads} torch thread(s); {args.clients} client process(es); service flags "
        f"{args.service_args or '(defaults)'}; clips of at least {args.clip_s:g} s; client audio pieces "
        f"{args.piece_ms or 'max(chunk, 100)'} ms; median of {args.trials} trial(s) (each listed below); "
        "0 with RTF nan = not measured; N = --max-streams is the search limit, a lower bound"
    )
    print("chunk_ms | engine-direct | service cache-aware | service/engine | service buffered | cache-aware/buffered")
    for chunk_ms in chunks:
        engine_n, engine_rtf = median_trial(direct[chunk_ms])
        service_n, service_rtf_at = median_trial(cache_aware[chunk_ms])
        buffered_n, buffered_rtf = median_trial(buffered[chunk_ms])
        # At the search limit a capacity is only a lower bound: no ratio from it (raise --max-streams).
        ratio = f"{service_n / engine_n:.0%}" if engine_n and engine_n < args.max_streams else "-"
        measured = bool(buffered[chunk_ms])  # 0 streams measured (not real-time at 1) reads "inf"; not measured "-"
        versus = f"{service_n / buffered_n:.1f}x" if buffered_n else ("inf" if service_n and measured else "-")
        print(
            f"{chunk_ms:8d} | {engine_n:4d} (RTF {engine_rtf:.2f}) | "
            f"{service_n:8d} ({service_value} {service_rtf_at:.2f}) | {ratio:>14s} | "
            f"{buffered_n:6d} ({service_value} {buffered_rtf:.2f}) | {versus:>20s}"
        )
    if args.trials > 1:
        for label, results in (("engine-direct", direct), ("cache-aware", cache_aware), ("buffered", buffered)):
            trials = "; ".join(f"{c} ms {[n for n, _ in results[c]]}" for c in chunks if results[c])
            if trials:
                print(f"trials, {label}: {trials}")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
