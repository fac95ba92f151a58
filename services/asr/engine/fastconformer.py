"""The NeMo FastConformer RNN-T model both backends drive: building it, its chunk sizes, detokenizing, work
formulas (the streamed mel features are features.py).

A preset (services/asr/presets/<name>.yaml) builds the real architecture with synthetic weights; a `.nemo`
path restores a real checkpoint. Presets use character-level labels (`EncDecRNNTModel`) padded with letter
pairs up to the preset's vocabulary size, so the joint network has the real output width without training
a tokenizer; a restored BPE checkpoint detokenizes with its own tokenizer.
"""

from __future__ import annotations

import dataclasses
import itertools
import string
from pathlib import Path

try:
    import torch
    from nemo.collections.asr.models import ASRModel, EncDecRNNTModel
    from omegaconf import OmegaConf
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the ASR backends need NeMo: `make setup` (or pip install -r services/asr/requirements.txt)"
    ) from exc

ENCODER_FRAME_MS = 80  # 8x subsampling of 10 ms mel frames
MEL_PER_ENCODER_FRAME = 8


def _labels(vocab_size: int) -> list[str]:
    """Characters first, then letter pairs: distinct strings, so ids detokenize unambiguously enough."""
    chars = list(" " + string.ascii_lowercase + "'")
    pairs = ("".join(pair) for pair in itertools.product(string.ascii_lowercase, repeat=2))
    triples = ("".join(triple) for triple in itertools.product(string.ascii_lowercase, repeat=3))
    return list(itertools.islice(itertools.chain(chars, pairs, triples), vocab_size))


def build_model(preset_file: Path | None = None, model_path: str = "", seed: int = 0) -> tuple[torch.nn.Module, str]:
    """The model in eval mode and where it came from (checkpoint path or preset file)."""
    if model_path:
        model = ASRModel.restore_from(model_path, map_location="cpu")
        source = model_path
    else:
        path = preset_file
        spec = OmegaConf.to_container(OmegaConf.load(path))
        cfg = spec["model"]
        cfg["labels"] = _labels(int(spec["vocab_size"]))
        cfg["model_defaults"] = {
            "enc_hidden": cfg["encoder"]["d_model"],
            "pred_hidden": cfg["decoder"]["prednet"]["pred_hidden"],
        }
        torch.manual_seed(seed)  # synthetic weights, reproducible across processes
        model = EncDecRNNTModel(OmegaConf.create(cfg))
        source = str(path)
    model.eval()
    model.preprocessor.featurizer.dither = 0.0  # eval is deterministic anyway; make it explicit
    return model, source


def context_for_chunk_ms(model, chunk_ms: int) -> list[int] | None:
    """The attention context [left, right] whose step consumes `chunk_ms`, i.e. (right + 1) x 80 ms."""
    for left, right in model.encoder.att_context_size_all:
        if (right + 1) * ENCODER_FRAME_MS == chunk_ms:
            return [left, right]
    return None


def supported_chunk_ms(model) -> list[int]:
    return sorted((right + 1) * ENCODER_FRAME_MS for _left, right in model.encoder.att_context_size_all)


def encoder_frames_for_mel(mel_frames: int) -> int:
    """Encoder frames of `mel_frames` from the start of a clip: the causal 8x subsampling emits frame 0 from
    mel frame 0 alone, then one frame per 8 mel frames begun: 1 + ceil((M - 1) / 8)."""
    return 0 if mel_frames <= 0 else 1 + -(-(mel_frames - 1) // MEL_PER_ENCODER_FRAME)


class Detokenizer:
    """Token ids to text. Greedy RNN-T only appends tokens, so a character vocabulary extends the text by the
    new tokens alone (re-joining a whole transcript every step is O(length) per stream per step); a restored
    checkpoint's tokenizer re-decodes, but only when tokens were added."""

    def __init__(self, model):
        self.tokenizer = getattr(model, "tokenizer", None)
        self.vocabulary = None if self.tokenizer is not None else list(model.joint.vocabulary)  # not ListConfig

    def __call__(self, token_ids: list[int]) -> str:
        return self.extend("", token_ids, 0)

    def extend(self, text: str, token_ids: list[int], known: int) -> str:
        """The text of `token_ids`, given `text` of its first `known` ids."""
        if len(token_ids) == known:
            return text
        if self.tokenizer is not None:
            return self.tokenizer.ids_to_text(token_ids)
        vocabulary = self.vocabulary
        return text + "".join(vocabulary[token] for token in token_ids[known:] if token < len(vocabulary))


@dataclasses.dataclass(frozen=True)
class EncoderShape:
    """Shape facts of the encoder and decoder, for GetInfo and the FLOP/byte formulas."""

    layers: int
    d_model: int
    heads: int
    ff_dim: int
    conv_kernel: int
    mel_bins: int
    subsampling_channels: int
    left_context_frames: int
    pred_hidden: int
    pred_layers: int
    joint_hidden: int
    vocab_size: int
    encoder_params: int
    decoder_params: int
    bytes_per_param: int

    def as_facts(self) -> dict[str, float]:
        return {
            "layers": self.layers,
            "hidden_size": self.d_model,
            "heads": self.heads,
            "head_dim": self.d_model // self.heads,
            "intermediate_size": self.ff_dim,
            "conv_kernel": self.conv_kernel,
            "mel_bins": self.mel_bins,
            "left_context_frames": self.left_context_frames,
            "encoder_frame_ms": ENCODER_FRAME_MS,
            "pred_hidden": self.pred_hidden,
            "pred_layers": self.pred_layers,
            "joint_hidden": self.joint_hidden,
            "vocab_size": self.vocab_size,
            "encoder_params": self.encoder_params,
            "decoder_params": self.decoder_params,
            "cache_bytes_per_stream": self.cache_bytes_per_stream,
            "encoder_flops_per_frame": self.layers * self.layer_flops_per_frame(self.left_context_frames + 1),
        }

    @property
    def cache_bytes_per_stream(self) -> int:
        """cache_last_channel [layers, 56, d] + cache_last_time [layers, d, kernel-1]."""
        return self.layers * self.d_model * (self.left_context_frames + self.conv_kernel - 1) * self.bytes_per_param

    def layer_flops(self, frames: int, keys: int) -> float:
        """One conformer layer, one stream computing `frames` new frames whose attention sees `keys` frames
        (cache + chunk; 2 FLOPs per multiply-add). NeMo's cache holds layer inputs, so the k and v
        projections run over all `keys` frames every step: two macaron feed-forwards 8·d·ff·F; q and out
        projections 4·d²·F; k and v 4·d²·K; scores q·k 2·d·F·K, relative-position scores over 2K-1
        positions 2·d·F·(2K-1), weighted sum 2·d·F·K; conv module pointwise d→2d and d→d 6·d²·F and the
        depthwise kernel 2·d·kernel·F. (The position projection, 2·d²·(2K-1), is per step: `step_flops`.)"""
        d, f, k = self.d_model, frames, keys
        attention = 4 * d * d * f + 4 * d * d * k + 2 * d * f * k + 2 * d * f * (2 * k - 1) + 2 * d * f * k
        return 8 * d * self.ff_dim * f + attention + 6 * d * d * f + 2 * d * self.conv_kernel * f

    def subsampling_flops(self, mel_frames: int, out_frames: int) -> float:
        """dw_striding over `mel_frames` input frames (history included) with c channels and n mel bins:
        conv 3x3 1→c at stride 2 (4.5·n·c per mel frame), two depthwise 3x3 + pointwise c→c stages at
        strides 4 and 8 (1.4·n·c + c²·n·(1/8 + 1/32)), then the c·n/8 → d projection per output frame."""
        c, n = self.subsampling_channels, self.mel_bins
        per_mel = 5.9 * n * c + 0.156 * c * c * n
        return mel_frames * per_mel + out_frames * 2 * c * (n / 8) * self.d_model

    def layer_flops_per_frame(self, keys: int) -> float:
        """Steady-state per-frame cost at one frame per step (GetInfo's `encoder_flops_per_frame`)."""
        return self.layer_flops(1, keys) + 2 * self.d_model**2 * (2 * keys - 1)

    def decoder_flops_per_frame(self) -> float:
        """Greedy RNN-T, one joint evaluation per frame: encoder and predictor projections, the output
        layer, and one LSTM step of the prediction network (8·h² per layer for input and recurrent gates)."""
        j = self.joint_hidden
        return 2 * (self.d_model * j + self.pred_hidden * j + j * self.vocab_size) + self.pred_layers * 16 * (
            self.pred_hidden**2
        )

    def step_flops(self, streams: int, frames: int, keys: int, mel_frames: int, out_frames: int) -> float:
        """Work of one batched step: every stream feeds `mel_frames` mel frames to the subsampling, which
        yields `out_frames` (before NeMo drops the pre-encode history's), computes `frames` new encoder frames
        attending over `keys`, and decodes them (one joint evaluation per frame)."""
        per_stream = (
            self.layers * self.layer_flops(frames, keys)
            + self.subsampling_flops(mel_frames, out_frames)
            + frames * self.decoder_flops_per_frame()
        )
        return streams * per_stream + self.layers * 2 * self.d_model**2 * (2 * keys - 1)

    def step_read_bytes(self, streams: int, with_cache: bool) -> float:
        """Bytes one step must read: every weight once per step, plus each stream's cache when cache-aware."""
        weights = (self.encoder_params + self.decoder_params) * self.bytes_per_param
        return weights + (streams * self.cache_bytes_per_stream if with_cache else 0)


def encoder_shape(model) -> EncoderShape:
    encoder = model.encoder
    cfg = model.cfg
    prednet = cfg.decoder.prednet
    first_param = next(encoder.parameters())
    layer = encoder.layers[0]
    left = max(left for left, _right in encoder.att_context_size_all)
    return EncoderShape(
        layers=len(encoder.layers),
        d_model=encoder.d_model,
        heads=layer.self_attn.h,
        ff_dim=layer.feed_forward1.linear1.out_features,
        conv_kernel=layer.conv.depthwise_conv.kernel_size[0],
        mel_bins=encoder._feat_in,
        subsampling_channels=int(cfg.encoder.get("subsampling_conv_channels", 256)),
        left_context_frames=left,
        pred_hidden=int(prednet.pred_hidden),
        pred_layers=int(prednet.get("pred_rnn_layers", 1)),
        joint_hidden=int(cfg.joint.jointnet.joint_hidden),
        vocab_size=int(model.joint.num_classes_with_blank),
        encoder_params=sum(p.numel() for p in encoder.parameters()),
        decoder_params=sum(p.numel() for p in model.decoder.parameters())
        + sum(p.numel() for p in model.joint.parameters()),
        bytes_per_param=first_param.element_size(),
    )
