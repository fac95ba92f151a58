"""Benchmark: the LLM service over gRPC versus vLLM's async engine driven in-process, same preset, same run.

`make bench-llm` (python -m services.llm.benchmark). Both engines are built from the same LlmConfig on the
same machine; levels alternate between them round by round so that drift in the machine's load (other
processes) falls on both. Every request is greedy with ignore_eos, a distinct prompt of token ids (no
prefix-cache hits) and the same number of new tokens. Per level: TTFT p50/p99 as the client sees it and
generated tokens per second of wall time, front-end CPU per token (this process, plus the service's for the
gRPC path), and for the service the per-request part of TTFT spent outside its backend (gRPC both ways, the
servicer). Targets: the service keeps >= 97% of the engine's tokens/s and adds <= 2 ms to TTFT p50.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import multiprocessing
import os
import random
import time
from collections.abc import Mapping

import grpc

from services.llm.config import LlmConfig
from voiceagent.serving.launcher import child_processes, start_service, venv_python
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

TOKEN_TS_TARGET = 0.97
TTFT_ADDED_TARGET_MS = 2.0


@dataclasses.dataclass
class RequestResult:
    """One request as the client saw it (errors are recorded, not raised)."""

    ttft: float = 0.0
    engine_ttft: float = 0.0  # the service's own TTFT for this request (its completion timings); 0 engine-direct
    engine_decode: float = 0.0  # the same span as the service's backend saw it (completion timings); 0 engine-direct
    core_decode: float = 0.0  # the same span as vLLM's engine core stamped it (both paths; 0: not known)
    itl: list[float] = dataclasses.field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    success: bool = False
    error: str = ""


@dataclasses.dataclass
class LevelResult:
    path: str
    concurrency: int
    requests: list[RequestResult]
    wall_s: float
    client_cpu_s: float = 0.0  # CPU this process spent (engine-direct: vLLM's front end runs here)
    server_cpu_s: float = 0.0  # CPU the service process spent (gRPC server, vLLM front end)

    @property
    def tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    def front_end_us_per_token(self) -> float:
        return 1e6 * (self.client_cpu_s + self.server_cpu_s) / max(1, self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def ttft_ms(self, quantile: float) -> float:
        return 1000 * percentile([r.ttft for r in self.requests if r.success], quantile)

    def decode_ms(self, quantile: float, backend: bool = False, core: bool = False) -> float:
        """Per request, first token to last: as the client saw it, (`backend`) as the service's backend did, or
        (`core`) as vLLM's engine core stamped it. A service slower than engine-direct in decode alone, with its
        backend's span equal to the client's, is slower inside the engine or on the way into its front end; the
        engine core's span tells which."""
        done = [r for r in self.requests if r.success]
        spans = [r.core_decode if core else r.engine_decode if backend else sum(r.itl) for r in done]
        return 1000 * percentile(spans, quantile)

    def ttft_outside_backend_ms(self, quantile: float) -> float:
        """Per request, the client's TTFT less the service backend's own (from the request passing validation to
        vLLM's first output, the request's completion timings): the part gRPC and the servicer take, free of
        the engine's step-to-step noise that a difference of two p50s carries."""
        return 1000 * percentile([r.ttft - r.engine_ttft for r in self.requests if r.success], quantile)


def percentile(values: list[float], quantile: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(quantile * (len(values) - 1)))]


async def engine_request(engine, prompt: list[int], max_tokens: int, request_id: str) -> RequestResult:
    """The same request the service makes of vLLM (the prompt rendered by the same call, inside the timed
    span), minus gRPC. SamplingParams are built before the clock starts, as the client's proto is."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from services.llm.backends.vllm import engine_decode, engine_input

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    result = RequestResult()
    started = last = time.perf_counter()
    try:
        async for output in engine.generate(engine_input(engine, prompt), params, request_id):
            count = len(output.outputs[0].token_ids)
            if count:
                now = time.perf_counter()
                if result.output_tokens == 0:
                    result.ttft = now - started
                else:
                    result.itl.append(now - last)
                result.output_tokens += count
                last = now
            if output.finished:
                result.core_decode = engine_decode(output.metrics)
        result.success = True
    except Exception as error:  # noqa: BLE001 - a failed request is a result
        result.error = repr(error)
    result.latency = time.perf_counter() - started
    return result


async def service_request(stub, prompt: list[int], max_tokens: int, request_id: str) -> RequestResult:
    request = llm_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=llm_pb2.TokenIds(ids=prompt),
        sampling=llm_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )
    result = RequestResult()
    started = last = time.perf_counter()
    try:
        async for response in stub.Generate(request, timeout=600):
            if response.token_ids:
                now = time.perf_counter()
                if result.output_tokens == 0:
                    result.ttft = now - started
                else:
                    result.itl.append(now - last)
                result.output_tokens += len(response.token_ids)
                last = now
            if response.HasField("completion"):
                result.engine_ttft = response.completion.timings.time_to_first_token_s
                result.engine_decode = response.completion.timings.decode_s
                result.core_decode = response.completion.timings.engine_decode_s
        result.success = True
    except grpc.RpcError as error:
        result.error = f"{error.code().name}: {error.details()}"
    result.latency = time.perf_counter() - started
    return result


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), plus its gRPC front-end processes (`--frontends`)."""
    total = 0.0
    for each in (pid, *child_processes(pid, lambda command: command.startswith(b"llm-frontend-"))):
        with open(f"/proc/{each}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def run_level(
    send, path: str, prompts: list[list[int]], max_tokens: int, concurrency: int, server_pid: int
) -> LevelResult:
    """Closed loop: `concurrency` workers take the next prompt as soon as their previous request ends."""
    queue = list(enumerate(prompts))
    results: list[RequestResult] = []

    async def worker():
        while queue:
            index, prompt = queue.pop(0)
            results.append(await send(prompt, max_tokens, f"{path}-{concurrency}-{index}"))

    server = (lambda: process_cpu_s(server_pid)) if server_pid else (lambda: 0.0)  # 0: not measured here
    started, client_cpu, server_cpu = time.perf_counter(), time.process_time(), server()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LevelResult(
        path,
        concurrency,
        results,
        time.perf_counter() - started,
        time.process_time() - client_cpu,
        server() - server_cpu,
    )


_CLIENT: dict = {}  # a client process's loop and stubs (grpc.aio keeps its callbacks on one loop per process)


def _client_connect(address: str, channels: int) -> None:
    """In a client process: its loop and `channels` connections (each its own, as the parent's are)."""
    loop = _CLIENT.setdefault("loop", asyncio.new_event_loop())
    options = [("grpc.use_local_subchannel_pool", 1)]

    async def connect():
        stubs = [
            llm_pb2_grpc.TextGeneratorStub(grpc.aio.insecure_channel(address, options=options)) for _ in range(channels)
        ]
        for stub in stubs:
            await stub.GetInfo(common_pb2.InfoRequest(), timeout=30)
        return stubs

    _CLIENT["stubs"] = loop.run_until_complete(connect())
    _CLIENT["turn"] = iter(range(1 << 62))


def _client_level(prompts: list[list[int]], max_tokens: int, concurrency: int, tag: str):
    """In a client process: its share of a level's closed loop; its results and the CPU seconds it spent."""
    stubs, turn = _CLIENT["stubs"], _CLIENT["turn"]

    def send(prompt, tokens, request_id):
        return service_request(stubs[next(turn) % len(stubs)], prompt, tokens, request_id)

    cpu = time.process_time()
    level = _CLIENT["loop"].run_until_complete(run_level(send, tag, prompts, max_tokens, concurrency, 0))
    return level.requests, time.process_time() - cpu


class ClientProcesses:
    """The gRPC path's closed-loop workers split over `count` client processes (spawned), each with its share of the
    channels, workers and prompts. One Python process receiving every stream's messages is itself a limit at high
    rates (qwen3-8b at 256 streams on an H100 is ~17k messages a second; README §4d of results/h200), and a
    difference of two TTFTs would charge its queueing to the service. Engine-direct keeps its clients in the
    engine's process: that is what the path is."""

    def __init__(self, address: str, channels: int, count: int):
        context = multiprocessing.get_context("spawn")  # this process holds a grpc.aio loop: no fork
        self.count = count
        per_process = max(1, -(-channels // count))  # each connects its own at start (the pool's initializer)
        self.pool = concurrent.futures.ProcessPoolExecutor(
            count, mp_context=context, initializer=_client_connect, initargs=(address, per_process)
        )
        list(self.pool.map(abs, range(count)))  # every process started and connected before the first level

    async def level(self, prompts: list[list[int]], max_tokens: int, concurrency: int, server_pid: int) -> LevelResult:
        loop = asyncio.get_running_loop()
        used = min(self.count, concurrency)  # processes with a worker; the prompts go to them only
        workers, prompt_shares, at = _split(concurrency, used), [], 0
        for share in _split(len(prompts), used):
            prompt_shares.append(prompts[at : at + share])
            at += share
        started, server_cpu, tag = time.perf_counter(), process_cpu_s(server_pid), f"grpc-service-{concurrency}"
        futures = [
            loop.run_in_executor(self.pool, _client_level, share, max_tokens, worker, f"{tag}-p{i}")
            for i, (share, worker) in enumerate(zip(prompt_shares, workers, strict=True))
        ]
        shares = await asyncio.gather(*futures)
        return LevelResult(
            "grpc-service",
            concurrency,
            [result for results, _cpu in shares for result in results],
            time.perf_counter() - started,
            sum(cpu for _results, cpu in shares),
            process_cpu_s(server_pid) - server_cpu,
        )

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (index < total % parts) for index in range(parts)]


def random_prompts(count: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(1000, vocab - 1000) for _ in range(length)] for _ in range(count)]


def merged(levels: list[LevelResult]) -> LevelResult:
    """Rounds of one path and level pooled: their requests, and their wall times summed."""
    return LevelResult(
        levels[0].path,
        levels[0].concurrency,
        [r for level in levels for r in level.requests],
        sum(level.wall_s for level in levels),
        sum(level.client_cpu_s for level in levels),
        sum(level.server_cpu_s for level in levels),
    )


def pair_spread(rounds: dict[tuple[str, int], list[LevelResult]], concurrency: int) -> str:
    """Service/engine per round pair (the two paths' runs of one round, back to back): the spread shows how much
    of a pooled difference is the machine's drift between minutes rather than the service."""
    pairs = list(zip(rounds["engine-direct", concurrency], rounds["grpc-service", concurrency], strict=True))
    ratios = sorted(100 * service.tokens_per_s / engine.tokens_per_s for engine, service in pairs)
    added = sorted(service.ttft_ms(0.5) - engine.ttft_ms(0.5) for engine, service in pairs)
    return (
        f"per round pair: tokens/s {' '.join(f'{r:.0f}%' for r in ratios)}; "
        f"TTFT p50 {' '.join(f'{a:+.1f}' for a in added)} ms"
    )


def len_channels(args) -> int:
    return args.channels or (max(args.concurrency) if args.frontends > 1 else 1)


# The engine settings that decide a step's batch: both paths must run the same ones.
ENGINE_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")


def engine_differences(engine: Mapping[str, float], service: Mapping[str, float]) -> str:
    """The ENGINE_LIMITS on which the in-process engine and the service's (its GetInfo limits) differ."""
    return ", ".join(
        f"{name} {engine.get(name)} vs {service.get(name)}"
        for name in ENGINE_LIMITS
        if float(engine.get(name, -1)) != float(service.get(name, -1))
    )


def print_table(args, info, rounds: dict[tuple[str, int], list[LevelResult]]) -> None:
    results = {key: merged(levels) for key, levels in rounds.items()}
    model = info.model
    print()
    print(
        f"LLM benchmark: preset {model.preset} ({model.parameter_count / 1e6:.0f}M parameters, {model.dtype}, "
        f"{info.ceilings.device_name or 'cpu'}), prompt {args.prompt_tokens} tokens, {args.max_tokens} new "
        f"tokens per request, greedy, {args.rounds} alternating rounds per level; service front ends "
        f"{args.frontends}, client channels {len_channels(args)} in {args.client_processes} process(es), "
        f"stream interval {args.stream_interval}, "
        f"step budget {info.limits['max_num_batched_tokens']:.0f} tokens and {info.limits['max_num_seqs']:.0f} "
        "requests (both engines); "
        f"load average {', '.join(f'{load:.1f}' for load in os.getloadavg())} on {os.cpu_count()} CPUs"
    )
    header = f"{'concurrency':>11}  {'path':<14} {'requests':>8} {'failed':>6} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11}"
    print(header + f" {'tokens/s':>9} {'front-end CPU us/token':>22} {'TTFT in gRPC+servicer p50 ms':>29}")
    for concurrency in args.concurrency:
        engine, service = results["engine-direct", concurrency], results["grpc-service", concurrency]
        for level in (engine, service):
            failed = sum(not r.success for r in level.requests)
            print(
                f"{concurrency:>11}  {level.path:<14} {len(level.requests):>8} {failed:>6} "
                f"{level.ttft_ms(0.5):>11.1f} {level.ttft_ms(0.99):>11.1f} {level.tokens_per_s:>9.1f} "
                f"{level.front_end_us_per_token():>22.0f} "
                + (f"{level.ttft_outside_backend_ms(0.5):>29.2f}" if level is service else "")
            )
        added = service.ttft_ms(0.5) - engine.ttft_ms(0.5)
        ratio = service.tokens_per_s / engine.tokens_per_s
        verdict = "meets" if ratio >= TOKEN_TS_TARGET and added <= TTFT_ADDED_TARGET_MS else "MISSES"
        print(
            f"{'':>11}  {'service/engine':<14} {'':>8} {'':>6} {added:>+11.1f} "
            f"{service.ttft_ms(0.99) - engine.ttft_ms(0.99):>+11.1f} {100 * ratio:>8.1f}%  "
            f"{verdict} targets (>= {100 * TOKEN_TS_TARGET:.0f}% tokens/s, <= {TTFT_ADDED_TARGET_MS:g} ms TTFT p50)"
        )
        print(f"{'':>11}  {pair_spread(rounds, concurrency)}")


async def benchmark(args) -> None:
    from services.llm.backends.vllm import VllmGenerator

    settings = ["--preset", args.preset, "--kv-cache-gib", str(args.kv_cache_gib), "--device", args.device]
    settings += ["--max-in-flight", str(args.max_in_flight)]
    settings += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    settings += ["--frontends", str(args.frontends), "--stream-interval", str(args.stream_interval)]
    settings += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.enforce_eager:
        settings += ["--enforce-eager", "true"]
    config = LlmConfig(
        preset=args.preset,
        kv_cache_gib=args.kv_cache_gib,
        max_in_flight=args.max_in_flight,
        enforce_eager=args.enforce_eager,
        device=args.device,
        gpu_memory_utilization=args.gpu_memory_utilization,
        stream_interval=args.stream_interval,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    print(f"starting the service ({' '.join(settings)}) and the in-process engine ...", flush=True)
    service = start_service("services.llm", venv_python("llm"), settings)
    generator = VllmGenerator(config)
    try:
        if args.device != "cpu":
            # Two engines share the GPU, and each sizes its KV cache by profiling free GPU memory, which the
            # other's start-up would disturb (vLLM then fails its start): start them one after the other.
            await asyncio.to_thread(service.wait_listening, 900)
            await asyncio.to_thread(service.wait_serving, 900)
        await generator.start()
        await asyncio.to_thread(service.wait_serving, 900)
        # Several front ends share the port by connection: each channel its own connection (no shared subchannel),
        # requests round-robin over the channels.
        count = len_channels(args)
        options = [("grpc.use_local_subchannel_pool", 1)]
        channels = [grpc.aio.insecure_channel(service.address, options=options) for _ in range(count)]
        clients = None
        try:
            stubs = [llm_pb2_grpc.TextGeneratorStub(channel) for channel in channels]
            turn = iter(range(1 << 62))
            for stub in stubs:  # connect every channel before the clock runs
                info = await stub.GetInfo(common_pb2.InfoRequest(), timeout=30)
            differ = engine_differences(generator.limits(), info.limits)
            if differ:  # then the comparison would be of two engines, not of the paths to one
                raise SystemExit(f"the in-process engine and the service's differ: {differ}")
            paths = {
                "engine-direct": lambda p, n, rid: engine_request(generator.engine, p, n, rid),
                "grpc-service": lambda p, n, rid: service_request(stubs[next(turn) % count], p, n, rid),
            }
            if args.client_processes > 1:
                clients = ClientProcesses(service.address, count, args.client_processes)
            rng = random.Random(0)
            vocab = generator.vocab_size
            for send in paths.values():  # warm both paths: first requests pay for lazy initialisation
                for index in range(2):
                    await send(random_prompts(1, args.prompt_tokens, vocab, rng)[0], 4, f"warm-{index}")
            for run in range(args.runs):  # each run a full measurement of its own, on the same two engines
                if args.runs > 1:
                    print(f"run {run + 1} of {args.runs}", flush=True)
                rounds: dict[tuple[str, int], list[LevelResult]] = {}
                for concurrency in args.concurrency:
                    requests = max(args.requests_per_worker * concurrency, args.min_requests)
                    for round_index in range(args.rounds):
                        order = list(paths) if round_index % 2 == 0 else list(reversed(paths))
                        for path in order:
                            prompts = random_prompts(requests, args.prompt_tokens, vocab, rng)
                            if clients is not None and path == "grpc-service":
                                level = await clients.level(prompts, args.max_tokens, concurrency, service.proc.pid)
                            else:
                                level = await run_level(
                                    paths[path], path, prompts, args.max_tokens, concurrency, service.proc.pid
                                )
                            rounds.setdefault((path, concurrency), []).append(level)
                            backend = level.decode_ms(0.5, backend=True) if path == "grpc-service" else None
                            core = level.decode_ms(0.5, core=True)
                            print(
                                f"  concurrency {concurrency:>2} round {round_index + 1} {path:<14} "
                                f"{level.tokens_per_s:7.1f} tokens/s, TTFT p50 {level.ttft_ms(0.5):6.1f} ms, "
                                f"decode p50 {level.decode_ms(0.5):6.1f} ms"
                                + (f" ({backend:.1f} in its backend)" if backend is not None else "")
                                + (f" ({core:.1f} in the engine core)" if core else "")
                                + f", client {level.client_cpu_s / level.wall_s:.2f} CPU-s/s, "
                                f"load average {os.getloadavg()[0]:.1f}",
                                flush=True,
                            )
                print_table(args, info, rounds)
        finally:
            if clients is not None:
                clients.close()
            for channel in channels:
                await channel.close()
    finally:
        await generator.stop()
        service.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m services.llm.benchmark", description=__doc__)
    parser.add_argument("--preset", default=os.environ.get("LLM_PRESET", "cpu"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per level")
    parser.add_argument("--runs", type=int, default=1, help="whole measurements, one table each (same engines)")
    parser.add_argument("--requests-per-worker", type=int, default=2)
    parser.add_argument("--min-requests", type=int, default=8, help="requests per round at least")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache per engine on CPU, GiB")
    parser.add_argument("--device", default=os.environ.get("LLM_DEVICE", "cpu"), help="cpu or cuda[:N]")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.4, help="share of GPU memory per engine (two share it)"
    )
    parser.add_argument("--max-in-flight", type=int, default=64, help="service admission and vLLM batch limit")
    parser.add_argument("--enforce-eager", action="store_true", help="skip torch.compile in both engines")
    parser.add_argument("--frontends", type=int, default=1, help="the service's gRPC front-end processes")
    parser.add_argument(
        "--channels", type=int, default=0, help="client channels (0: one per worker with --frontends > 1, else 1)"
    )
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=0, help="vLLM's tokens per step, both engines (0: its default)"
    )
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens per message (both paths' engines)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="the gRPC path's clients in this many processes (1: in this one, beside the in-process engine)",
    )
    args = parser.parse_args()
    asyncio.run(benchmark(args))


if __name__ == "__main__":
    main()
