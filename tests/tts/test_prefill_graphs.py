"""The CPU twin of the prefill's CUDA graphs (BatchedVoxCPM.capture_prefill_graphs, CUDA only; the device check is
results/h200/tts_prefill_graph_check.py): a prefill picks the smallest bucket holding it, and a prefill padded the
way a graph's static inputs are (rows into the scratch slot, tokens past each row's length) leaves every real slot as
the unpadded prefill does, so their audio is the same; the option (on by default) is left out off CUDA."""

from __future__ import annotations

import torch

from services.tts.backends.batched_model import BatchedVoxCPM, prefill_bucket
from services.tts.backends.voxcpm_model import build_synthetic
from services.tts.config import TtsConfig, preset_path
from voiceagent.serving.config import load_config

TEXTS = ["A short one.", "A somewhat longer sentence to speak.", "Middle length words."]


def test_a_prefill_takes_the_smallest_bucket_holding_it_or_none():
    graphs = {(r, t): None for r in (1, 2, 4, 8) for t in (16, 32, 64)}
    assert prefill_bucket(graphs, 1, 10) == (1, 16)
    assert prefill_bucket(graphs, 3, 17) == (4, 32)
    assert prefill_bucket(graphs, 8, 64) == (8, 64)
    assert prefill_bucket(graphs, 9, 10) is None  # more rows than any bucket: eager
    assert prefill_bucket(graphs, 2, 65) is None  # a longer text than any bucket: eager
    assert prefill_bucket({}, 1, 1) is None


def test_a_padded_prefill_leaves_each_real_slot_as_the_unpadded_one_and_speaks_the_same():
    engine = BatchedVoxCPM(build_synthetic(preset_path("tiny"), weight_seed=0, device="cpu"), 8, 128)
    tokens = [engine.text_tokens(text) for text in TEXTS]
    engine.prefill([0, 1, 2], tokens)  # as an eager prefill does
    # as a (4 rows, 64 tokens) graph does: a padding row into the scratch slot, every row's tokens right-padded
    lengths = [len(t) + 1 for t in tokens]
    text = torch.zeros(4, 64, dtype=torch.long)
    for row, row_tokens in enumerate(tokens):
        text[row, : lengths[row]] = torch.tensor([*row_tokens, engine.model.audio_start_token])
    engine._prefill_device(torch.tensor([3, 4, 5, engine.scratch]), text, torch.tensor([*lengths, 1]))
    for plain, padded in zip((0, 1, 2), (3, 4, 5), strict=True):
        torch.testing.assert_close(engine.lm_hidden[padded], engine.lm_hidden[plain], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(engine.residual_hidden[padded], engine.residual_hidden[plain], atol=1e-5, rtol=1e-4)
        assert engine.positions[padded] == engine.positions[plain] == lengths[plain]
        length = lengths[plain]
        for cache in engine.caches.values():
            torch.testing.assert_close(
                cache[:, :, padded, :, :length], cache[:, :, plain, :, :length], atol=1e-5, rtol=1e-4
            )
    audio = {}
    for name, slots in (("plain", [0, 1, 2]), ("padded", [3, 4, 5])):
        generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
        patches = []
        for _ in range(4):  # the padded K/V past each length is written over before any step attends to it
            noise = torch.stack([engine.noise(g) for g in generators])
            patches.append(engine.step(slots, [10] * 3, [2.0] * 3, noise)[0])
        audio[name] = torch.cat(patches, dim=1)
    torch.testing.assert_close(audio["padded"], audio["plain"], atol=1e-4, rtol=1e-3)
    assert audio["plain"].abs().max() > 0.01


def test_prefill_graphs_are_on_by_default_and_left_out_off_cuda():
    from services.tts.backends.batched_engine import EngineSpec, build_engine
    from services.tts.backends.voxcpm import WorkerSpec

    config = load_config(TtsConfig, "TTS", ["--preset", "tiny", "--backend", "batched"], {})
    assert config.prefill_graphs and config.device == "cpu"  # the CUDA default is a valid CPU config
    spec = EngineSpec(WorkerSpec.from_config(config), 2, 128, prefill_graphs=config.prefill_graphs)
    engine, _, payload = build_engine(spec)
    assert payload["shape"]["prefill_graphs"] == 0 and not engine.prefill_graphs  # prefills run eagerly on the CPU
