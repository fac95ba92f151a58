"""On a CUDA device: the prefill replayed from its CUDA graphs equals the eager prefill, and what it costs the host.

`python3 results/h200/tts_prefill_graph_check.py [preset]` (default voxcpm2). One engine (64 slots, cache 512) captures
the prefill per (rows, tokens) bucket as the service does with `--prefill-graphs`
(batched_engine.PREFILL_ROWS x PREFILL_TOKENS), then:

- prefills 1, 3 and 8 texts eagerly into some slots and from the graphs into others; prints the largest difference
  of the slots' hidden states and of their K/V within each text's length (bf16 rounding of other GEMM shapes only);
- times a prefill of 1, 8 and 32 segments both ways: host time of the call (what a join costs the engine's host, the
  bound of README §3f) and device time to done, median of 20.
"""

import sys
import time

import torch

from services.tts.backends.batched_engine import PREFILL_ROWS, PREFILL_TOKENS
from services.tts.backends.batched_model import BatchedVoxCPM
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import preset_path

preset = sys.argv[1] if len(sys.argv) > 1 else "voxcpm2"
SLOTS = 64
engine = BatchedVoxCPM(build_synthetic(preset_path(preset), 0, "cuda"), SLOTS, cache_positions=512)
started = time.perf_counter()
engine.capture_prefill_graphs(list(PREFILL_ROWS), [t for t in PREFILL_TOKENS if t < engine.max_length])
print(f"{preset}: captured {len(engine.prefill_graphs)} prefill graphs in {time.perf_counter() - started:.1f} s")
words = [
    "Streaming",
    "speech",
    "starts",
    "before",
    "the",
    "sentence",
    "ends",
    "and",
    "every",
    "voice",
    "joins",
    "the",
    "batch",
]
texts = [" ".join(words[: 3 + (i * 5) % len(words)]) for i in range(32)]
graphs = engine.prefill_graphs

for rows in (1, 3, 8):
    tokens = [engine.text_tokens(t) for t in texts[:rows]]
    eager_slots, graph_slots = list(range(rows)), list(range(32, 32 + rows))
    engine.prefill_graphs = {}
    engine.prefill(eager_slots, tokens)
    engine.prefill_graphs = graphs
    engine.prefill(graph_slots, tokens)
    torch.cuda.synchronize()
    worst_hidden, worst_kv = 0.0, 0.0
    for row, (a, b) in enumerate(zip(eager_slots, graph_slots, strict=True)):
        length = len(tokens[row]) + 1
        worst_hidden = max(worst_hidden, (engine.lm_hidden[a] - engine.lm_hidden[b]).abs().max().item())
        for cache in engine.caches.values():
            difference = (cache[:, :, a, :, :length].float() - cache[:, :, b, :, :length].float()).abs().max().item()
            worst_kv = max(worst_kv, difference)
        assert engine.positions[a] == engine.positions[b] == length
    print(f"{preset}: {rows} rows, graph vs eager prefill: hidden max |diff| {worst_hidden:.3g}, K/V {worst_kv:.3g}")

for rows in (1, 8, 32):
    tokens = [engine.text_tokens(t) for t in texts[:rows]]
    for name, table in (("eager", {}), ("graph", graphs)):
        engine.prefill_graphs = table
        host, device = [], []
        for _ in range(20):
            torch.cuda.synchronize()
            began = time.perf_counter()
            engine.prefill(list(range(rows)), tokens)
            host.append(time.perf_counter() - began)
            torch.cuda.synchronize()
            device.append(time.perf_counter() - began)
        median = lambda values: 1000 * sorted(values)[len(values) // 2]  # noqa: E731
        print(
            f"{preset}: prefill of {rows} segments, {name}: host {median(host):.2f} ms, to done {median(device):.2f} ms"
        )
