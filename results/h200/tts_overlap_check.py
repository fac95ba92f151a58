"""On a CUDA device: prefilling new requests while a launched step runs changes no audio, syncs nothing, saves time.

`python3 results/h200/tts_overlap_check.py [preset] [running] [joining]` (default tiny 6 2). One engine with CUDA
graphs; `running` requests step for 3 patches, then `joining` requests join, twice from the same state:

- in turn: prefill the joiners, then step the running ones (what the engine did before);
- overlapped: launch the running ones' step, prefill the joiners while it is on the device (on the prefill's own
  stream), read the step back (`BatchedVoxCPM.launch`, what the engine does now).

Then every request steps 4 more patches. Prints the largest audio difference between the two orders (0 expected:
the joiners' slots are not in the launched step), the synchronizing CUDA calls the overlapped prefill made (under
torch.cuda.set_sync_debug_mode("warn"); 0 expected), and the wall time of prefill + step in each order.
"""

import sys
import time
import traceback
import warnings

import torch

from services.tts.backends.batched_engine import graph_buckets
from services.tts.backends.batched_model import BatchedVoxCPM
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import preset_path

preset = sys.argv[1] if len(sys.argv) > 1 else "tiny"
running = int(sys.argv[2]) if len(sys.argv) > 2 else 6
joining = int(sys.argv[3]) if len(sys.argv) > 3 else 2
rows = running + joining
TEXT, JOIN_TEXT = "The quick brown fox jumps over the lazy dog.", "A new voice joins the batch."

model = build_synthetic(preset_path(preset), 0, "cuda")
engine = BatchedVoxCPM(model, rows, cache_positions=256)
engine.fold_weight_norm()
started = time.perf_counter()
engine.capture_graphs(graph_buckets(rows), 10, 2.0)
print(f"{preset}: captured buckets {sorted(engine.graphs)} in {time.perf_counter() - started:.1f} s", flush=True)
text, join_text = engine.text_tokens(TEXT), engine.text_tokens(JOIN_TEXT)


def noise_of(generators):
    return torch.stack([engine.noise(g) for g in generators])


def run(overlapped: bool):
    generators = [torch.Generator().manual_seed(i) for i in range(rows)]
    old, new = list(range(running)), list(range(running, rows))
    engine.prefill(old, [text] * running)
    audio = [engine.step(old, [10] * running, [2.0] * running, noise_of(generators[:running]))[0] for _ in range(3)]
    noise = noise_of(generators[:running])
    syncs = 0
    torch.cuda.synchronize()
    began = time.perf_counter()
    if overlapped:
        pending = engine.launch(old, [10] * running, [2.0] * running, noise)
        caught = []

        def note(message, category, filename, lineno, file=None, line=None):  # where each sync was called from
            if "synchroniz" in str(message):
                caught.append((str(message), traceback.format_stack(limit=8)[:-1]))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.prefill(new, [join_text] * joining)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = len(caught)
        if syncs and not overlapped_stacks_shown:
            overlapped_stacks_shown.append(True)
            for message, stack in caught:
                print(f"{preset}: sync: {message.splitlines()[0]}\n{''.join(stack)}", flush=True)
        audio.append(pending.result()[0])
    else:
        engine.prefill(new, [join_text] * joining)
        audio.append(engine.step(old, [10] * running, [2.0] * running, noise)[0])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    every = old + new
    for _ in range(4):
        audio.append(engine.step(every, [10] * rows, [2.0] * rows, noise_of(generators))[0])
    return audio, syncs, seconds


overlapped_stacks_shown: list[bool] = []
timings = {False: [], True: []}
for attempt in range(5):
    results = {}
    for overlapped in (False, True):
        results[overlapped] = run(overlapped)
        timings[overlapped].append(results[overlapped][2])
    if attempt == 0:
        worst = max((a - b).abs().max().item() for a, b in zip(results[False][0], results[True][0], strict=True))
        print(f"{preset}: overlapped vs in turn, audio max |diff| {worst:.3g} over {len(results[True][0])} steps")
        print(f"{preset}: synchronizing CUDA calls in the overlapped prefill: {results[True][1]}")
for overlapped, values in timings.items():
    name = "prefill behind the step" if overlapped else "prefill, then step"
    print(f"{preset}: {name}, {running} running + {joining} joining: median {1000 * sorted(values)[2]:.1f} ms")
