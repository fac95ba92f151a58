"""Pickling one step's patches at 256 rows, as 256 Patch messages or one Patches message (what the TTS engine's
Channel does per step), and unpickling and splitting them (the gRPC process).

    .venv/tts/bin/python results/cpu/tts_patches_2026-12-04/patches_bench.py
"""

import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from services.tts.backends.batched_engine import Patch, Patches  # noqa: E402

audio = np.random.rand(256, 7680).astype(np.float32)  # one 160 ms patch per row at 48 kHz


def per_request() -> bytes:
    return pickle.dumps([Patch(i, 0, audio[i], 0) for i in range(256)], protocol=pickle.HIGHEST_PROTOCOL)


def one_message() -> bytes:
    return pickle.dumps([Patches(audio, tuple((i, 0, 0) for i in range(256)))], protocol=pickle.HIGHEST_PROTOCOL)


for name, build in (("256 Patch messages", per_request), ("one Patches message", one_message)):
    dumps, loads = [], []
    for _ in range(30):
        started = time.perf_counter()
        frame = build()
        pickled = time.perf_counter()
        messages = pickle.loads(frame)
        if isinstance(messages[0], Patches):
            messages = messages[0].split()
        dumps.append(pickled - started)
        loads.append(time.perf_counter() - pickled)
    print(f"{name}: engine build+pickle median {1000 * statistics.median(dumps):.2f} ms, gRPC side unpickle+split "
          f"{1000 * statistics.median(loads):.2f} ms, frame {len(frame) / 1e6:.2f} MB")  # fmt: skip
