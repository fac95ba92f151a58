"""The batched mel front end: streams' frames, computed in one call per step, are the offline frames."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import fastconformer as fc  # noqa: E402
from services.asr.engine import features  # noqa: E402
from services.asr.engine.step_features import StepFeatures  # noqa: E402
from tests.asr.client import clip  # noqa: E402


def test_batched_frames_are_each_streams_offline_frames():
    model, _ = fc.build_model(AsrConfig(preset="tiny").preset_file)
    preprocessor, mel_bins = model.preprocessor, fc.encoder_shape(model).mel_bins
    clips = [clip(seconds, seed=index) for index, seconds in enumerate((1.23, 0.4, 2.0))]
    streams = [features.FeatureStream(mel_bins) for _ in clips]
    taken = [[] for _ in clips]
    rng = np.random.default_rng(0)
    sent = [0] * len(clips)

    def take(segments):  # one batched call; each segment's new frames to its stream's list
        mel, busy = features.mel_batch(preprocessor, mel_bins, segments, "cpu")
        for row, index in enumerate(busy):
            _samples, skip, count = segments[index]
            taken[index].append(mel[row, :, skip : skip + count])

    with torch.inference_mode():
        finals = [False] * len(clips)
        while not all(finals):  # a closed stream's last segment takes every frame left
            for index, audio in enumerate(clips):  # pieces of uneven sizes, as clients send them
                piece = audio[sent[index] : sent[index] + int(rng.integers(1, 4000))]
                streams[index].append(piece)
                sent[index] += len(piece)
            finals = [sent[index] == len(audio) for index, audio in enumerate(clips)]
            # Sometimes fewer frames than are ready (as a step takes only the frames it consumes): the rest
            # must come out the same in a later call.
            limits = [stream.mel_done + int(rng.integers(1, 40)) if rng.random() < 0.5 else None for stream in streams]
            take(
                [
                    stream.next_segment(final, limit)
                    for stream, final, limit in zip(streams, finals, limits, strict=True)
                ]
            )
        while any(stream.available(True) > stream.mel_done for stream in streams):  # what the limits left
            take([stream.next_segment(True) for stream in streams])
        for index, audio in enumerate(clips):
            streamed = torch.cat(taken[index], dim=1)
            offline, length = preprocessor(
                input_signal=torch.from_numpy(audio)[None], length=torch.tensor([len(audio)])
            )
            assert streamed.shape[1] == int(length[0]) == len(audio) // features.HOP_SAMPLES  # each frame once
            torch.testing.assert_close(
                streamed, offline[0, :, : int(length[0])], atol=1e-5, rtol=0
            )  # float rounding: observed <= 1 ulp


@pytest.mark.parametrize("preset", ["tiny", "nemotron-0.6b"])
@pytest.mark.parametrize(("skip", "count"), [(0, 25), (4, 8), (4, 32), (1, 8)])  # first, steady 80/320 ms, second
def test_step_features_equal_the_preprocessor(preset, skip, count):
    """A padded step's own mel front end (plain tensor ops, graph-safe) gives the preprocessor's frames: segments cut
    at the step's width, one row ending early (a closed clip), to float rounding."""
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor
    from omegaconf import OmegaConf

    settings = OmegaConf.load(AsrConfig(preset=preset).preset_file).model.preprocessor
    preprocessor = AudioToMelSpectrogramPreprocessor(**{k: v for k, v in settings.items() if k != "_target_"}).eval()
    width = features.segment_width(skip, count)
    audio = torch.from_numpy(np.stack([clip(1.0, seed=seed)[:width] for seed in range(3)]))
    lengths = torch.tensor([width, width, width - 2 * features.HOP_SAMPLES])
    reference, frames = preprocessor(input_signal=audio, length=lengths)
    assert int(frames[0]) == skip + count  # the width holds exactly the step's frames
    ours = StepFeatures(preprocessor, skip, count, "cpu")(audio, lengths)
    torch.testing.assert_close(ours, reference[:, :, skip : skip + count], atol=5e-4, rtol=1e-5)


def test_segments_of_other_leads_or_lengths_are_not_one_batch():
    width = features.segment_width(4, 8)
    whole = (np.ones(width + 300, np.float32), 4, 8)
    audio, lengths = features.segment_batch([whole, (np.ones(width - 500, np.float32), 4, 8)], 4, 8, pin=False)
    assert audio.shape == (2, width) and lengths.tolist() == [width, width - 500]  # cut at the width; a short row kept
    assert features.segment_batch([whole, (np.ones(width, np.float32), 4, 7)], 4, 8, pin=False) is None
    assert features.segment_batch([whole, (np.ones(width, np.float32), 1, 8)], 4, 8, pin=False) is None
