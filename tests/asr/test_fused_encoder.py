"""The fused encoder (--fused-encoder, engine/fused_encoder.py) computes what NeMo's modules compute: the same model
twice, one with its attention and convolution modules replaced, over one offline pass and a run of cache-aware
streaming steps (the padded step the service replays), then a real server with it on: streaming equals offline."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import fastconformer, fused_encoder  # noqa: E402
from tests.asr.client import clip, config, equals_offline, stream, stub  # noqa: E402
from tests.harness import running_service, venv_python  # noqa: E402
from voiceagent.v1 import common_pb2  # noqa: E402

TOLERANCE = 1e-4  # float32: the same sums in another order


@pytest.fixture(scope="module")
def models():
    preset = AsrConfig(preset="tiny").preset_file
    model, fused = (fastconformer.build_model(preset, seed=11)[0].eval() for _ in range(2))  # the same weights
    for ours, theirs in zip(fused.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs)
    assert fused_encoder.install(fused.encoder) == 2 * len(fused.encoder.layers)  # attention + convolution each
    return model, fused


@torch.inference_mode()
def test_an_offline_pass_equals_nemos(models):
    """Two clips of different lengths in one batch: the shorter's padded frames are queries with every key masked."""
    long, short = clip(2.1, seed=5), clip(1.2, seed=6)
    signal = torch.zeros(2, len(long))
    signal[0], signal[1, : len(short)] = torch.from_numpy(long), torch.from_numpy(short)
    length = torch.tensor([len(long), len(short)])
    outputs = []
    for model in models:
        mel, mel_length = model.preprocessor(input_signal=signal, length=length)
        encoded, encoded_length = model.encoder(audio_signal=mel, length=mel_length)
        outputs.append((encoded, encoded_length))
    (reference, reference_length), (fused, fused_length) = outputs
    assert torch.equal(reference_length, fused_length)
    torch.testing.assert_close(fused, reference, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("context", [[56, 0], [56, 3]])
@torch.inference_mode()
def test_cache_aware_steps_with_caches_of_different_fill_equal_nemos(models, context):
    """Three rows whose caches hold different amounts of history (masks differ per row), stepped five times."""
    generator = torch.Generator().manual_seed(context[1])
    states = []
    for model in models:
        model.encoder.set_default_att_context_size(context)
        states.append(list(model.encoder.get_initial_cache_state(3)))
    cfg = models[0].encoder.streaming_cfg
    width = cfg.chunk_size[1] + cfg.pre_encode_cache_size[1]
    for step in range(5):
        chunk = torch.randn(3, 80, width, generator=generator)
        lengths = torch.tensor([width, width, width])
        results = []
        for model, state in zip(models, states, strict=True):
            if step == 0:
                state[2] = torch.tensor([0, 10, 56])  # rows with no, some and a full left cache
            encoded, encoded_length, *state[:] = model.encoder.cache_aware_stream_step(
                processed_signal=chunk, processed_signal_length=lengths, cache_last_channel=state[0],
                cache_last_time=state[1], cache_last_channel_len=state[2], keep_all_outputs=True,
                drop_extra_pre_encoded=cfg.drop_extra_pre_encoded,
            )  # fmt: skip
            results.append((encoded, state))
        (reference, reference_state), (fused, fused_state) = results
        torch.testing.assert_close(fused, reference, atol=TOLERANCE, rtol=0)
        for ours, theirs in zip(fused_state, reference_state, strict=True):
            torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=0)


def test_a_server_with_the_fused_encoder_streams_like_offline(tiny_checkpoint, tmp_path):
    args = ["--model-path", tiny_checkpoint, "--max-streams", "2", "--probe-ceilings", "false", "--threads", "1"]
    args += ["--record-encoder-dir", str(tmp_path), "--fused-encoder", "true", "--padded-steps", "true"]
    with running_service("services.asr", venv_python("asr"), args) as service:
        assert stub(service).GetInfo(common_pb2.InfoRequest(), timeout=10).limits["fused_encoder"] == 1
        audio = clip(2.345, seed=21)
        responses = stream(service, config(320, request_id="fused"), audio)
        equals_offline(service, tmp_path, "fused", 320, audio, responses[-1])
