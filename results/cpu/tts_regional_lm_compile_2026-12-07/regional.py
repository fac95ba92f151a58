"""Feasibility (CPU, tiny preset): the LM layers' glue compiled by region, one compiled pre/post function that every
layer takes, the in-place K/V write and the SDPA left eager between them; equal to the eager `_lm_step`? how many
graphs? See README.md."""

import math
import sys
import time

import torch
from torch import nn
from torch._dynamo.utils import counters
from voxcpm.modules.minicpm4.model import apply_rotary_pos_emb

from services.tts.backends.batched_model import BatchedVoxCPM, _lm_step
from services.tts.backends.voxcpm import WorkerSpec, load_model
from services.tts.config import TtsConfig


def pre(layer, x, cos, sin):
    """Input norm, q/k/v projections, RoPE: what comes before the cache write."""
    attn, rows = layer.self_attn, x.size(0)
    hidden = layer.input_layernorm(x)
    query = attn.q_proj(hidden).view(rows, attn.num_heads, 1, attn.head_dim)
    key = attn.k_proj(hidden).view(rows, attn.num_key_value_heads, 1, attn.head_dim)
    value = attn.v_proj(hidden).view(rows, attn.num_key_value_heads, 1, attn.head_dim)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    return query, key, value


def post(layer, x, attended, scale: float):
    """Output projection, residual, post-attention norm, MLP, residual: what comes after the SDPA."""
    attn, rows = layer.self_attn, x.size(0)
    x = x + attn.o_proj(attended.reshape(rows, attn.num_heads * attn.head_dim)) * scale
    return x + layer.mlp(layer.post_attention_layernorm(x)) * scale


torch._logging.set_logs(recompiles=True)  # each recompile and the guard that caused it
compiled_pre = torch.compile(pre, fullgraph=True)
compiled_post = torch.compile(post, fullgraph=True)


def regional_lm_step(lm, cache, slots, positions, x, length):
    """`_lm_step` with the glue compiled: the same cache writes, gathers and SDPA, eagerly."""
    mask = (torch.arange(length, device=x.device) <= positions[:, None]).view(-1, 1, 1, length)
    cos, sin = lm.rope_emb(positions)
    cos, sin = cos[:, None, None, :], sin[:, None, None, :]
    for index, layer in enumerate(lm.layers):
        scale = layer.scale_depth / math.sqrt(layer.num_hidden_layers) if layer.use_mup else 1.0
        query, key, value = compiled_pre(layer, x, cos, sin)
        layer_cache = cache[index]
        layer_cache[0, slots, :, positions] = key[:, :, 0]
        layer_cache[1, slots, :, positions] = value[:, :, 0]
        keys = layer_cache[0, :, :, :length].index_select(0, slots)
        values = layer_cache[1, :, :, :length].index_select(0, slots)
        attended = nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
        x = compiled_post(layer, x, attended, scale)
    return lm.norm(x)


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
            regional = regional_lm_step(lm, regional_cache, slots, positions, x, 64)
            regional_ms = 1e3 * (time.perf_counter() - started)
        out = float((eager - regional).abs().max())
        kv = float((eager_cache - regional_cache).abs().max())
        print(
            f"rows {rows}: max|diff| out {out:.3g} cache {kv:.3g}; eager {eager_ms:.1f} ms, regional "
            f"{regional_ms:.1f} ms; graphs compiled so far {counters['stats']['unique_graphs']}"
        )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny")
