"""The batched engine's speed-ups (BatchedVoxCPM.fold_weight_norm, compile, set_vae_dtype, the zero-shot prefill
without the local encoder): all but the bf16 VAE keep the model's audio, the bf16 VAE stays close to it; the
service takes --vae-dtype and refuses what it cannot run. (That the batched engine speaks as VoxCPM2's own
generate does, prefill included, is tests/tts/test_synthesis.py's first test.)"""

from __future__ import annotations

import dataclasses
import functools

import grpc
import numpy as np
import pytest
import torch

from services.tts.backends.batched_engine import EngineSpec, build_engine
from services.tts.backends.batched_model import SOLVER_ATTENTION, BatchedVoxCPM, _layer_in, _layer_out
from services.tts.backends.voxcpm import WorkerSpec
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import SOLVER_ATTENTIONS, TtsConfig, preset_path
from tests.harness import running_service, venv_python
from tests.tts.conftest import synthesize
from voiceagent.serving.config import load_config
from voiceagent.v1 import common_pb2, tts_pb2_grpc

TEXT = "Three requests step together."
ROWS, STEPS = 3, 3


def engine() -> BatchedVoxCPM:
    return BatchedVoxCPM(build_synthetic(preset_path("tiny"), weight_seed=0, device="cpu"), ROWS + 1, 128)


def speak(batched: BatchedVoxCPM) -> np.ndarray:
    """STEPS patches of ROWS requests (seeds 0..ROWS-1), from a fresh prefill: [rows, samples]."""
    slots = list(range(ROWS))
    batched.prefill(slots, [batched.text_tokens(TEXT)] * ROWS)
    generators = [torch.Generator().manual_seed(seed) for seed in slots]
    audio = []
    for _ in range(STEPS):
        noise = torch.stack([batched.noise(g) for g in generators])
        patch, _ = batched.step(slots, [10] * ROWS, [2.0] * ROWS, noise)
        audio.append(patch.numpy())
    return np.concatenate(audio, axis=1)


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(reference**2)) / np.sqrt(np.mean((reference - other) ** 2)))


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return speak(engine())


def test_folding_the_vae_weight_norm_leaves_the_audio_unchanged(reference):
    batched = engine()
    batched.fold_weight_norm()
    vae = batched.model.audio_vae
    assert not any(hasattr(m, "weight_g") for m in vae.modules()), "a convolution still recomputes its weight"
    assert sum(1 for m in vae.modules() if isinstance(m, torch.nn.Conv1d)) > 0
    np.testing.assert_array_equal(speak(batched), reference)


def test_the_compiled_step_gives_the_eager_audio_within_float_rounding(reference):
    batched = engine()
    batched.compile(("solver", "lms", "vae"), "math")
    np.testing.assert_allclose(speak(batched), reference, atol=1e-5)
    assert isinstance(batched.model.feat_decoder.estimator, torch._dynamo.eval_frame.OptimizedModule)
    with pytest.raises(ValueError, match="no such part of the step to compile: encoder"):
        batched.compile(("encoder",))
    # the service's --solver-attention choices are the kernels compile knows
    assert set(SOLVER_ATTENTIONS) == {"default", *SOLVER_ATTENTION}


def test_the_lms_glue_compiled_around_the_eager_cache_writes_gives_the_eager_audio(reference):
    """The LMs' glue part: each layer's norms, projections, RoPE and MLP compiled, its K/V write and attention eager."""
    batched = engine()
    batched.compile(("lm-glue",))
    np.testing.assert_allclose(speak(batched), reference, atol=1e-5)
    assert isinstance(batched._lm_step, functools.partial), "the LM step does not run the compiled glue"
    assert batched._lm_step.keywords["glue"] != (_layer_in, _layer_out), "the glue is the eager one"
    with pytest.raises(ValueError, match="not both"):
        batched.compile(("lms", "lm-glue"))
    batched.uncompile()
    np.testing.assert_array_equal(speak(batched), reference)


def test_a_bf16_vae_stays_within_bf16_rounding_of_the_float32_waveform(reference):
    batched = engine()
    batched.set_vae_dtype(torch.bfloat16)
    audio = speak(batched)
    assert audio.dtype == np.float32  # what goes out is float32 PCM either way
    assert not np.array_equal(audio, reference), "the VAE did not run in bf16"
    assert snr_db(reference, audio) > 20, f"bf16 VAE: {snr_db(reference, audio):.1f} dB against float32"


def test_the_service_speaks_with_a_bf16_vae_and_refuses_other_dtypes(reference):
    args = ["--preset", "tiny", "--backend", "batched", "--max-batch", "2", "--vae-dtype", "bfloat16"]
    with (
        running_service("services.tts", venv_python("tts"), args) as service,
        grpc.insecure_channel(service.address) as channel,
    ):
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        shape = stub.GetInfo(common_pb2.InfoRequest()).model.shape
        response = synthesize(stub, TEXT, seed=7)
    assert shape["vae_bits"] == 16 and shape["solver_compiled"] == 0
    assert response.audio.size > 0 and np.isfinite(response.audio).all()
    with pytest.raises(SystemExit) as refused:
        load_config(TtsConfig, "TTS", ["--vae-dtype", "float16"], {})
    assert "--vae-dtype / TTS_VAE_DTYPE" in str(refused.value)
    # the compiled parts: by default the solve, the VAE and the LMs' glue; a part compile does not know, none, or the
    # LMs both whole and by their glue are refused at start-up
    assert load_config(TtsConfig, "TTS", [], {}).compiled_parts == ("solver", "vae", "lm-glue")
    assert load_config(TtsConfig, "TTS", [], {"TTS_COMPILE_PARTS": "solver, vae"}).compiled_parts == ("solver", "vae")
    refusals = (("solver,encoder", "no such part: encoder"), (",", "names no part"), ("lms,lm-glue", "not both"))
    for parts, why in refusals:
        with pytest.raises(SystemExit, match=why):
            load_config(TtsConfig, "TTS", ["--compile-parts", parts], {})


class _NoCompiler(torch.nn.Module):
    """What torch.compile gives where Triton cannot build its kernels: a module that fails when first called."""

    def forward(self, *args):
        raise RuntimeError("Failed to find C compiler")


def test_an_engine_whose_compiled_step_fails_serves_it_uncompiled(monkeypatch, reference):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: compiled.append(args) or _NoCompiler())
    model = dataclasses.replace(WorkerSpec.from_config(TtsConfig(preset="tiny")), compile=True)
    engine_, _, payload = build_engine(EngineSpec(model, ROWS + 1, 128))
    assert len(compiled) == 4  # the solver, the VAE and the LMs' two glue functions (config.COMPILED_PARTS)
    assert not engine_.compiled and payload["shape"]["solver_compiled"] == 0
    np.testing.assert_array_equal(speak(engine_), reference)  # the fold is exact, the rest is the eager step


def test_a_zero_shot_prefill_runs_no_local_encoder():
    """Every position of a zero-shot prefix is text, so VoxCPM2's local encoder over its (zero) audio patches only
    ever meets a zero mask: the prefill leaves it out (~38 % of a voxcpm2 prefill's FLOPs); the step still runs it
    on each new patch."""
    batched = engine()
    calls = []
    batched.model.feat_encoder.register_forward_hook(lambda *_: calls.append(1))
    batched.prefill([0], [batched.text_tokens(TEXT)])
    assert calls == []
    generator = torch.Generator().manual_seed(0)
    batched.step([0], [10], [2.0], batched.noise(generator)[None])
    assert calls == [1]
