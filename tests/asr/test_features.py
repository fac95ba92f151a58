"""The batched mel front end: streams' frames, computed in one call per step, are the offline frames."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine import fastconformer as fc  # noqa: E402
from services.asr.engine import features  # noqa: E402
from tests.asr.client import clip  # noqa: E402


def test_batched_frames_are_each_streams_offline_frames():
    model, _ = fc.build_model(AsrConfig(preset="tiny").preset_file)
    preprocessor, mel_bins = model.preprocessor, fc.encoder_shape(model).mel_bins
    clips = [clip(seconds, seed=index) for index, seconds in enumerate((1.23, 0.4, 2.0))]
    streams = [features.FeatureStream(mel_bins) for _ in clips]
    taken = [[] for _ in clips]
    rng = np.random.default_rng(0)
    sent = [0] * len(clips)
    with torch.inference_mode():
        finals = [False] * len(clips)
        while not all(finals):  # a closed stream's last segment takes every frame left
            for index, audio in enumerate(clips):  # pieces of uneven sizes, as clients send them
                piece = audio[sent[index] : sent[index] + int(rng.integers(1, 4000))]
                streams[index].append(piece)
                sent[index] += len(piece)
            finals = [sent[index] == len(audio) for index, audio in enumerate(clips)]
            segments = [stream.next_segment(final) for stream, final in zip(streams, finals, strict=True)]
            for index, frames in enumerate(features.mel_frames(preprocessor, mel_bins, segments, "cpu")):
                taken[index].append(frames)
        for index, audio in enumerate(clips):
            streamed = torch.cat(taken[index], dim=1)
            offline, length = preprocessor(
                input_signal=torch.from_numpy(audio)[None], length=torch.tensor([len(audio)])
            )
            assert streamed.shape[1] == int(length[0]) == len(audio) // features.HOP_SAMPLES  # each frame once
            torch.testing.assert_close(
                streamed, offline[0, :, : int(length[0])], atol=1e-5, rtol=0
            )  # float rounding: observed <= 1 ulp
