"""VoxCPM2 model side: a checkpoint in the real format loads for real and serves; the per-patch work formulas
agree with what torch counts."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaTokenizerFast
from voxcpm.model.voxcpm2 import VoxCPM2Model, VoxCPMConfig
from voxcpm.modules.audiovae import AudioVAEV2

from services.tts.backends.voxcpm_model import (
    RESERVED_TOKEN_IDS,
    PatchWork,
    build_synthetic,
    build_tokenizer,
    dit_calls,
    save_checkpoint,
    vae_patch_work,
)
from services.tts.config import preset_path
from tests.harness import running_service, venv_python
from tests.tts.conftest import synthesize
from voiceagent.v1 import common_pb2, tts_pb2_grpc

TEXT = "A checkpoint saved on disk."


@pytest.fixture(scope="module")
def tiny_model():
    return build_synthetic(preset_path("tiny"), weight_seed=0, device="cpu")


def test_text_token_ids_stay_off_the_audio_markers_and_below_the_vocabulary(tiny_model):
    ids = tiny_model.text_tokenizer("Hello, wörld! 42 — “quoted” ünïcode…")
    vocab_size = json.loads(preset_path("tiny").read_text())["lm_config"]["vocab_size"]
    assert ids and all(RESERVED_TOKEN_IDS <= i < vocab_size for i in ids)


def test_a_checkpoint_in_voxcpm_format_loads_through_voxcpm_and_serves_the_same_audio(tiny_model, tmp_path):
    save_checkpoint(tiny_model, tmp_path)
    assert {"config.json", "tokenizer.json", "model.safetensors", "audiovae.safetensors"} <= {
        p.name for p in tmp_path.iterdir()
    }
    assert json.loads((tmp_path / "config.json").read_text())["architecture"] == "voxcpm2"
    torch.manual_seed(99)
    # the saved stop head never fires, so the service's max_patches cap sets the length here
    expected = tiny_model.generate(target_text=TEXT, max_len=6, inference_timesteps=10, cfg_value=2.0).numpy()
    args = ["--checkpoint", str(tmp_path), "--max-patches", "6", "--probe-ceilings", "false"]
    with (
        running_service("services.tts", venv_python("tts"), args) as service,
        grpc.insecure_channel(service.address) as channel,
    ):
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        info = stub.GetInfo(common_pb2.InfoRequest())
        served = synthesize(stub, TEXT, seed=99).audio
    assert info.model.preset == "checkpoint" and not info.model.synthetic_weights
    assert info.model.source == str(tmp_path)
    assert info.model.parameter_count == sum(p.numel() for p in tiny_model.parameters())
    np.testing.assert_allclose(served, expected.reshape(-1), atol=1e-5)


def test_work_formulas_match_what_torch_counts(tiny_model):
    """The DiT call, the local encoder and the VAE decode against torch's FLOP counter. (It does not count CPU
    attention kernels; attention is a few percent of these at patch-sized sequences.)"""
    work = PatchWork(tiny_model.config, *vae_patch_work(tiny_model))
    hidden = tiny_model.config.dit_config.hidden_dim
    with torch.inference_mode():
        with FlopCounterMode(display=False) as dit:
            tiny_model.feat_decoder(
                mu=torch.randn(1, 2 * hidden), patch_size=4, cond=torch.randn(1, 64, 4), n_timesteps=2
            )
        with FlopCounterMode(display=False) as encoder:
            tiny_model.feat_encoder(torch.randn(1, 1, 4, 64))
        with tiny_model.audio_vae.streaming_decode() as decoder:
            decoder.decode_chunk(torch.zeros(1, 64, 4))
            with FlopCounterMode(display=False) as vae:
                decoder.decode_chunk(torch.zeros(1, 64, 4))
    assert work.dit_call_flops() * dit_calls(2) == pytest.approx(dit.get_total_flops(), rel=0.05)
    assert work.encoder_flops() == pytest.approx(encoder.get_total_flops(), rel=0.05)
    assert work.vae_flops == pytest.approx(vae.get_total_flops(), rel=0.1)
    phases = work.per_phase(context=40, timesteps=10)
    assert sum(phases.values()) == pytest.approx(work.per_patch(40, 10)[0])
    assert phases["base lm"] > phases["residual lm"] > 0 and phases["projections"] > 0


def test_the_small_cpu_preset_builds_and_speaks_a_patch():
    model = build_synthetic(preset_path("small"), weight_seed=0, device="cpu")
    patches = list(model.generate_streaming(target_text="Hi.", max_len=1, inference_timesteps=2))
    assert [p.shape[-1] for p in patches] == [7680]


def test_the_voxcpm2_preset_has_the_real_shape(tmp_path):
    """The ~2B GPU preset, built on the meta device (no memory, no compute) to count its parameters."""
    config = VoxCPMConfig.model_validate_json(preset_path("voxcpm2").read_text())
    lm = config.lm_config
    assert (lm.hidden_size, lm.num_hidden_layers, lm.num_attention_heads, lm.num_key_value_heads) == (2048, 28, 16, 2)
    assert lm.vocab_size == 73448 and config.audio_vae_config.out_sample_rate == 48000
    build_tokenizer(tmp_path, lm.vocab_size)
    config.max_length = 16  # the K/V caches are real tensors even under the meta device
    with torch.device("meta"):
        model = VoxCPM2Model(
            config,
            LlamaTokenizerFast.from_pretrained(tmp_path),
            AudioVAEV2(config=config.audio_vae_config),
            device="cpu",
        )
    assert 2.0e9 < sum(p.numel() for p in model.parameters()) < 2.6e9
