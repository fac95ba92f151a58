"""Synthesize over a real channel: streamed audio equals whole synthesis, patch-sized chunks, early first
audio, formats and resampling, model info and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soxr
import torch

from services.tts.backends.voxcpm import WorkerSpec, segment_max_len
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import TtsConfig, preset_path
from tests.harness import sample_sum, scrape_samples
from tests.tts.conftest import synthesize
from voiceagent.v1 import common_pb2

PATCH_SAMPLES = 7680  # 4 latent frames at 25 Hz = 160 ms at 48 kHz
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tiny_model():
    """The tiny preset built in this process exactly as the service's workers build it."""
    return build_synthetic(preset_path("tiny"), weight_seed=0, device="cpu")


def whole_synthesis(model, text: str, seed: int, max_len: int) -> np.ndarray:
    torch.manual_seed(seed)
    return model.generate(target_text=text, max_len=max_len, inference_timesteps=10, cfg_value=2.0).numpy().reshape(-1)


def test_streamed_audio_equals_whole_synthesis_with_the_same_seed(stub, tiny_model):
    streamed = synthesize(stub, TEXT, seed=1234)
    spec = WorkerSpec.from_config(TtsConfig(preset="tiny"))
    whole = whole_synthesis(tiny_model, TEXT, 1234, segment_max_len(spec, TEXT))
    assert streamed.audio.shape == whole.shape
    # Streaming decodes the causal VAE patch by patch; only float rounding may differ from one whole decode.
    np.testing.assert_allclose(streamed.audio, whole, atol=1e-5)
    assert np.abs(whole).max() > 0.01  # not silence


def test_the_seed_makes_output_reproducible(stub):
    first, again, other = (synthesize(stub, "Seeded speech.", seed=seed).audio for seed in (7, 7, 8))
    assert np.array_equal(first, again)
    assert not np.allclose(first, other)


def test_every_chunk_but_the_last_is_exactly_one_patch(stub):
    response = synthesize(stub, TEXT, seed=1)
    *patches, last = response.chunks
    assert len(patches) == segment_max_len(WorkerSpec.from_config(TtsConfig(preset="tiny")), TEXT)
    for index, chunk in enumerate(patches):
        assert len(chunk.audio) == PATCH_SAMPLES * 4  # float32
        assert chunk.duration_s == pytest.approx(0.16)
        assert chunk.chunk_index == index
        assert chunk.sample_offset == index * PATCH_SAMPLES
        assert chunk.offset_s == pytest.approx(index * 0.16)
        assert chunk.sample_rate_hz == 48000 and chunk.encoding == common_pb2.AUDIO_ENCODING_FLOAT32
        assert not chunk.is_last
    # At the native rate the closing chunk has nothing left to carry: VoxCPM decides to stop after a patch.
    assert last.is_last and len(last.audio) == 0 and last.sample_offset == len(patches) * PATCH_SAMPLES
    assert len({chunk.request_id for chunk in response.chunks}) == 1


def test_first_audio_comes_long_before_the_whole_synthesis(stub):
    response = synthesize(stub, "A sentence long enough to take many patches to speak, " * 2, seed=2)
    assert len(response.chunks) > 30
    assert response.arrivals[0] < 0.25 * response.total_s, (response.arrivals[0], response.total_s)


def test_request_id_is_echoed(stub):
    response = synthesize(stub, "Hi there.", request_id="turn-42")
    assert {chunk.request_id for chunk in response.chunks} == {"turn-42"}


@pytest.mark.parametrize("rate", [16000, 24000])
def test_pcm16_at_a_lower_rate_is_the_resampled_native_audio(stub, rate):
    native = synthesize(stub, TEXT, seed=5).audio
    response = synthesize(stub, TEXT, seed=5, sample_rate_hz=rate, encoding=common_pb2.AUDIO_ENCODING_PCM16)
    assert {c.sample_rate_hz for c in response.chunks} == {rate}
    assert {c.encoding for c in response.chunks} == {common_pb2.AUDIO_ENCODING_PCM16}
    expected = soxr.resample(native, 48000, rate, quality="HQ")
    assert abs(len(response.audio) - len(expected)) <= 1
    n = min(len(expected), len(response.audio))
    np.testing.assert_allclose(response.audio[:n], np.clip(expected[:n], -1, 1), atol=2e-3)
    offsets = [c.sample_offset for c in response.chunks]
    sizes = [len(c.audio) // 2 for c in response.chunks]
    assert offsets == list(np.cumsum([0, *sizes[:-1]]))


def test_get_info_reports_the_model_shape_and_limits(stub):
    info = stub.GetInfo(common_pb2.InfoRequest())
    preset = json.loads(Path(preset_path("tiny")).read_text())
    assert info.service == "tts"
    assert info.model.backend == "voxcpm" and info.model.preset == "tiny" and info.model.synthetic_weights
    shape = info.model.shape
    assert shape["patch_ms"] == 160 and shape["sample_rate"] == 48000 and shape["samples_per_patch"] == PATCH_SAMPLES
    assert shape["layers"] == preset["lm_config"]["num_hidden_layers"]
    assert shape["hidden_size"] == preset["lm_config"]["hidden_size"]
    assert shape["vocab_size"] == preset["lm_config"]["vocab_size"]
    assert shape["inference_timesteps"] == 10 and shape["dit_calls_per_patch"] == 9
    assert info.model.parameter_count > 0 and info.model.weight_bytes == 4 * info.model.parameter_count
    assert info.limits.get("workers", info.limits.get("max_batch")) == 1 and info.limits["max_queue"] == 1
    assert info.ceilings.peak_flops_per_s > 0


def test_metrics_count_patches_audio_and_model_work(tts, stub):
    before = scrape_samples(tts.metrics_url)
    response = synthesize(stub, TEXT, seed=3)
    after = scrape_samples(tts.metrics_url)
    patches = len(response.chunks) - 1

    def grew(name, **labels):
        return sample_sum(after, name, **labels) - sample_sum(before, name, **labels)

    assert grew("voiceagent_tts_patches_total") == patches
    assert grew("voiceagent_tts_engine_steps_total") == patches
    assert grew("voiceagent_tts_audio_seconds_total") == pytest.approx(patches * 0.16)
    assert grew("voiceagent_tts_time_to_first_audio_seconds_count", method="Synthesize") == 1
    assert grew("voiceagent_tts_inter_chunk_seconds_count", method="Synthesize") == patches - 1
    assert grew("voiceagent_tts_real_time_factor_count", method="Synthesize") == 1
    assert grew("voiceagent_tts_queue_seconds_count") == 1
    assert grew("voiceagent_tts_model_flops_total") > 0 and grew("voiceagent_tts_model_read_bytes_total") > 0
    assert sample_sum(after, "voiceagent_tts_busy_workers") == 0
    assert sample_sum(after, "voiceagent_tts_workers") == 1
