"""The TTS service under steady load with cancels: resident memory of its gRPC process and engine child over time.

    .venv/tts/bin/python -m services.tts &   # small preset, batched engine (the defaults)
    .venv/dev/bin/python results/cpu/soak_2026-12-06/tts_rss_probe.py 600 3 50053 <pid of the service>

Arguments: seconds, clients, port, the service's pid. Each client sends texts of 3-30 words back to back and
cancels a request at a chunk with probability 2 %; every 30 s one line: requests, cancels, RSS MiB per process.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from voiceagent.v1 import tts_pb2, tts_pb2_grpc  # noqa: E402

SENTENCE = "the quick brown fox jumps over a lazy dog while seven bright stars hang above the quiet river town"


def children(pid: int) -> list[int]:
    found = []
    try:
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            found += [int(child), *children(int(child))]
    except OSError:
        pass
    return found


def rss_mib(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(line.split()[1] for line in status if line.startswith("VmRSS:"))) / 1024
    except OSError:
        return 0.0


def client(seed: int, port: int, stop: float, counts: list[int]) -> None:
    rng = random.Random(seed)
    stub = tts_pb2_grpc.SpeechSynthesizerStub(grpc.insecure_channel(f"localhost:{port}"))
    while time.monotonic() < stop:
        text = " ".join(rng.choice(SENTENCE.split()) for _ in range(rng.randint(3, 30))) + "."
        call = stub.Synthesize(tts_pb2.SynthesizeRequest(text=text), timeout=120)
        try:
            for _chunk in call:
                if rng.random() < 0.02:
                    call.cancel()
                    counts[1] += 1
                    break
            counts[0] += 1
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                print("error", error.code(), error.details())


def main() -> None:
    seconds, clients, port, pid = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    stop, counts = time.monotonic() + seconds, [0, 0]
    threads = [threading.Thread(target=client, args=(i, port, stop, counts)) for i in range(clients)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    while any(thread.is_alive() for thread in threads):
        memory = " ".join(f"{p}:{rss_mib(p):.0f}" for p in [pid, *children(pid)])
        elapsed = time.monotonic() - started
        print(f"{elapsed:6.0f}s requests {counts[0]:5d} cancels {counts[1]:3d} rss {memory}", flush=True)
        time.sleep(30)


if __name__ == "__main__":
    main()
