"""The client-side measures on known inputs: playback underruns, per-token timing, lengths, speech-like audio."""

from __future__ import annotations

import random

import numpy as np
import pytest

from loadgen.levels import level_result
from loadgen.results import RequestRecord, ServerCounters
from loadgen.speech import SAMPLE_RATE_HZ, speech_like
from loadgen.timing import Playback, TokenClock
from loadgen.workload import Lengths, Workload


def test_playback_underrun_is_a_gap_longer_than_the_audio_ahead():
    playback = Playback()
    playback.arrive(now=10.0, duration_s=0.5)  # plays 10.0–10.5
    playback.arrive(now=10.4, duration_s=0.5)  # 0.1 s still ahead: no underrun; plays until 11.0
    assert playback.underruns == 0
    playback.arrive(now=11.3, duration_s=0.5)  # 0.3 s of silence
    assert playback.underruns == 1 and playback.stalled_s == pytest.approx(0.3)
    playback.arrive(now=11.7, duration_s=0.5)  # playback resumed at 11.3: 0.1 s ahead again
    assert playback.underruns == 1 and playback.delivered_s == pytest.approx(2.0)


def test_token_clock_spreads_a_multi_token_message_over_its_gap():
    record = RequestRecord("llm", 1, 0.0, True)
    clock = TokenClock(record, started=100.0)
    clock.arrived(100.2, 1)  # TTFT 0.2 s
    clock.arrived(100.3, 1)
    clock.arrived(100.5, 2)  # two tokens in one message after 0.2 s: 0.1 s each
    clock.finish()
    assert record.first_s == pytest.approx(0.2)
    assert record.gaps_s == pytest.approx([0.1, 0.1, 0.1])
    assert record.units == 4 and record.extra["decode_tokens_per_s"] == pytest.approx(3 / 0.3)


def test_lengths_parse_and_stay_in_range():
    rng = random.Random(0)
    assert Lengths("64").sample(rng) == 64
    assert all(32 <= Lengths("32-48").sample(rng) <= 48 for _ in range(100))
    samples = [Lengths("lognormal:64,0.5").sample(rng) for _ in range(2000)]
    assert 55 <= float(np.median(samples)) <= 73
    for bad in ("", "abc", "9-3", "lognormal:64"):
        with pytest.raises(ValueError):
            Lengths(bad)


def test_workload_survives_the_trip_to_a_worker():
    workload = Workload(prompt_tokens=Lengths("10-20"), vocab_size=5000, inference_timesteps=4)
    assert Workload.from_json(workload.to_json()) == workload
    ids = workload.prompt_ids(random.Random(1))
    assert 10 <= len(ids) <= 20 and max(ids) < 5000
    assert workload.prompt_ids(random.Random(1)) != workload.prompt_ids(random.Random(2))  # distinct prompts


def test_speech_like_audio_has_voiced_sound_and_pauses():
    audio = speech_like(3.0, seed=1)
    assert audio.shape == (3 * SAMPLE_RATE_HZ,) and audio.dtype == np.float32
    frames = audio.reshape(-1, 160)  # 10 ms frames
    energy = (frames**2).mean(axis=1)
    loud = energy > 0.01 * energy.max()
    assert 0.4 < loud.mean() < 0.95  # speech and pauses, neither silence nor a continuous tone
    spectrum = np.abs(np.fft.rfft(audio))
    freqs = np.fft.rfftfreq(len(audio), 1 / SAMPLE_RATE_HZ)
    assert freqs[spectrum.argmax()] < 1000  # energy sits where voices are, below the second formant


def test_level_result_counts_only_successes_and_names_the_errors():
    ok = RequestRecord("tts", 2, 0.0, True, latency_s=2.0, first_s=0.1, gaps_s=[0.2], units=1.5,
                       extra={"underruns": 0.0, "underrun_s": 0.0})  # fmt: skip
    bad = RequestRecord("tts", 2, 0.0, False, error="RESOURCE_EXHAUSTED: queue full", latency_s=0.01)
    level = level_result("tts", 2, [ok, ok, bad], duration_s=3.0, server=ServerCounters())
    assert level.requests == 2 and level.errors == 1
    assert level.throughput == pytest.approx(1.0)  # 3 audio seconds in 3 s
    assert level.per_request_speed == pytest.approx(0.75) and level.realtime_ok is True
    assert level.extra["errors.RESOURCE_EXHAUSTED"] == 1
