"""Building, loading and saving VoxCPM2 models, and what one patch of generation costs.

Presets are VoxCPM2 `config.json` files built with synthetic (seeded random) weights and a character-level
tokenizer made here (ids 0..127 are reserved so text never lands on VoxCPM's audio markers 101..104). Real
checkpoints load through VoxCPM's own `VoxCPM` wrapper with the denoiser off (its default path downloads).
`save_checkpoint` writes the real on-disk format, which is how loading is tested without downloads.
"""

from __future__ import annotations

import json
import math
import string
import tempfile
from pathlib import Path

try:
    import torch
    from transformers import LlamaTokenizerFast
    from voxcpm import VoxCPM
    from voxcpm.model.voxcpm2 import VoxCPM2Model, VoxCPMConfig
    from voxcpm.modules.audiovae import AudioVAEV2
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"{exc}. The TTS backend needs voxcpm and torch: tools/make_venv.sh tts services/tts/requirements.txt"
    ) from exc

RESERVED_TOKEN_IDS = 128  # <unk>, <s>, </s> and reserved slots; VoxCPM uses 101..104 as audio markers
_CHARS = ["▁", *string.ascii_letters, *string.digits, *string.punctuation, *map(chr, range(0xA1, 0x250)), *"’“”…—–"]


def build_tokenizer(directory: Path, vocab_size: int) -> None:
    """Write a character-level Llama-style tokenizer (tokenizer.json, tokenizer_config.json) to `directory`."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<reserved_{i}>": i for i in range(3, RESERVED_TOKEN_IDS)}
    for char in dict.fromkeys(_CHARS):
        if len(vocab) >= vocab_size:
            break
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(directory)


def build_synthetic(config_path: Path, weight_seed: int, device: str) -> VoxCPM2Model:
    """The architecture of `config_path` with seeded random weights, cast like `VoxCPM2Model.from_local` does.

    The stop head is zeroed: a random one stops at an arbitrary patch, so synthetic speech would have random
    length. Zeroed, it never fires, and the caller sets the length (`max_len`) from the text instead.
    """
    config = VoxCPMConfig.model_validate_json(config_path.read_text())
    with tempfile.TemporaryDirectory() as tokenizer_dir:
        build_tokenizer(Path(tokenizer_dir), config.lm_config.vocab_size)
        tokenizer = LlamaTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(weight_seed)
    model = VoxCPM2Model(config, tokenizer, AudioVAEV2(config=config.audio_vae_config), device=device)
    with torch.no_grad():
        model.stop_head.weight.zero_()
    model = model.to(getattr(torch, config.dtype))
    model.audio_vae = model.audio_vae.to(torch.float32)
    return model.to(model.device).eval()


def load_checkpoint(path: Path, device: str, optimize: bool = False) -> VoxCPM2Model:
    """A VoxCPM checkpoint directory, loaded by VoxCPM itself; nothing is downloaded."""
    wrapper = VoxCPM(str(path), zipenhancer_model_path=None, enable_denoiser=False, optimize=optimize, device=device)
    return wrapper.tts_model


def save_checkpoint(model: VoxCPM2Model, directory: Path) -> None:
    """Write `model` in VoxCPM's checkpoint format: config.json, tokenizer, model and audio-VAE safetensors."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads(model.config.model_dump_json()) | {"architecture": "voxcpm2"}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    model.text_tokenizer.tokenizer.save_pretrained(directory)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(
        {k[len("audio_vae.") :]: v for k, v in state.items() if k.startswith("audio_vae.")},
        directory / "audiovae.safetensors",
    )
    save_file({k: v for k, v in state.items() if not k.startswith("audio_vae.")}, directory / "model.safetensors")


def _transformer_params(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Matmul weights of MiniCPM decoder layers: q, k, v, o projections and the gated MLP."""
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    return layers * (attention + 3 * hidden * ffn)


def _attention_flops(layers: int, heads: int, head_dim: int, queries: int, keys: int) -> int:
    """QKᵀ and attention·V: 2 FLOPs per multiply-add each."""
    return 4 * layers * heads * head_dim * queries * keys


def dit_calls(timesteps: int) -> int:
    """Estimator calls per patch: the Euler solver skips the first max(1, 4% of steps) (CFG-zero*)."""
    return timesteps - max(1, int((timesteps + 1) * 0.04))


class PatchWork:
    """Model-derived FLOPs and bytes of one generated patch (one LM step), from the config alone.

    per patch = LM step: base LM + residual LM, one token each over `context` cached tokens, plus the
                projections between them (encoder→LM, FSQ, fusion, →DiT, stop head)
              + local encoder over the new patch (patch_size latent frames + a CLS token)
              + dit_calls(timesteps) × DiT forward at batch 2 (classifier-free guidance) over 2·patch_size + 3
                tokens (2 μ tokens, the time token, the previous patch as condition, the noisy patch)
              + audio-VAE decode of the patch (sum over its convolutions, see `vae_patch_work`).
    FLOPs are 2 per multiply-add. Bytes are the weights each forward streams (the DiT's once per call) in
    the model dtype, the VAE's in float32, and the K/V cache both LMs read at `context`.
    """

    def __init__(self, config: VoxCPMConfig, vae_flops: float, vae_bytes: float):
        lm, enc, dit = config.lm_config, config.encoder_config, config.dit_config
        kv, h = lm.num_key_value_heads, lm.hidden_size
        self.patch_size, self.feat_dim, self.kv_heads = config.patch_size, config.feat_dim, kv
        self.dtype_bytes = torch.finfo(getattr(torch, config.dtype)).bits // 8
        self.lm_attention = (lm.num_hidden_layers + config.residual_lm_num_layers, lm.num_attention_heads)
        self.head_dim = lm.kv_channels or h // lm.num_attention_heads
        self.lm_layers = {"base lm": lm.num_hidden_layers, "residual lm": config.residual_lm_num_layers}
        self.lm_layer_params = _transformer_params(
            h, lm.intermediate_size, 1, lm.num_attention_heads, kv, self.head_dim
        )
        self.lm_params = self.lm_layer_params * sum(self.lm_layers.values())
        # encoder→LM, LM→DiT, residual→DiT, fusion (2h→h), scalar quantisation in/out, stop head
        sq = config.scalar_quantization_latent_dim
        self.lm_params += enc.hidden_dim * h + 2 * h * dit.hidden_dim + 2 * h * h + 2 * h * sq + h * h + 2 * h
        self.enc = (enc.num_layers, enc.num_heads, enc.kv_channels or enc.hidden_dim // enc.num_heads)
        self.enc_hidden = enc.hidden_dim
        self.enc_params = _transformer_params(
            enc.hidden_dim, enc.ffn_dim, enc.num_layers, enc.num_heads, kv, self.enc[2]
        )
        self.dit = (dit.num_layers, dit.num_heads, dit.kv_channels or dit.hidden_dim // dit.num_heads)
        self.dit_hidden = dit.hidden_dim
        self.dit_params = _transformer_params(
            dit.hidden_dim, dit.ffn_dim, dit.num_layers, dit.num_heads, kv, self.dit[2]
        )
        self.vae_flops, self.vae_bytes = vae_flops, vae_bytes

    def lm_step_flops(self, context: int) -> float:
        return 2 * self.lm_params + _attention_flops(*self.lm_attention, self.head_dim, 1, context)

    def encoder_flops(self) -> float:
        tokens = self.patch_size + 1
        projection = 2 * self.feat_dim * self.enc_hidden * self.patch_size
        return projection + 2 * self.enc_params * tokens + _attention_flops(*self.enc, tokens, tokens)

    def dit_call_flops(self) -> float:
        """One estimator call at batch 2; its in/cond/out projections touch the patch frames, its two time MLPs
        one token."""
        tokens, p, hd = 2 * self.patch_size + 3, self.patch_size, self.dit_hidden
        per_row = 2 * self.dit_params * tokens + _attention_flops(*self.dit, tokens, tokens)
        per_row += 2 * (3 * self.feat_dim * hd * p + 4 * hd * hd)
        return 2 * per_row

    def per_patch(self, context: int, timesteps: int) -> tuple[float, float]:
        calls = dit_calls(timesteps)
        flops = self.lm_step_flops(context) + self.encoder_flops() + calls * self.dit_call_flops() + self.vae_flops
        dit_weights = self.dit_params + 3 * self.feat_dim * self.dit_hidden + 4 * self.dit_hidden**2
        weights = self.lm_params + self.enc_params + calls * dit_weights
        kv_cache = 2 * self.lm_attention[0] * self.kv_heads * self.head_dim * context
        return float(flops), float((weights + kv_cache) * self.dtype_bytes + self.vae_bytes)

    def per_phase(self, context: int, timesteps: int) -> dict[str, float]:
        """per_patch's FLOPs by phase of the batched step (results/h200/tts_profile.py sets them beside the
        phases' measured times); `projections` are the small matmuls between the parts (to the DiT, FSQ, fusion,
        stop head, encoder to LM)."""
        heads = self.lm_attention[1]
        phases = {
            name: 2 * layers * self.lm_layer_params + _attention_flops(layers, heads, self.head_dim, 1, context)
            for name, layers in self.lm_layers.items()
        }
        phases["projections"] = self.lm_step_flops(context) - sum(phases.values())
        phases["locdit solve"] = dit_calls(timesteps) * self.dit_call_flops()
        return phases | {"local encoder": self.encoder_flops(), "vae decode": self.vae_flops}

    def per_step(self, contexts: list[int], timesteps: list[int]) -> tuple[float, float]:
        """FLOPs and bytes of one batched step advancing one patch per row (row i at `contexts[i]` cached
        tokens, `timesteps[i]` diffusion steps). FLOPs add up over rows; the weights are read once per step
        (the DiT's once per estimator call of each group of rows sharing a step count), caches once per row.
        """
        flops = sum(self.per_patch(context, steps)[0] for context, steps in zip(contexts, timesteps, strict=True))
        dit_weights = self.dit_params + 3 * self.feat_dim * self.dit_hidden + 4 * self.dit_hidden**2
        weights = self.lm_params + self.enc_params + sum(dit_calls(steps) for steps in set(timesteps)) * dit_weights
        kv_cache = 2 * self.lm_attention[0] * self.kv_heads * self.head_dim * sum(contexts)
        return float(flops), float((weights + kv_cache) * self.dtype_bytes + self.vae_bytes)


def vae_patch_work(model: VoxCPM2Model) -> tuple[float, float]:
    """FLOPs and weight bytes of decoding one steady-state patch with the streaming audio VAE.

    FLOPs are summed over its convolutions from the shapes seen in one real decode (forward hooks):
    2 · weight elements · output positions for a convolution, · input positions for a transposed one.
    """
    flops = 0.0

    def count(module, inputs, output) -> None:
        nonlocal flops
        positions = inputs[0].shape[-1] if isinstance(module, torch.nn.ConvTranspose1d) else output.shape[-1]
        flops += 2 * module.weight.numel() * positions

    convolutions = [
        m for m in model.audio_vae.decoder.modules() if isinstance(m, torch.nn.Conv1d | torch.nn.ConvTranspose1d)
    ]
    vae_device = next(model.audio_vae.parameters()).device
    latent = torch.zeros(1, model.audio_vae.latent_dim, model.patch_size, device=vae_device)
    with torch.inference_mode(), model.audio_vae.streaming_decode() as decoder:
        decoder.decode_chunk(latent)  # the first chunk pads instead of reading state: count a steady one
        hooks = [m.register_forward_hook(count) for m in convolutions]
        try:
            decoder.decode_chunk(latent)
        finally:
            for hook in hooks:
                hook.remove()
    vae_bytes = sum(p.numel() * p.element_size() for p in model.audio_vae.decoder.parameters())
    return flops, float(vae_bytes)


def shape_facts(config: VoxCPMConfig, native_rate: int, timesteps: int, cfg_value: float) -> dict[str, float]:
    """Model shape for GetInfo: what the load generator needs to predict a patch's cost and duration."""
    lm, enc, dit, vae = config.lm_config, config.encoder_config, config.dit_config, config.audio_vae_config
    samples_per_frame = math.prod(vae.decoder_rates)
    return {
        "layers": lm.num_hidden_layers,
        "hidden_size": lm.hidden_size,
        "intermediate_size": lm.intermediate_size,
        "heads": lm.num_attention_heads,
        "kv_heads": lm.num_key_value_heads,
        "head_dim": lm.kv_channels or lm.hidden_size // lm.num_attention_heads,
        "vocab_size": lm.vocab_size,
        "residual_layers": config.residual_lm_num_layers,
        "encoder_layers": enc.num_layers,
        "encoder_hidden_size": enc.hidden_dim,
        "dit_layers": dit.num_layers,
        "dit_hidden_size": dit.hidden_dim,
        "dit_intermediate_size": dit.ffn_dim,
        "dit_calls_per_patch": dit_calls(timesteps),
        "dit_batch": 2,  # classifier-free guidance runs conditional and unconditional together
        "inference_timesteps": timesteps,
        "cfg_value": cfg_value,
        "patch_size": config.patch_size,
        "latent_rate_hz": native_rate / samples_per_frame,
        "patch_ms": 1000 * config.patch_size * samples_per_frame / native_rate,
        "samples_per_patch": config.patch_size * samples_per_frame,
        "sample_rate": native_rate,
        "vae_decoder_dim": vae.decoder_dim,
        "max_length": config.max_length,
    }
