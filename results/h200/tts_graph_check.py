"""On a CUDA device: the batched TTS step replayed from its CUDA graphs equals the same step run eagerly.

`python3 results/h200/tts_graph_check.py [preset]`: two copies of the engine with the same weights and
seeds step three requests for 12 patches, one eagerly, one from the captured graph of bucket 4 (one
padding row); prints the largest difference of their audio and of their stop decisions.
"""

import sys
import time

import torch

from services.tts.backends.batched_engine import graph_buckets
from services.tts.backends.batched_model import BatchedVoxCPM
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import preset_path

preset = sys.argv[1] if len(sys.argv) > 1 else "tiny"


def engine(graphs: bool) -> BatchedVoxCPM:
    batched = BatchedVoxCPM(build_synthetic(preset_path(preset), 0, "cuda"), 8, cache_positions=256)
    if graphs:
        started = time.perf_counter()
        batched.capture_graphs(graph_buckets(8), 10, 2.0)
        print(f"{preset}: captured buckets {sorted(batched.graphs)} in {time.perf_counter() - started:.2f} s")
    batched.prefill([0, 1, 2], [batched.text_tokens("The quick brown fox jumps.")] * 3)
    return batched


eager, graphed = engine(False), engine(True)
generators = {name: [torch.Generator().manual_seed(i) for i in range(3)] for name in ("eager", "graphed")}
worst, stops_differ = 0.0, 0
timings = {"eager": [], "graphed": []}
for _ in range(12):
    results = {}
    for name, batched in (("eager", eager), ("graphed", graphed)):
        noise = torch.stack([batched.noise(g) for g in generators[name]])
        torch.cuda.synchronize()
        started = time.perf_counter()
        results[name] = batched.step([0, 1, 2], [10] * 3, [2.0] * 3, noise)
        timings[name].append(time.perf_counter() - started)
    worst = max(worst, (results["eager"][0] - results["graphed"][0]).abs().max().item())
    stops_differ += results["eager"][1] != results["graphed"][1]
print(f"{preset}: graph vs eager audio max |diff| {worst:.3g}, steps with differing stops {stops_differ}")
for name, values in timings.items():
    print(f"{preset}: {name} step at 3 rows, median {1000 * sorted(values)[len(values) // 2]:.2f} ms")
