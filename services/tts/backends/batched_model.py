"""VoxCPM2 stepped in batches: every request in a fixed cache slot, one 160 ms patch per request per step.

`VoxCPM2Model` generates one request at a time: its LMs hold a K/V cache of batch 1, its audio VAE one
streaming state, and its diffusion noise comes from torch's global generator. `BatchedVoxCPM` keeps the
model's modules and weights and owns what has to be per request:

- a K/V cache per LM with `slots` rows of `max_length` positions; a request keeps its slot for its life;
- the hidden states and the conditioning patch carried from one step to the next, per slot;
- the audio VAE's causal-convolution state per slot (`_SlotVAEState`), so every slot's audio continues its
  own waveform;
- the noise: the caller draws each row's noise from the request's own seeded generator, so a request's
  audio does not depend on what shares its step.

A step (`step`) advances any set of generating slots by one patch, in the order of VoxCPM2's own loop:
local DiT solve (classifier-free guidance doubles the rows), local encoder of the new patch, VAE decode of
it, stop head, then base LM + FSQ + residual LM one position each. Rows with different diffusion step counts
share the step's LM and VAE work and run their DiT solves as one group per step count; `cfg_value` is a
per-row tensor, so it never splits a group. Prefill (`prefill`) runs VoxCPM2's own prefix forward for one
request at batch 1 and copies its K/V into the slot.

Speed-ups that keep the model's arithmetic (`fold_weight_norm`, `compile`; `capture_graphs` lets cuDNN pick its
convolution algorithms per captured shape) and one that changes it (`set_vae_dtype`: the audio VAE in bf16)
are methods the engine's builder calls; see their docstrings for what each removes from the step.

The step's phases are marked with `record_function` ranges (what results/h200/tts_profile.py attributes GPU time
to); without a running profiler a range is a few microseconds of host time, and a CUDA graph replays none.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import record_function
from voxcpm.model.voxcpm2 import VoxCPM2Model
from voxcpm.modules.audiovae.audio_vae_v2 import CausalConv1d, CausalTransposeConv1d
from voxcpm.modules.minicpm4.model import MiniCPMModel, apply_rotary_pos_emb

from services.tts.config import COMPILE_PARTS
from services.tts.context import BADCASE_EXTRA, BADCASE_RATIO

MIN_PATCHES = 2  # VoxCPM2's min_len: the stop head is not obeyed before patch 3
# the attention kernels BatchedVoxCPM.compile can hold the LocDiT solve to
SOLVER_ATTENTION = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def _layer_in(layer, x: torch.Tensor, position_emb):
    """A decoder layer up to its cache write: input norm, q/k/v projections [rows, heads, 1, head_dim], RoPE."""
    attn, rows = layer.self_attn, x.size(0)
    hidden = layer.input_layernorm(x)
    query = attn.q_proj(hidden).view(rows, attn.num_heads, 1, attn.head_dim)
    key = attn.k_proj(hidden).view(rows, attn.num_key_value_heads, 1, attn.head_dim)
    value = attn.v_proj(hidden).view(rows, attn.num_key_value_heads, 1, attn.head_dim)
    if position_emb is not None:
        query, key = apply_rotary_pos_emb(query, key, *position_emb)
    return query, key, value


def _layer_out(layer, x: torch.Tensor, attended: torch.Tensor, scale: float) -> torch.Tensor:
    """A decoder layer after its attention: output projection, residual, post-attention norm, MLP, residual."""
    attn = layer.self_attn
    x = x + attn.o_proj(attended.reshape(x.size(0), attn.num_heads * attn.head_dim)) * scale
    return x + layer.mlp(layer.post_attention_layernorm(x)) * scale


def _lm_step(
    lm: MiniCPMModel,
    cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    x: torch.Tensor,
    length: int,
    glue=(_layer_in, _layer_out),
):
    """One decoder position for each row: `x` [B, hidden] at `positions` [B] of cache rows `slots` [B].

    cache: [layers, 2 (k, v), slots, kv_heads, positions, head_dim]. Attention reads the first `length`
    positions (the longest row's, or the whole cache for a CUDA graph); shorter rows mask the rest. `glue` is
    what runs around each layer's cache write and attention (`BatchedVoxCPM.compile`'s "lm-glue" compiles it).
    """
    layer_in, layer_out = glue
    mask = (torch.arange(length, device=x.device) <= positions[:, None]).view(-1, 1, 1, length)
    position_emb = None
    if lm.rope_emb is not None:
        cos, sin = lm.rope_emb(positions)
        position_emb = cos[:, None, None, :], sin[:, None, None, :]
    for index, layer in enumerate(lm.layers):
        scale = layer.scale_depth / math.sqrt(layer.num_hidden_layers) if layer.use_mup else 1.0
        query, key, value = layer_in(layer, x, position_emb)
        layer_cache = cache[index]
        layer_cache[0, slots, :, positions] = key[:, :, 0]
        layer_cache[1, slots, :, positions] = value[:, :, 0]
        keys = layer_cache[0, :, :, :length].index_select(0, slots)
        values = layer_cache[1, :, :, :length].index_select(0, slots)
        attended = nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
        x = layer_out(layer, x, attended, scale)
    return lm.norm(x)


class _SlotVAEState:
    """Per-slot state of the VAE decoder's causal convolutions, swapped in for the rows being decoded.

    VoxCPM's own `StreamingVAEDecoder` keeps one state per convolution (batch 1 in practice); here each
    convolution keeps [slots, channels, context] and a decode reads and writes the rows of `self.rows`.
    A zero state equals VoxCPM's left padding, so resetting a slot starts a fresh waveform.
    """

    def __init__(self, decoder: nn.Module, slots: int, device: torch.device):
        self.rows = torch.zeros(1, dtype=torch.long, device=device)
        self.buffers: list[torch.Tensor] = []
        for module in decoder.modules():
            if isinstance(module, CausalConv1d):
                context = module._CausalConv1d__padding * 2 - module._CausalConv1d__output_padding
                if context > 0:
                    self._install(module, context, nn.Conv1d.forward, None, slots, device)
            elif isinstance(module, CausalTransposeConv1d):
                trim = module._CausalTransposeConv1d__padding * 2 - module._CausalTransposeConv1d__output_padding
                context = (module.kernel_size[0] - 1) // module.stride[0]
                if context > 0:
                    self._install(module, context, nn.ConvTranspose1d.forward, trim, slots, device)

    def _install(self, module: nn.Module, context: int, forward, trim: int | None, slots: int, device) -> None:
        state = torch.zeros(slots, module.in_channels, context, device=device, dtype=module.weight.dtype)
        self.buffers.append(state)

        def stateful_forward(x: torch.Tensor) -> torch.Tensor:
            extended = torch.cat([state.index_select(0, self.rows), x], dim=-1)
            state.index_copy_(0, self.rows, extended[:, :, -context:])
            out = forward(module, extended)
            if trim is None:
                return out
            left = context * module.stride[0]
            return out[..., left:-trim] if trim > 0 else out[..., left:]

        module.forward = stateful_forward  # weight-norm pre-hooks still run: they sit on __call__

    def reset(self, slots: torch.Tensor) -> None:
        """Zero the state of `slots` (a device tensor of slot indices): one kernel per convolution, no host sync."""
        for state in self.buffers:
            state.index_fill_(0, slots, 0)

    def to(self, dtype: torch.dtype) -> None:
        for state in self.buffers:
            state.data = state.data.to(dtype)


class BatchedVoxCPM:
    """The model's modules driven for `slots` requests at once (see the module docstring).

    `cache_positions` caps each slot's cache (text tokens + patches; VoxCPM2's own max_length of 8,192 is
    240 MB per slot at its real shape). One extra slot, `scratch`, takes the padding rows of a CUDA graph.
    """

    def __init__(self, model: VoxCPM2Model, slots: int, cache_positions: int = 0):
        self.model = model
        self.slots = slots
        self.scratch = slots
        config = model.config
        self.device = torch.device(model.device)
        self.dtype = next(model.base_lm.parameters()).dtype
        self.max_length = min(config.max_length, cache_positions or config.max_length)
        self.patch_size, self.feat_dim = model.patch_size, model.feat_dim
        hidden = config.lm_config.hidden_size
        self.scale_emb = config.lm_config.scale_emb if config.lm_config.use_mup else 1.0
        self.caches = {
            name: torch.zeros(
                lm.config.num_hidden_layers,
                2,
                slots + 1,
                lm.config.num_key_value_heads,
                self.max_length,
                lm.config.kv_channels or hidden // lm.config.num_attention_heads,
                device=self.device,
                dtype=self.dtype,
            )
            for name, lm in (("base", model.base_lm), ("residual", model.residual_lm))
        }
        # the LMs' own batch-1 caches are not used: free them
        model.base_lm.kv_cache = model.residual_lm.kv_cache = None
        self.lm_hidden = torch.zeros(slots + 1, hidden, device=self.device, dtype=self.dtype)
        self.residual_hidden = torch.zeros_like(self.lm_hidden)
        self.condition = torch.zeros(slots + 1, self.patch_size, self.feat_dim, device=self.device, dtype=self.dtype)
        self.positions = torch.zeros(slots + 1, dtype=torch.long, device=self.device)
        self.vae_state = _SlotVAEState(model.audio_vae.decoder, slots + 1, self.device)
        self.vae_dtype = next(model.audio_vae.parameters()).dtype  # float32 as VoxCPM2 runs it; see set_vae_dtype
        self._lm_step, self._vae_decode = _lm_step, model.audio_vae.decode  # compiled by `compile`
        self._uncompiled: tuple | None = None  # what `compile` replaced, for `uncompile`
        vae = model.audio_vae
        self.sample_rate_condition = torch.tensor(
            [getattr(vae, "out_sample_rate", vae.sample_rate)], device=self.device, dtype=torch.int32
        )
        self._t_spans: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, _GraphedStep] = {}  # by batch bucket, see capture_graphs
        self.graph_timesteps = 0
        self.prefill_graphs: dict[tuple[int, int], _GraphedPrefill] = {}  # by (rows, tokens) bucket
        # prefill's own stream on a GPU: its work runs beside a launched step, not behind it (see `prefill`)
        self.prefill_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # -- per request ------------------------------------------------------------------------------------
    def text_tokens(self, text: str) -> list[int]:
        return list(self.model.text_tokenizer(text))

    def patch_limit(self, tokens: int, cap: int) -> int:
        """Patches a segment of `tokens` text tokens may take: VoxCPM2's own cap, `cap`, and the cache's room."""
        room = self.max_length - tokens - 1  # the prefix holds tokens + 1 positions; each patch but the last adds one
        return max(0, min(int(tokens * BADCASE_RATIO + BADCASE_EXTRA), cap, room))

    @torch.inference_mode()
    def prefill(self, slots: list[int], token_lists: list[list[int]]) -> None:
        """Start a zero-shot generation of `token_lists[i]` in `slots[i]`: VoxCPM2's prefix forward, all rows in
        one pass. Rows are right-padded to the longest; attention is causal, so a row's K/V and last hidden
        state never see its padding.

        On a CUDA device it only enqueues work, on a stream of its own (inputs go up from pinned memory, nothing
        is read back), so it can run while a launched step (`launch`) is still on the device: beside it, writing
        slots that step does not use; the next launch waits for it. A slot is prefilled only once the last step
        that used it was read back, so the prefill never waits for the device's main stream."""
        stream = self.prefill_stream
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            self._prefill(slots, token_lists)

    def _prefill(self, slots: list[int], token_lists: list[list[int]]) -> None:
        model = self.model
        rows = len(slots)
        lengths = [len(tokens) + 1 for tokens in token_lists]  # + the audio-start token
        longest = max(lengths)
        key = prefill_bucket(self.prefill_graphs, rows, longest)
        padded_rows, padded_length = key or (rows, longest)
        text = torch.zeros(padded_rows, padded_length, dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            text[row, : lengths[row]] = torch.tensor([*tokens, model.audio_start_token])
        # padding rows prefill the scratch slot (as a step's padding rows step it), one token long
        slot_list = slots + [self.scratch] * (padded_rows - rows)
        length_list = lengths + [1] * (padded_rows - rows)
        inputs = [self._upload(torch.tensor(slot_list, dtype=torch.long)), self._upload(text)]
        inputs.append(self._upload(torch.tensor(length_list, dtype=torch.long)))
        if key is None:
            self._prefill_device(*inputs)
            return
        graph = self.prefill_graphs[key]
        for static, value in zip((graph.slots, graph.text, graph.lengths), inputs, strict=True):
            static.copy_(value)
        graph.graph.replay()

    def _prefill_device(self, index: torch.Tensor, text: torch.Tensor, length_tensor: torch.Tensor) -> None:
        """The prefill on the device, from device tensors only (what a prefill graph captures): slots `index` [R],
        right-padded tokens `text` [R, L] and each row's length [R]. Positions past a row's length get K/V of its
        padding; a step writes a position before it attends to it and masks the ones after, so they are never read."""
        model = self.model
        rows, longest = text.shape
        # VoxCPM2's prefix forward mixes text and audio-feature positions by two masks. A zero-shot prefix is all
        # text (text mask 1, feature mask 0), so its feature terms are multiplied by zero: the local encoder run over
        # rows x tokens zero patches (a 12-layer transformer per position on voxcpm2, ~40 % of the prefill's FLOPs)
        # and the FSQ of the base LM's output. They are left out: x·1 + y·0 = x for finite y, the same values.
        text_embed = model.base_lm.embed_tokens(text) * self.scale_emb
        outputs, base_kv = model.base_lm(inputs_embeds=text_embed, is_causal=True)
        residual_in = model.fusion_concat_proj(torch.cat((outputs, torch.zeros_like(outputs)), dim=-1))
        residual_out, residual_kv = model.residual_lm(inputs_embeds=residual_in, is_causal=True)
        last = length_tensor - 1
        for name, kv in (("base", base_kv), ("residual", residual_kv)):
            cache = self.caches[name]
            for layer, (key, value) in enumerate(kv):
                cache[layer, 0, index, :, :longest] = key
                cache[layer, 1, index, :, :longest] = value
        picked = torch.arange(rows, device=self.device)
        self.lm_hidden[index] = outputs[picked, last]
        self.residual_hidden[index] = residual_out[picked, last]
        self.condition.index_fill_(0, index, 0.0)  # zero-shot: the prefix's last audio patch is zeros
        self.positions[index] = length_tensor
        self.vae_state.reset(index)

    def noise(self, generator: torch.Generator) -> torch.Tensor:
        """One patch of diffusion noise [feat_dim, patch_size] from a request's own generator (on the CPU, so
        the same seed gives the same noise on every device)."""
        return torch.randn((1, self.feat_dim, self.patch_size), generator=generator, dtype=self.dtype)[0]

    def _upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device without waiting for the device: from pinned memory, asynchronously (torch
        keeps the pinned block until the copy is done). A plain copy would first wait for everything queued."""
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    # -- the batched step -------------------------------------------------------------------------------
    def _t_span(self, timesteps: int) -> torch.Tensor:
        """VoxCPM2's solver schedule (UnifiedCFM.forward): linspace 1→0 with sway sampling, coefficient 1."""
        if timesteps not in self._t_spans:
            span = torch.linspace(1, 0, timesteps + 1, device=self.device, dtype=self.dtype)
            self._t_spans[timesteps] = span + (torch.cos(torch.pi / 2 * span) - 1 + span)
        return self._t_spans[timesteps]

    def step(
        self, slots: list[int], timesteps: list[int], cfg_values: list[float], noise: torch.Tensor
    ) -> tuple[torch.Tensor, list[bool]]:
        """One patch for each slot, waited for: `launch(...).result()`."""
        return self.launch(slots, timesteps, cfg_values, noise).result()

    @torch.inference_mode()
    def launch(
        self, slots: list[int], timesteps: list[int], cfg_values: list[float], noise: torch.Tensor
    ) -> PendingStep:
        """Start one patch for each slot; its `result()` is (audio [rows, samples] float32 on the CPU, stop-head
        decision per row). On a CUDA device this returns once the work is enqueued (the outputs come back to
        pinned memory behind it), so the caller can prefill new requests while the step runs; on a CPU the
        step is done when this returns.

        noise: [rows, feat_dim, patch_size]. A row whose stop head fires (or that reached its limit) is done
        after this patch; its LM positions advance anyway (harmless: the slot is prefilled afresh before use).
        A batch whose rows all use the captured step count replays the CUDA graph of the smallest bucket that
        holds it (padding rows step the scratch slot); any other batch runs eagerly.
        """
        rows = len(slots)
        if self.prefill_stream is not None:  # the rows just prefilled are ready before this step reads them
            torch.cuda.current_stream().wait_stream(self.prefill_stream)
        bucket = next((b for b in sorted(self.graphs) if b >= rows), 0)
        if bucket and all(t == self.graph_timesteps for t in timesteps):
            graph = self.graphs[bucket]
            graph.rows[:rows].copy_(self._upload(torch.tensor(slots, dtype=torch.long)))
            graph.rows[rows:].fill_(self.scratch)
            graph.noise[:rows].copy_(self._upload(noise.to(graph.noise.dtype)))
            graph.cfg[:rows, 0, 0].copy_(self._upload(torch.tensor(cfg_values, dtype=graph.cfg.dtype)))
            graph.graph.replay()
            audio, stop = graph.audio[:rows], graph.stop[:rows]
        else:
            with record_function("input copy"):
                device_rows = self._upload(torch.tensor(slots, dtype=torch.long))
                cfg = self._upload(torch.tensor(cfg_values, dtype=self.dtype)).view(-1, 1, 1)
                noise = self._upload(noise.to(self.dtype))
            audio, stop = self._advance(device_rows, noise, cfg, timesteps)
        if self.device.type != "cuda":
            return PendingStep(audio, stop)
        with record_function("host copy"):
            host_audio = torch.empty(audio.shape, dtype=audio.dtype, pin_memory=True)
            host_stop = torch.empty(stop.shape, dtype=stop.dtype, pin_memory=True)
            host_audio.copy_(audio, non_blocking=True)
            host_stop.copy_(stop, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        return PendingStep(host_audio, host_stop, done)

    def _advance(
        self,
        rows: torch.Tensor,
        noise: torch.Tensor,
        cfg: torch.Tensor,
        timesteps: list[int],
        length: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step on the device: (audio [rows, samples] float32, stop-head argmax [rows]). Shape-static
        when `length` is given (attention over that many positions): what a CUDA graph captures."""
        model = self.model
        with record_function("locdit solve"):
            lm_hidden, residual_hidden = self.lm_hidden[rows], self.residual_hidden[rows]
            mu = torch.cat((model.lm_to_dit_proj(lm_hidden), model.res_to_dit_proj(residual_hidden)), dim=-1)
            condition = self.condition[rows].transpose(1, 2).contiguous()
            patches = self._solve(noise, mu, condition, cfg, timesteps)
        with record_function("local encoder"):
            patch = patches.transpose(1, 2)  # [rows, patch_size, feat_dim]
            embed = model.enc_to_lm_proj(model.feat_encoder(patch.unsqueeze(1)))[:, 0]
            self.condition[rows] = patch
        with record_function("vae decode"):
            self.vae_state.rows = rows
            audio = self._vae_decode(patches.to(self.vae_dtype), self.sample_rate_condition).float()
        with record_function("stop head"):
            stop = model.stop_head(model.stop_actn(model.stop_proj(lm_hidden))).argmax(dim=-1)

        positions = self.positions[rows]
        length = length or int(positions.max()) + 1  # a host read, outside what `compile` traces
        with record_function("base lm"):
            base = self._lm_step(model.base_lm, self.caches["base"], rows, positions, embed, length)
            lm_hidden = model.fsq_layer(base)
        with record_function("residual lm"):
            residual_in = model.fusion_concat_proj(torch.cat((lm_hidden, embed), dim=-1))
            residual = self._lm_step(model.residual_lm, self.caches["residual"], rows, positions, residual_in, length)
            self.residual_hidden[rows] = residual
            self.lm_hidden[rows] = lm_hidden
            self.positions[rows] = positions + 1
            self.positions[self.scratch :].zero_()  # padding rows never run past the cache (a kernel, no host copy)
        return audio.reshape(rows.size(0), -1), stop

    def _solve(
        self, noise: torch.Tensor, mu: torch.Tensor, condition: torch.Tensor, cfg: torch.Tensor, timesteps: list[int]
    ) -> torch.Tensor:
        """The LocDiT flow-matching solve of every row: one group of rows per diffusion step count."""
        model = self.model
        groups = sorted(set(timesteps))
        patches = torch.empty_like(noise)
        for steps in groups:
            inputs = (noise, mu, condition, cfg)
            if len(groups) > 1:  # the rows of this step count only
                picked = torch.tensor([i for i, t in enumerate(timesteps) if t == steps], device=self.device)
                inputs = tuple(tensor.index_select(0, picked) for tensor in inputs)
            x, group_mu, cond, group_cfg = inputs
            solved = model.feat_decoder.solve_euler(
                x=x, t_span=self._t_span(steps), mu=group_mu, cond=cond, cfg_value=group_cfg
            )
            if len(groups) > 1:
                patches[picked] = solved
            else:
                patches = solved
        return patches

    # -- speed-ups ------------------------------------------------------------------------------------
    def fold_weight_norm(self) -> None:
        """Compute the audio VAE's weight-normed convolution weights once instead of at every call.

        VoxCPM's VAE wraps each convolution in `torch.nn.utils.weight_norm`, whose pre-hook recomputes
        weight = g * v / |v| before every forward: a norm, a division and a product per convolution per step,
        for weights that never change at inference. Folding runs the same computation once, so the weights, and
        the audio, are the ones the hook would produce.
        """
        for module in self.model.audio_vae.modules():
            if hasattr(module, "weight_g") and hasattr(module, "weight_v"):
                torch.nn.utils.remove_weight_norm(module)

    def compile(self, parts: tuple[str, ...] = ("solver",), attention: str = "default") -> None:
        """torch.compile parts of the step: "solver" (the LocDiT estimator, run `timesteps` times a step), "lms"
        (one position of the base and residual LM), "vae" (the audio VAE's decode of the new patch).

        Profiled on the H200 at 128 rows (results/h200/README.md §3d), most of the solve is not its matrix
        products but the glue around them: RMSNorm and RoPE upcast to float32 and back, `cat`, `contiguous`
        and the residual adds, each its own kernel; the LMs and the VAE have the same kind of chains. Inductor
        fuses them into a few Triton kernels; the arithmetic is the model's (same dtypes, float32 inside the
        norms). Compiled per shape on first use: `capture_graphs` runs each bucket before capturing it, so
        compiling happens at start-up; after the second bucket the batch dimension is compiled as dynamic.
        `attention` limits the solver's scaled-dot-product attention to one of torch's kernels (SOLVER_ATTENTION;
        "default": torch's own choice, cuDNN on the H200): the solve attends over 11 positions, where a
        kernel's tiles are mostly empty, so which one wins is measured (results/h200/tts_profile.py --variants;
        "math" runs its products in float32). Meant for CUDA (on a CPU it runs, slowly to compile). The LMs
        ("lms") trace badly: their in-place cache writes become whole-cache copies (§3e). "lm-glue" compiles
        only what runs around each layer's cache write and attention (`_layer_in`, `_layer_out`), which stay eager:
        one compiled graph of each serves every layer of an LM, the layer being an argument
        (results/cpu/tts_regional_lm_compile_2026-12-07); on an H100 it took 3.4-3.8 % off the step served at 176
        and 256 rows (results/h200/README.md §3j), so --compile compiles it (config.COMPILED_PARTS)."""
        unknown = set(parts) - set(COMPILE_PARTS)
        if unknown:
            raise ValueError(f"no such part of the step to compile: {', '.join(sorted(unknown))}")
        if {"lms", "lm-glue"} <= set(parts):
            raise ValueError("compile the LMs whole (lms) or their glue (lm-glue), not both")
        if attention != "default" and attention not in SOLVER_ATTENTION:
            raise ValueError(f"no such attention: {attention} (default, {', '.join(SOLVER_ATTENTION)})")
        if self._uncompiled is None:
            self._uncompiled = self.model.feat_decoder.estimator, self._lm_step, self._vae_decode
        if "solver" in parts:
            backends = None if attention == "default" else [SOLVER_ATTENTION[attention]]
            estimator = self._uncompiled[0]  # the eager one, also when compiled before
            self.model.feat_decoder.estimator = torch.compile(_AttentionBackends(estimator, backends), fullgraph=True)
        if "lms" in parts:
            self._lm_step = torch.compile(self._uncompiled[1], fullgraph=True)
        if "lm-glue" in parts:
            glue = tuple(torch.compile(part, fullgraph=True) for part in (_layer_in, _layer_out))
            self._lm_step = functools.partial(self._uncompiled[1], glue=glue)
        if "vae" in parts:
            self._vae_decode = torch.compile(self._uncompiled[2])

    @property
    def compiled(self) -> bool:
        return self._uncompiled is not None

    def uncompile(self) -> None:
        """Back to the eager modules `compile` replaced (e.g. when compiling failed: no C compiler for Triton)."""
        if self._uncompiled is not None:
            self.model.feat_decoder.estimator, self._lm_step, self._vae_decode = self._uncompiled
            self._uncompiled = None

    def set_vae_dtype(self, dtype: torch.dtype) -> None:
        """Run the audio VAE's decode in `dtype`. VoxCPM2 keeps its VAE in float32 (28 ms of a 103 ms step at
        128 rows on the H200, §3d); bf16 halves its bytes and runs its convolutions on bf16 tensor cores, at
        the cost of bf16 rounding in the waveform (about 3 significant digits)."""
        self.model.audio_vae.to(dtype)
        self.vae_state.to(dtype)
        self.vae_dtype = dtype

    # -- CUDA graphs ------------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture_graphs(self, buckets: list[int], timesteps: int, cfg_value: float) -> None:
        """Capture the step once per batch bucket (largest first, sharing one memory pool), for rows using
        `timesteps` diffusion steps; attention then always spans the whole cache (`max_length`)."""
        self.graph_timesteps = timesteps
        torch.cuda.synchronize()  # prefills of the warm-up (their own stream) are done
        self._t_span(timesteps)  # created outside the capture
        # each bucket has fixed shapes: let cuDNN time its algorithms for them in the warm-up (the default
        # heuristic picked a 7 ms float32 transposed convolution for the VAE at 128 rows, §3d)
        torch.backends.cudnn.benchmark = True
        pool = None
        for bucket in sorted(buckets, reverse=True):
            rows = torch.full((bucket,), self.scratch, dtype=torch.long, device=self.device)
            noise = torch.zeros(bucket, self.feat_dim, self.patch_size, device=self.device, dtype=self.dtype)
            cfg = torch.full((bucket, 1, 1), cfg_value, device=self.device, dtype=self.dtype)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: allocations and library handles before the capture
                    self._advance(rows, noise, cfg, [timesteps], self.max_length)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                audio, stop = self._advance(rows, noise, cfg, [timesteps], self.max_length)
            pool = graph.pool()
            self.graphs[bucket] = _GraphedStep(graph, rows, noise, cfg, audio, stop)
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture_prefill_graphs(self, rows: list[int], tokens: list[int]) -> None:
        """Capture the prefill once per (rows, tokens) bucket on the prefill stream (one memory pool, largest
        first). An eager prefill is ~1,600 small launches from Python (15-50 ms of host time per pass on the H200,
        longer while the engine's event loop wants the GIL, results/h200/README.md §3f); a replay is one. A prefill
        that fits no bucket (more rows or a longer text) runs eagerly."""
        torch.cuda.synchronize()
        stream, pool = self.prefill_stream, None
        for bucket in sorted(((r, t) for r in rows for t in tokens), reverse=True):
            slots = torch.full((bucket[0],), self.scratch, dtype=torch.long, device=self.device)
            text = torch.zeros(bucket, dtype=torch.long, device=self.device)
            lengths = torch.ones(bucket[0], dtype=torch.long, device=self.device)
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: allocations and library handles before the capture
                    self._prefill_device(slots, text, lengths)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._prefill_device(slots, text, lengths)
            pool = graph.pool()
            self.prefill_graphs[bucket] = _GraphedPrefill(graph, slots, text, lengths)
        torch.cuda.synchronize()


def prefill_bucket(graphs, rows: int, tokens: int) -> tuple[int, int] | None:
    """The smallest captured (rows, tokens) bucket holding a prefill of `rows` segments of at most `tokens` tokens
    (audio-start token included), or None: no graph holds it, the prefill runs eagerly."""
    fits = [key for key in graphs if key[0] >= rows and key[1] >= tokens]
    return min(fits, key=lambda key: (key[0] * key[1], key)) if fits else None


class _GraphedPrefill:
    """A captured prefill and its static inputs (slots, right-padded tokens, lengths), copied in before a replay."""

    def __init__(self, graph, slots, text, lengths):
        self.graph, self.slots, self.text, self.lengths = graph, slots, text, lengths


class PendingStep:
    """A launched step (`BatchedVoxCPM.launch`): its outputs once the device is done with it."""

    def __init__(self, audio: torch.Tensor, stop: torch.Tensor, done: torch.cuda.Event | None = None):
        self.audio, self.stop, self.done = audio, stop, done

    def ready(self) -> bool:
        """Whether `result()` would return without waiting for the device."""
        return self.done is None or self.done.query()

    def wait(self) -> None:
        """Block until the device is done with the step (releases the GIL while it waits)."""
        if self.done is not None:
            self.done.synchronize()

    def result(self) -> tuple[torch.Tensor, list[bool]]:
        """(audio [rows, samples] float32 on the CPU, stop-head decision per row), waiting for the device."""
        self.wait()
        return self.audio, [flag == 1 for flag in self.stop.tolist()]


class _AttentionBackends(nn.Module):
    """`estimator` run with scaled-dot-product attention limited to `backends` (None: torch's own choice),
    traced by torch.compile."""

    def __init__(self, estimator: nn.Module, backends: list[SDPBackend] | None):
        super().__init__()
        self.estimator, self.backends = estimator, backends

    def forward(self, *args):
        if self.backends is None:
            return self.estimator(*args)
        with sdpa_kernel(self.backends):
            return self.estimator(*args)


class _GraphedStep:
    """A captured step and its static tensors: inputs copied in before a replay, outputs read after."""

    def __init__(self, graph, rows, noise, cfg, audio, stop):
        self.graph, self.rows, self.noise, self.cfg, self.audio, self.stop = graph, rows, noise, cfg, audio, stop
