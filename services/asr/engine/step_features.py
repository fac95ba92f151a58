"""The mel front end inside a padded step (a CUDA graph on a GPU): NeMo's FilterbankFeatures as plain tensor
operations, for one step's fixed frames of fixed-width audio segments (features.segment_batch)."""

from __future__ import annotations

import torch

from services.asr.engine.features import HOP_SAMPLES, STFT_HALF_WINDOW


class StepFeatures:
    """The model's mel front end (NeMo's FilterbankFeatures) for frames [skip, skip + count) of segments of one width,
    as plain tensor operations that a CUDA graph can hold: pre-emphasis, framing, the windowed DFT as one matmul,
    magnitude, power, filterbank, log. Equal to the preprocessor to float rounding.

    Why not the preprocessor itself inside a graph: its STFT runs cuFFT plans, which belong to a least-recently-used
    cache of 4,096 plans per device. A graph would keep executing a captured plan's kernels after the cache had
    evicted and destroyed that plan (the eager path makes a plan for every new shape: each Recognize clip length,
    each short last chunk), i.e. read freed memory. A matmul owns nothing outside the graph."""

    def __init__(self, preprocessor, skip: int, count: int, device):
        featurizer = preprocessor.featurizer
        normalize = featurizer.normalize
        if (
            isinstance(normalize, dict)
            or normalize in ("per_feature", "all_features")
            or featurizer.frame_splicing != 1
            or featurizer.exact_pad
            or featurizer.use_grads
            or featurizer.hop_length != HOP_SAMPLES
            or featurizer.n_fft // 2 != STFT_HALF_WINDOW
        ):
            raise ValueError(
                "the model's mel front end (per-feature normalization, frame splicing, exact padding or another hop) "
                "cannot run inside a padded step: serve it with --features-in-step false"
            )
        self.skip, self.count = skip, count
        self.preemph = featurizer.preemph
        self.mag_power = featurizer.mag_power
        self.log = featurizer.log
        self.guard_type = featurizer.log_zero_guard_type
        self.guard = featurizer.log_zero_guard_value_fn(torch.zeros((), dtype=torch.float32))
        self.pad_value = featurizer.pad_value
        n_fft = featurizer.n_fft
        window = torch.zeros(n_fft, dtype=torch.float64)  # torch.stft centres a shorter window in n_fft
        offset = (n_fft - featurizer.win_length) // 2
        window[offset : offset + featurizer.win_length] = featurizer.window.double().cpu()
        sample = torch.arange(n_fft, dtype=torch.float64)[:, None]
        frequency = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[None, :]
        angle = 2 * torch.pi * sample * frequency / n_fft
        basis = torch.cat((window[:, None] * torch.cos(angle), -window[:, None] * torch.sin(angle)), dim=1)
        self.basis = basis.float().to(device)  # [n_fft, 2 * bins]: real parts, then imaginary
        self.bins = n_fft // 2 + 1
        self.filterbank = featurizer.fb[0].float().to(device)  # [mels, bins]

    def __call__(self, audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Mel frames [B, mels, count] of audio [B, width] (float32) whose rows end at `lengths` [B]."""
        width = audio.shape[1]
        if self.preemph is not None:  # as the preprocessor: the first sample kept, the row zeroed past its length
            audio = torch.cat((audio[:, :1], audio[:, 1:] - self.preemph * audio[:, :-1]), dim=1)
            audio = audio.masked_fill(torch.arange(width, device=audio.device) >= lengths[:, None], 0.0)
        padded = torch.nn.functional.pad(audio, (STFT_HALF_WINDOW, STFT_HALF_WINDOW))  # center=True, zeros
        frames = padded.unfold(1, 2 * STFT_HALF_WINDOW, HOP_SAMPLES)[:, self.skip : self.skip + self.count]
        spectrum = frames @ self.basis  # [B, count, 2 * bins]
        real, imaginary = spectrum[..., : self.bins], spectrum[..., self.bins :]
        power = torch.sqrt(real * real + imaginary * imaginary)
        if self.mag_power != 1.0:
            power = power.pow(self.mag_power)
        mel = torch.matmul(self.filterbank, power.transpose(1, 2))  # [B, mels, count]
        if self.log:
            if self.guard_type == "add":
                mel = torch.log(mel + self.guard)
            else:
                mel = torch.log(torch.clamp(mel, min=self.guard))
        frame = torch.arange(self.skip, self.skip + self.count, device=audio.device)
        return mel.masked_fill((frame[None, :] >= lengths[:, None] // HOP_SAMPLES)[:, None, :], self.pad_value)
