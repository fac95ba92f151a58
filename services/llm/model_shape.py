"""What each engine step must read and compute, derived from the shape of a Qwen3 (Llama-style) decoder.

These are the numbers behind the live utilisation gauges: the service adds them to
`voiceagent_llm_model_read_bytes_total` and `voiceagent_llm_model_flops_total` for every engine step, so
rate(read bytes) / measured read bandwidth is model bandwidth utilisation (MBU) and rate(FLOPs) / measured
matmul peak is model FLOP utilisation (MFU). They count what the model *must* do, not what a kernel happens
to do, so a slow kernel shows up as low utilisation rather than as more work.

Symbols: L layers, d hidden size, H attention heads, K key/value heads, h head dim, f MLP intermediate
size, V vocabulary, b_w bytes per weight, b_kv bytes per KV-cache element.

    P_layer = d·h·(H + 2K)  +  H·h·d  +  3·d·f         weights of one layer's matmuls: q,k,v | o | gate,up,down
    P_lin   = L·P_layer + d·V                           every matmul weight, the LM head included

One engine step advances a batch of requests; request r gets n_r new tokens at positions c_r+1 … c_r+n_r,
c_r being the tokens already in its KV cache (prefix-cache hits included). A prefill step has n_r = prompt
tokens not cached; a decode step has n_r = 1. R is the number of requests in the step (each samples one
token, so R rows of logits).

    read bytes = b_w·P_lin                              weights, read once per step however large the batch
               + b_w·d·Σ n_r                            embedding rows of the new tokens
               + b_kv·2·L·K·h·Σ (c_r + n_r)             keys and values of every request's whole context
    FLOPs      = 2·L·P_layer·Σ n_r                      projections and MLP: 2 FLOPs per weight per token
               + 4·L·H·h·Σ_r Σ_{p=c_r+1}^{c_r+n_r} p    attention: QKᵀ and AV, 2·h each per (query, key) pair
               + 2·d·V·R                                 LM head, one row of logits per request

Left out as small next to these: norms, rotary embeddings, softmax and activation functions (O(d) per
token), activations (they stay in cache) and KV-cache writes. At batch 1 decode the step is dominated by
b_w·P_lin (bandwidth-bound); FLOPs per byte grow with the batch until the ridge point of the device.

The per-step weight term is recorded by the engine's stat logger once per step (`step_weight_bytes`); the
per-request terms are recorded as each request's tokens arrive (`prefill_work`, `decode_work`), which
sums to the same totals.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Work:
    flops: float
    read_bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.read_bytes + other.read_bytes)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    weight_bytes_per_param: int  # b_w
    kv_bytes_per_element: int  # b_kv
    qk_norm: bool = True  # Qwen3 normalises q and k per head

    @classmethod
    def from_hf_config(cls, config: Any, weight_bytes: int, kv_bytes: int) -> ModelShape:
        """From a transformers config object (or a config.json mapping)."""
        get = config.get if isinstance(config, Mapping) else lambda key, default=None: getattr(config, key, default)
        heads = get("num_attention_heads")
        return cls(
            layers=get("num_hidden_layers"),
            hidden_size=get("hidden_size"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            intermediate_size=get("intermediate_size"),
            vocab_size=get("vocab_size"),
            tied_embeddings=bool(get("tie_word_embeddings", False)),
            weight_bytes_per_param=weight_bytes,
            kv_bytes_per_element=kv_bytes,
            qk_norm=str(get("model_type", "")).startswith("qwen3"),
        )

    @functools.cached_property
    def layer_matmul_params(self) -> int:
        """P_layer."""
        d, h = self.hidden_size, self.head_dim
        return d * h * (self.heads + 2 * self.kv_heads) + self.heads * h * d + 3 * d * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """P_lin: what a step multiplies by, LM head included (the embedding is gathered, not multiplied)."""
        return self.layers * self.layer_matmul_params + self.hidden_size * self.vocab_size

    @property
    def parameter_count(self) -> int:
        d = self.hidden_size
        norms = self.layers * (2 * d + (2 * self.head_dim if self.qk_norm else 0)) + d
        embeddings = self.vocab_size * d * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_matmul_params + norms + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.parameter_count * self.weight_bytes_per_param

    @property
    def step_weight_bytes(self) -> int:
        """b_w·P_lin: weights every step reads once."""
        return self.matmul_params * self.weight_bytes_per_param

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """b_kv·2·L·K·h: one token's keys and values over all layers."""
        return self.kv_bytes_per_element * 2 * self.layers * self.kv_heads * self.head_dim

    @functools.cached_property
    def flops_per_token(self) -> int:
        """2·L·P_layer: projections and MLP for one new token."""
        return 2 * self.layers * self.layer_matmul_params

    @functools.cached_property
    def attention_flops_per_pair(self) -> int:
        """4·L·H·h: attention FLOPs for one (query, key) pair over all layers."""
        return 4 * self.layers * self.heads * self.head_dim

    @functools.cached_property
    def logits_flops(self) -> int:
        """2·d·V: one row of logits."""
        return 2 * self.hidden_size * self.vocab_size

    def _tokens_work(self, new_tokens: int, cached: int, logits_rows: int) -> Work:
        """Per-request terms of one step: `new_tokens` at positions cached+1 … cached+new_tokens."""
        context = cached + new_tokens
        pairs = (context * (context + 1) - cached * (cached + 1)) // 2  # Σ p for p = cached+1 … context
        flops = (
            self.flops_per_token * new_tokens + self.attention_flops_per_pair * pairs + self.logits_flops * logits_rows
        )
        read_bytes = self.weight_bytes_per_param * self.hidden_size * new_tokens + self.kv_bytes_per_token * context
        return Work(float(flops), float(read_bytes))

    def prefill_work(self, prompt_tokens: int, cached_tokens: int) -> Work:
        """The step that processes a prompt (minus its prefix-cache hits) and samples the first token."""
        return self._tokens_work(prompt_tokens - cached_tokens, cached_tokens, 1)

    def decode_work(self, prompt_tokens: int, first: int, last: int) -> Work:
        """The decode steps that sampled generated tokens number `first` … `last` (1-based, first >= 2).

        Token j comes from the step that feeds token j-1 back in at position prompt + j - 1: `_tokens_work(1,
        prompt + j - 2, 1)` summed over j, in closed form (the service counts every delta of every stream: a loop
        over its tokens was ~5 % of the front end's CPU at 13 k tokens/s, results/cpu/llm_frontend_cpu_2026-12-07)."""
        steps = last - first + 1
        if steps <= 0:
            return Work(0.0, 0.0)
        positions = steps * (2 * prompt_tokens + first + last - 2) // 2  # Σ (prompt + j - 1), j = first … last
        flops = (self.flops_per_token + self.logits_flops) * steps + self.attention_flops_per_pair * positions
        read_bytes = self.weight_bytes_per_param * self.hidden_size * steps + self.kv_bytes_per_token * positions
        return Work(float(flops), float(read_bytes))

    def facts(self) -> dict[str, float]:
        """Shape facts for the info RPC: enough for the load generator to predict any step's work."""
        return {
            "layers": self.layers,
            "hidden_size": self.hidden_size,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tied_embeddings": int(self.tied_embeddings),
            "weight_bytes_per_param": self.weight_bytes_per_param,
            "kv_bytes_per_element": self.kv_bytes_per_element,
            "step_weight_bytes": self.step_weight_bytes,
            "embedding_bytes_per_token": self.weight_bytes_per_param * self.hidden_size,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "flops_per_token": self.flops_per_token,
            "attention_flops_per_pair": self.attention_flops_per_pair,
            "logits_flops_per_row": self.logits_flops,
        }
