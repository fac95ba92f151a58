"""Issue 18's candidate (results/h200 §4e): does a step cost the vLLM engine core more when its outputs go to
several front ends? vLLM's engine core puts one EngineCoreOutputs per client per step on its output queue; its
output thread msgpack-encodes each and sends it on that client's ZMQ socket, holding the interpreter lock that the
engine's busy loop needs. This times exactly that (vLLM's own MsgpackEncoder, EngineCoreOutput(s) and ZMQ PUSH
sockets, one receiving process per front end decoding as AsyncLLM does), per step, for the same requests spread
over 1 or N clients:

    .venv/llm/bin/python results/cpu/llm_output_fanout_2026-12-06/llm_output_fanout.py \
        [--steps 3000] [--clients 1 4] [--requests 16 64 256]

It measures the output thread's cost only; the engine core's own per-client bookkeeping in the step and the front
ends' decoding (in their own processes) are not in it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time

import zmq
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder


def receive(path: str, steps: int) -> None:
    """A front end's output side: pull and decode every message."""
    decoder = MsgpackDecoder(EngineCoreOutputs)
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as socket:
        socket.connect(path)
        for _ in range(steps):
            decoder.decode(socket.recv_multipart(copy=False))


def step_outputs(requests: int, clients: int, step: int) -> list[EngineCoreOutputs]:
    """One decode step's outputs: one new token for each of `requests`, spread over `clients` (round robin)."""
    per_client: list[list[EngineCoreOutput]] = [[] for _ in range(clients)]
    for index in range(requests):
        per_client[index % clients].append(EngineCoreOutput(request_id=f"req-{index}", new_token_ids=[step % 151000]))
    return [EngineCoreOutputs(outputs=outputs, timestamp=time.monotonic()) for outputs in per_client]


def measure(requests: int, clients: int, steps: int) -> tuple[float, float]:
    """Median and p90 µs per step to encode and send the step's messages (the output thread's work)."""
    folder = tempfile.mkdtemp()
    paths = [f"ipc://{folder}/out{c}" for c in range(clients)]
    with zmq.Context() as ctx:
        sockets = [ctx.socket(zmq.PUSH) for _ in paths]
        for socket, path in zip(sockets, paths, strict=True):
            socket.bind(path)
        receivers = [mp.Process(target=receive, args=(path, steps)) for path in paths]
        for process in receivers:
            process.start()
        encoder = MsgpackEncoder()
        times = []
        for step in range(steps):
            messages = step_outputs(requests, clients, step)  # built by the step, not timed
            started = time.perf_counter()
            for socket, message in zip(sockets, messages, strict=True):
                socket.send_multipart(encoder.encode(message), copy=False)
            times.append(time.perf_counter() - started)
        for process in receivers:
            process.join()
        for socket in sockets:
            socket.close(linger=0)
    times = sorted(t * 1e6 for t in times[steps // 10 :])  # the first tenth warms up
    return statistics.median(times), times[int(len(times) * 0.9)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, nargs="+", default=[16, 64, 256])
    args = parser.parse_args()
    print("requests  clients  encode+send per step: median us  p90 us")
    for requests in args.requests:
        for clients in args.clients:
            median, p90 = measure(requests, clients, args.steps)
            print(f"{requests:8d}  {clients:7d}  {median:30.1f}  {p90:6.1f}")


if __name__ == "__main__":
    main()
