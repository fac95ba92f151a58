"""The FastConformer encoder's self-attention and convolution module in fewer, larger kernels (`--fused-encoder`).

Why: profiled on an H100 (results/h200/README.md, v6), a steady 320 ms step of nemotron-0.6b at 1,024 rows took
121 ms, of which 33 ms were copies inside NeMo's relative-position attention and 21 ms the convolution module's
pointwise convolutions (one cuDNN kernel per layer, 0.88 ms each, plus layout transposes), while the feed-forwards,
with more FLOPs, took 5.5 ms. NeMo's attention multiplies every row's queries by the positional projection of batch
1 with a broadcasting matmul, which materialises that projection once per row, and makes its transposed keys and
values contiguous for its batched matmuls. Here:
- the positional term is one matmul per head over all rows' queries (einsum: no per-row copy of the projection);
- keys and values stay in their projection's layout and go to scaled_dot_product_attention with the positional term
  as its float bias, scaled and masked as NeMo's own SDPA path does (`use_pytorch_sdpa`);
- the pointwise convolutions (kernel 1) are linear layers on the [batch, time, channels] activations, with the same
  weights, and only the depthwise convolution sees the channels-first layout.
The same arithmetic in another order: outputs equal NeMo's to float rounding (tests/asr/test_fused_encoder.py). Only
inference: `install` replaces the modules' forward methods on one model instance.
"""

from __future__ import annotations

import math
import types

import torch
from nemo.collections.asr.parts.submodules.multi_head_attention import INF_VAL
from nemo.utils import avoid_float16_autocast_context
from torch.nn import functional


def install(encoder) -> int:
    """Replace the forward of every relative-position attention and convolution module of `encoder`; how many."""
    replaced = 0
    for module in encoder.modules():
        kind = type(module).__name__
        if kind == "RelPositionMultiHeadAttention":
            module.forward = types.MethodType(_attention_forward, module)
            replaced += 1
        elif kind == "ConformerConvolution":
            module.forward = types.MethodType(_convolution_forward, module)
            replaced += 1
    return replaced


def _attention_forward(self, query, key, value, mask, pos_emb, cache=None):
    """RelPositionMultiHeadAttention.forward (NeMo 3.0) without per-row copies; the same inputs and outputs."""
    key, value, query, cache = self.update_cache(key=key, value=value, query=query, cache=cache)
    if torch.is_autocast_enabled():  # as NeMo: attention in float32 under autocast
        query, key, value = query.float(), key.float(), value.float()
    with avoid_float16_autocast_context():  # as NeMo
        out = _attend(self, query, key, value, mask, pos_emb)
    return out if cache is None else (out, cache)


def _attend(self, query, key, value, mask, pos_emb):
    """The attention proper of `_attention_forward`, after the cache update."""
    batch, time1 = query.shape[:2]
    heads, width = self.h, self.d_k
    q = self.linear_q(query).view(batch, time1, heads, width)
    k = self.linear_k(key).view(batch, -1, heads, width).transpose(1, 2)  # [B, H, T2, d]: a view
    v = self.linear_v(value).view(batch, -1, heads, width).transpose(1, 2)
    positions = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, heads, width)  # [1 or B, P, H, d]
    with_u = (q + self.pos_bias_u).transpose(1, 2)  # [B, H, T1, d]
    with_v = q + self.pos_bias_v  # [B, T1, H, d]
    if positions.size(0) == 1:  # one table for every row: a matmul per head over all rows' queries
        bd = torch.einsum("bthd,phd->bhtp", with_v, positions[0])
    else:
        bd = torch.einsum("bthd,bphd->bhtp", with_v, positions)
    bd = self.rel_shift(bd)[:, :, :, : k.size(-2)] * (1 / math.sqrt(width))
    if mask is not None:
        bd = bd.masked_fill(mask.unsqueeze(1), -INF_VAL)
    dropout = self.dropout_rate if self.training else 0.0
    out = functional.scaled_dot_product_attention(with_u, k, v, attn_mask=bd, dropout_p=dropout)
    if mask is not None:  # a row whose positions are all masked attends to nothing (NeMo's manual path: zeros)
        out = out.masked_fill(torch.all(mask, dim=-1)[:, None, :, None], 0.0)
    return self.linear_out(out.transpose(1, 2).reshape(batch, time1, heads * width))


def _convolution_forward(self, x, pad_mask=None, cache=None):
    """ConformerConvolution.forward (NeMo 3.0) with its pointwise convolutions as linear layers on [B, T, C]."""
    first, second = self.pointwise_conv1, self.pointwise_conv2
    x = functional.linear(x, first.weight.squeeze(-1), first.bias)  # [B, T, 2C]
    glu = self.pointwise_activation == "glu_"
    x = functional.glu(x, dim=-1) if glu else self.pointwise_activation(x)
    if pad_mask is not None:
        x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
    x = self.depthwise_conv(x.transpose(1, 2), cache=cache)  # channels first for the depthwise convolution
    if cache is not None:
        x, cache = x
    layer_norm = self.norm_type == "layer_norm"
    x = self.batch_norm(x.transpose(1, 2)).transpose(1, 2) if layer_norm else self.batch_norm(x)
    x = self.activation(x)
    x = functional.linear(x.transpose(1, 2), second.weight.squeeze(-1), second.bias)  # [B, T, C]
    return x if cache is None else (x, cache)
