"""The pooled greedy decoder: streams decoded chunk by chunk from scattered slots get NeMo's offline tokens."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from omegaconf import OmegaConf  # noqa: E402

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


def test_the_decoder_gets_contiguous_states_from_consecutive_slots(tmp_path):
    """Consecutive slots are read from the pool as a view (a slice along its batch dimension), which with more than one
    LSTM layer (nemotron-0.6b has two) is not contiguous: cuDNN's LSTM refuses such an `hx` ("rnn: hx is not
    contiguous"; the CPU LSTM takes it), and the service with its own CUDA graphs failed to start on a GPU that way
    (results/h200/README.md, v8). What reaches the decoder is contiguous."""
    spec = OmegaConf.load(AsrConfig(preset="tiny").preset_file)
    spec.model.decoder.prednet.pred_rnn_layers = 2
    OmegaConf.save(spec, tmp_path / "two-layers.yaml")
    model, _ = fc.build_model(tmp_path / "two-layers.yaml", seed=3)
    decoder = GreedyDecoder(model, slots=8, device="cpu")
    computer, seen = decoder.computer, []

    def checked(*args, prev_batched_state, **kwargs):
        seen.extend(state.is_contiguous() for state in prev_batched_state.predictor_states)
        return computer(*args, prev_batched_state=prev_batched_state, **kwargs)

    decoder.computer = checked
    with torch.inference_mode():
        decoder.reset([2, 3, 4])
        decoder.decode(torch.randn(3, model.encoder.d_model, 4), torch.full((3,), 4), [2, 3, 4])
    assert seen and all(seen), f"predictor states handed to the decoder, contiguous: {seen}"


def test_the_decoder_never_runs_nemos_cuda_graphs():
    """Every service decodes on plain kernels, with or without CUDA graphs of its own: NeMo's graphs of this loop
    recompile while serving, crashed captures beside ours, and only services that kept them ever recorded corrupted
    host memory on a GPU (results/h200/README.md v9-v11). NeMo turns them back on when the model is put in eval mode
    (`maybe_enable_cuda_graphs`); that must not."""
    model, _ = fc.build_model(AsrConfig(preset="tiny").preset_file, seed=3)
    computer = model.decoding.decoding.decoding_computer
    assert computer.cuda_graphs_mode is not None, "NeMo builds the computer with its graphs on"
    GreedyDecoder(model, slots=2, device="cpu")
    assert computer.cuda_graphs_mode is None
    computer.maybe_enable_cuda_graphs()
    assert computer.cuda_graphs_mode is None
