"""The LLM service's own CPU per token, between vLLM's AsyncLLM and the wire: gRPC, interceptors, servicer and our
vLLM backend's per-delta work, with a stand-in for AsyncLLM that makes tokens at a fixed step (issue 18).

On the H100 (results/h200/README.md §4h) the service's front end spent ~146 µs of CPU per token with one front end
(client included), engine-direct ~32; at C=64 one front end's event loop was busy enough to take new calls ~25 ms late.
Here vLLM's side is a stand-in (`StandInEngine`: every `--step-ms` each running request gets one token, merged into
the pending output if the consumer has not taken it, as vLLM's RequestOutputCollector does with DELTA outputs), so
what is timed is only our part: the service process is the real `Server` (interceptors, health, reflection) with the
real `LlmService` and `VllmGenerator.generate`. Clients run in other processes, closed loop, C streams in all.

Printed per configuration: tokens/s, messages/s, the service process's CPU per token and per message (from /proc),
first-token latency p50 at the client (the stand-in makes the first token one step after the request arrives).
`--profile FILE` writes a cProfile of the service process (pstats) for one configuration.

    .venv/llm/bin/python results/cpu/llm_frontend_cpu_2026-12-07/frontend_cpu.py --concurrency 16 64 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Collector:
    """One request's pending output, merged while nobody takes it (vLLM's RequestOutputCollector, DELTA kind)."""

    def __init__(self):
        self.pending = None
        self.ready = asyncio.Event()

    def put(self, token: int, finished: bool) -> None:
        if self.pending is None:
            sample = types.SimpleNamespace(token_ids=[token], text=" tok", finish_reason=None, stop_reason=None)
            self.pending = types.SimpleNamespace(outputs=[sample], finished=False, metrics=None, num_cached_tokens=0)
        else:
            sample = self.pending.outputs[0]
            sample.token_ids.append(token)
            sample.text += " tok"
        if finished:
            self.pending.finished = True
            self.pending.outputs[0].finish_reason = "length"
        self.ready.set()

    async def get(self):
        await self.ready.wait()
        self.ready.clear()
        output, self.pending = self.pending, None
        return output


class StandInEngine:
    """AsyncLLM's `generate` and `errored`, with tokens made by a clock: one per running request per step."""

    errored = False

    def __init__(self, step_s: float):
        self.step_s = step_s
        self.running: dict[str, list] = {}  # request id -> [collector, tokens left]

    async def clock(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.step_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            for state in list(self.running.values()):
                state[1] -= 1
                state[0].put(17, state[1] == 0)

    async def generate(self, prompt, params, request_id):
        collector = _Collector()
        self.running[request_id] = [collector, params.max_tokens]
        try:
            while True:
                output = await collector.get()
                yield output
                if output.finished:
                    return
        finally:
            self.running.pop(request_id, None)


def serve_bare(port_queue, step_ms: float) -> None:
    """The floor: a bare grpc.aio server whose Generate yields one response per stand-in output (no interceptors,
    no servicer, no backend): what gRPC itself costs per message."""
    import grpc

    from voiceagent.v1 import llm_pb2

    async def main() -> None:
        engine = StandInEngine(step_ms / 1000)

        async def generate(request, context):
            params = types.SimpleNamespace(max_tokens=request.sampling.max_tokens)
            async for output in engine.generate(None, params, request.request_id):
                sample = output.outputs[0]
                ids = sample.token_ids
                yield llm_pb2.GenerateResponse(request_id=request.request_id, text=sample.text, token_ids=ids)

        handler = grpc.unary_stream_rpc_method_handler(
            generate, llm_pb2.GenerateRequest.FromString, llm_pb2.GenerateResponse.SerializeToString
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("voiceagent.v1.TextGenerator", {"Generate": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        clock = asyncio.create_task(engine.clock())
        port_queue.put(port)
        with contextlib.suppress(EOFError):
            await asyncio.get_running_loop().run_in_executor(None, input)
        clock.cancel()
        await server.stop(0)

    asyncio.run(main())


def serve(port_queue, step_ms: float, profile: str) -> None:
    from services.llm import servicer as servicer_module
    from services.llm.backends import vllm as vllm_backend
    from services.llm.config import PRESETS, LlmConfig
    from services.llm.model_shape import ModelShape
    from voiceagent.serving.server import Server

    async def main() -> None:
        config = LlmConfig(port=0, metrics_port=0, host="127.0.0.1", preset="tiny", max_in_flight=1024)
        generator = vllm_backend.VllmGenerator(config)
        generator.engine = StandInEngine(step_ms / 1000)
        vllm_backend.engine_input = lambda engine, ids: ids  # vLLM's renderer: vLLM's cost, not ours
        hf = json.loads((PRESETS / "tiny" / "config.json").read_text())
        generator.shape = ModelShape.from_hf_config(hf, 2, 2)
        generator.vocab_size, generator.max_model_len, generator.longest_token_bytes = hf["vocab_size"], 4096, 128
        service = servicer_module.LlmService(config, generator)
        server = Server(service, config)
        await server.listen(metrics_endpoint=False)
        service.prompt_limits = servicer_module.PromptLimits(generator.vocab_size, 4096, 4096 * 128)
        service.ready = True
        clock = asyncio.create_task(generator.engine.clock())
        port_queue.put(server.port)
        with contextlib.suppress(EOFError):
            await asyncio.get_running_loop().run_in_executor(None, input)  # until stdin closes
        clock.cancel()
        await server.grpc.stop(0)

    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        asyncio.run(main())
        profiler.disable()
        profiler.dump_stats(profile)
    else:
        asyncio.run(main())


def client(port: int, streams: int, max_tokens: int, seconds: float, results) -> None:
    import grpc

    from voiceagent.v1 import llm_pb2, llm_pb2_grpc

    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = llm_pb2_grpc.TextGeneratorStub(channel)
            deadline = time.perf_counter() + seconds
            tokens = messages = 0
            firsts: list[float] = []

            async def worker(index: int) -> None:
                nonlocal tokens, messages
                n = 0
                while time.perf_counter() < deadline:
                    request = llm_pb2.GenerateRequest(
                        request_id=f"{os.getpid()}-{index}-{n}",
                        token_ids=llm_pb2.TokenIds(ids=list(range(1, 65))),
                        sampling=llm_pb2.SamplingParams(max_tokens=max_tokens, temperature=0),
                    )
                    n += 1
                    sent, first = time.perf_counter(), True
                    async for response in stub.Generate(request):
                        if first:
                            firsts.append(time.perf_counter() - sent)
                            first = False
                        tokens += len(response.token_ids)
                        messages += 1

            await asyncio.gather(*(worker(i) for i in range(streams)))
            results.put((tokens, messages, firsts))

    asyncio.run(main())


def measure(port, server_pid, concurrency, processes, max_tokens, seconds, py_spy="") -> dict:
    results = mp.Queue()
    share = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    clients = [mp.Process(target=client, args=(port, n, max_tokens, seconds, results)) for n in share if n]
    cpu0, t0 = process_cpu_s(server_pid), time.perf_counter()
    for process in clients:
        process.start()
    spy = None
    if py_spy:  # folded stacks of the service process for most of the level
        import subprocess

        command = ["py-spy", "record", "-p", str(server_pid), "-r", "250", "-d", str(int(seconds) - 1), "-f", "raw"]
        spy = subprocess.Popen([*command, "-o", f"{py_spy}_c{concurrency}.txt"], stdout=subprocess.DEVNULL)
    collected = [results.get() for _ in clients]
    wall, cpu = time.perf_counter() - t0, process_cpu_s(server_pid) - cpu0
    for process in clients:
        process.join()
    if spy is not None:
        spy.wait()
    tokens = sum(r[0] for r in collected)
    messages = sum(r[1] for r in collected)
    firsts = [f for r in collected for f in r[2]]
    return {
        "tokens_per_s": tokens / wall,
        "messages_per_s": messages / wall,
        "server_cpu_per_s": cpu / wall,
        "us_per_token": 1e6 * cpu / max(1, tokens),
        "us_per_message": 1e6 * cpu / max(1, messages),
        "first_p50_ms": 1000 * statistics.median(firsts) if firsts else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--step-ms", type=float, default=4.0, help="the stand-in engine's step")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--client-processes", type=int, default=1)
    parser.add_argument("--py-spy", default="", help="py-spy the service process: folded stacks in PREFIX_cC.txt")
    parser.add_argument("--bare", action="store_true", help="a bare gRPC server instead of the service (serve_bare)")
    parser.add_argument("--profile", default="", help="cProfile the service process into this file")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    ports = ctx.Queue()
    read, write = os.pipe()
    server = ctx.Process(target=_serve_with_stdin, args=(ports, args.step_ms, args.profile, read, args.bare))
    server.start()
    os.close(read)
    try:
        port = ports.get(timeout=120)
        print(f"{'bare gRPC server' if args.bare else 'the service'}: stand-in engine step {args.step_ms} ms, "
              f"{args.max_tokens} tokens per request, {args.client_processes} client process(es), {args.seconds} s per "
              f"level; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)  # fmt: skip
        print(f"{'C':>4} {'tokens/s':>9} {'msgs/s':>8} {'svc CPU-s/s':>11} {'us/token':>9} {'us/msg':>7} "
              f"{'first p50 ms':>12}", flush=True)  # fmt: skip
        for concurrency in args.concurrency:
            row = measure(port, server.pid, concurrency, args.client_processes, args.max_tokens, args.seconds,
                          args.py_spy)  # fmt: skip
            print(f"{concurrency:>4} {row['tokens_per_s']:>9.0f} {row['messages_per_s']:>8.0f} "
                  f"{row['server_cpu_per_s']:>11.2f} {row['us_per_token']:>9.1f} {row['us_per_message']:>7.1f} "
                  f"{row['first_p50_ms']:>12.1f}", flush=True)  # fmt: skip
    finally:
        os.close(write)  # the service process stops at the end of its stdin
        server.join(30)
        if server.is_alive():
            server.kill()


def _serve_with_stdin(ports, step_ms, profile, read_fd, bare) -> None:
    sys.stdin = os.fdopen(read_fd)
    if bare:
        serve_bare(ports, step_ms)
    else:
        serve(ports, step_ms, profile)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    main()
