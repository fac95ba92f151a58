"""The pooled greedy decoder: streams decoded chunk by chunk from scattered slots get NeMo's offline tokens."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import fastconformer as fc  # noqa: E402
from services.asr.engine.greedy import GreedyDecoder  # noqa: E402


def test_chunked_decoding_from_scattered_slots_equals_one_offline_decode():
    model, _ = fc.build_model(AsrConfig(preset="tiny").preset_file, seed=3)
    decoder = GreedyDecoder(model, slots=8, device="cpu")
    generator = torch.Generator().manual_seed(0)
    frames = 12
    encoded = torch.randn(3, model.encoder.d_model, frames, generator=generator) * 3
    with torch.inference_mode():
        offline = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=encoded, encoded_lengths=torch.full((3,), frames), return_hypotheses=True
        )
        expected = [hypothesis.y_sequence.tolist() for hypothesis in offline]
        slots = [6, 1, 3]  # not consecutive: gathered and scattered by index, not as a view
        for pool in decoder.states:  # slots left dirty by earlier streams: the reset must undo it all
            pool.normal_(generator=generator)
        decoder.outputs.normal_(generator=generator)
        decoder.labels.fill_(5)
        decoder.lengths.fill_(7)
        decoder.reset(slots)  # all three at once
        decoded: list[list[int]] = [[], [], []]
        # The middle stream sits out one step (its slot must keep its state meanwhile) and catches up alone.
        for rows, start in (([0, 1, 2], 0), ([0, 2], 4), ([1], 4), ([0, 1, 2], 8)):
            chunk = encoded[rows, :, start : start + 4]
            tokens = decoder.decode(chunk, torch.full((len(rows),), 4), [slots[row] for row in rows])
            for row, new in zip(rows, tokens, strict=True):
                decoded[row] += new
    assert any(expected), "random weights should emit some tokens"
    assert decoded == expected
