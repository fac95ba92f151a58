"""Feasibility (CPU, tiny or small preset): the LM layers' glue compiled by region, one compiled function before and
one after each layer's eager K/V write and attention, taken by every layer (`_layer_in`, `_layer_out` of the batched
model, which `BatchedVoxCPM.compile(("lm-glue",))` now uses); equal to the eager `_lm_step`? how many graphs? See
README.md."""

import sys
import time

import torch
from torch._dynamo.utils import counters

from services.tts.backends.batched_model import BatchedVoxCPM, _layer_in, _layer_out, _lm_step
from services.tts.backends.voxcpm import WorkerSpec, load_model
from services.tts.config import TtsConfig

torch._logging.set_logs(recompiles=True)  # each recompile and the guard that caused it
GLUE = tuple(torch.compile(part, fullgraph=True) for part in (_layer_in, _layer_out))


def main(preset: str) -> None:
    torch.manual_seed(0)
    model = load_model(WorkerSpec.from_config(TtsConfig(preset=preset)))
    engine = BatchedVoxCPM(model, 8, 64)
    lm, cache = model.base_lm, engine.caches["base"]
    print(preset, "layers", len(lm.layers), "dtype", next(lm.parameters()).dtype)
    for rows in (1, 2, 4, 8, 3):
        with torch.inference_mode():  # as the engine runs: every tensor an inference tensor
            slots, positions = torch.arange(rows), torch.full((rows,), 5)
            x = torch.randn(rows, lm.config.hidden_size, dtype=cache.dtype)
            eager_cache, regional_cache = cache.clone(), cache.clone()
            started = time.perf_counter()
            eager = _lm_step(lm, eager_cache, slots, positions, x, 64)
            eager_ms, started = 1e3 * (time.perf_counter() - started), time.perf_counter()
            regional = _lm_step(lm, regional_cache, slots, positions, x, 64, glue=GLUE)
            regional_ms = 1e3 * (time.perf_counter() - started)
        out = float((eager - regional).abs().max())
        kv = float((eager_cache - regional_cache).abs().max())
        print(
            f"rows {rows}: max|diff| out {out:.3g} cache {kv:.3g}; eager {eager_ms:.1f} ms, regional "
            f"{regional_ms:.1f} ms; graphs compiled so far {counters['stats']['unique_graphs']}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
