"""Speech-like test audio, synthesised: voiced syllables with a moving pitch and formants, fricatives, pauses.

A recogniser's cost depends on how much audio it hears, not on what was said, but silence or a pure tone can
take shortcuts (voice-activity gating, blank-dominated decoding). This signal has what those shortcuts look
at: a harmonic source at 90–220 Hz shaped by three vowel formants that change every syllable, unvoiced
noise bursts, word gaps and phrase pauses, and a syllabic loudness contour — the spectral and temporal
structure of speech without needing a recording or a text-to-speech engine on the load-generator machine.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE_HZ = 16000

# (F1, F2, F3) in Hz of a few English vowels: /a/, /i/, /u/, /e/, /o/, /ae/.
_VOWEL_FORMANTS_HZ = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
                      (660, 1720, 2410))  # fmt: skip
_FORMANT_BANDWIDTH_HZ = (90.0, 110.0, 170.0)


def _formant_gain(freqs: np.ndarray, formants: tuple[int, int, int]) -> np.ndarray:
    """Magnitude of a cascade of three resonances at `freqs` (a vowel's spectral envelope)."""
    gain = np.ones_like(freqs)
    for centre, bandwidth in zip(formants, _FORMANT_BANDWIDTH_HZ, strict=True):
        gain *= 1.0 / np.sqrt(1.0 + ((freqs - centre) / (bandwidth / 2)) ** 2)
    return gain


def _syllable(rng: np.random.Generator, duration_s: float, rate: int) -> np.ndarray:
    n = int(duration_s * rate)
    t = np.arange(n) / rate
    f0_start, f0_end = rng.uniform(90, 220, size=2)
    f0 = np.linspace(f0_start, f0_end, n)  # intonation glides within a syllable
    phase = 2 * np.pi * np.cumsum(f0) / rate
    start, end = (_VOWEL_FORMANTS_HZ[i] for i in rng.integers(len(_VOWEL_FORMANTS_HZ), size=2))
    middle = tuple((a + b) // 2 for a, b in zip(start, end, strict=True))
    # Formants glide from one vowel to the next (diphthong-like): each harmonic's gain is interpolated between
    # the envelopes at the start, middle and end of the syllable.
    voiced = np.zeros(n)
    for k in range(1, int(rate / 2 / f0.max())):
        anchors = [
            _formant_gain(np.array([k * f]), formants)[0]
            for f, formants in ((f0_start, start), (f0.mean(), middle), (f0_end, end))
        ]
        voiced += np.interp(t, [0, duration_s / 2, duration_s], anchors) * np.sin(k * phase)
    envelope = np.sin(np.pi * np.arange(n) / n) ** 0.6  # syllabic loudness contour
    segment = voiced * envelope
    if rng.random() < 0.4:  # an unvoiced consonant (fricative) leading into the vowel
        onset = int(rng.uniform(0.04, 0.09) * rate)
        noise = rng.standard_normal(onset)
        noise = np.diff(noise, prepend=0.0)  # high-pass: fricatives are bright
        segment[:onset] = 0.3 * noise * np.abs(segment).max() / (np.abs(noise).max() + 1e-9)
    return segment


@functools.lru_cache(maxsize=64)
def speech_like(duration_s: float, seed: int = 0, rate: int = SAMPLE_RATE_HZ) -> np.ndarray:
    """`duration_s` seconds of speech-like float32 audio in [-1, 1]: words of 1–3 syllables, gaps, pauses."""
    rng = np.random.default_rng(seed)
    pieces: list[np.ndarray] = []
    total = int(duration_s * rate)
    filled = 0
    words_in_phrase = 0
    while filled < total:
        for _ in range(int(rng.integers(1, 4))):
            pieces.append(_syllable(rng, float(rng.uniform(0.12, 0.28)), rate))
        words_in_phrase += 1
        pause_s = rng.uniform(0.25, 0.45) if words_in_phrase % 6 == 0 else rng.uniform(0.03, 0.12)
        pieces.append(1e-3 * rng.standard_normal(int(pause_s * rate)))  # room noise, not digital silence
        filled = sum(len(piece) for piece in pieces)
    audio = np.concatenate(pieces)[:total]
    audio = (0.7 * audio / (np.abs(audio).max() + 1e-9)).astype(np.float32)
    audio.setflags(write=False)  # shared between users through the cache
    return audio


def pcm16(audio: np.ndarray) -> bytes:
    """Little-endian signed 16-bit PCM, the encoding the services take by default."""
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
