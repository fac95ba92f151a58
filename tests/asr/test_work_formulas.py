"""The FLOP formulas behind voiceagent_asr_model_flops_total agree with PyTorch's own FLOP counter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import fastconformer as fc  # noqa: E402


@pytest.mark.parametrize("right", [0, 3, 13])
def test_cache_aware_step_flops_match_the_counted_graph(right):
    model, _ = fc.build_model(AsrConfig(preset="tiny").preset_file)
    shape = fc.encoder_shape(model)
    encoder = model.encoder
    encoder.set_default_att_context_size([56, right])
    streams, mel = 3, 9 + 8 * (right + 1)
    channel, time, length = encoder.get_initial_cache_state(streams)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        encoded, encoded_len, *_ = encoder.cache_aware_stream_step(
            processed_signal=torch.randn(streams, shape.mel_bins, mel),
            processed_signal_length=torch.full((streams,), mel),
            cache_last_channel=channel,
            cache_last_time=time,
            cache_last_channel_len=length,
            keep_all_outputs=True,
            drop_extra_pre_encoded=2,
        )
    frames = int(encoded_len.max())
    assert frames == right + 1
    formula = shape.step_flops(streams, frames, 56 + frames, mel, frames + 2)
    formula -= streams * frames * shape.decoder_flops_per_frame()  # the counter saw the encoder only
    assert formula == pytest.approx(counter.get_total_flops(), rel=0.1)
