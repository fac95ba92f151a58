"""The measured crossover: where the levels' counted arithmetic intensity reaches the ridge (the H200 run's LLM:
185 FLOP/byte at C=128 and 284 at C=256 against a ridge of 192 put it at C ≈ 136)."""

from __future__ import annotations

import pytest

from loadgen.analysis.table import measured_crossover
from loadgen.analysis.verdicts import LevelVerdict


def _level(concurrency: int, intensity: float, source: str = "counters") -> LevelVerdict:
    return LevelVerdict(concurrency, "bandwidth-bound", [], "", 0.5, 0.1, intensity, source, None)


def test_interpolated_between_the_levels_either_side_of_the_ridge():
    levels = [_level(64, 107.4), _level(128, 185.4), _level(256, 284.2), _level(512, 372.1)]
    assert measured_crossover(levels, 192.0) == pytest.approx(136, abs=1)
    assert measured_crossover(levels, 185.4) == 128  # exactly on a level


def test_none_when_the_counters_never_reach_the_ridge_or_there_are_none():
    assert measured_crossover([_level(1, 2.0), _level(64, 100.0)], 192.0) is None
    assert measured_crossover([_level(1, 500.0, "estimated")], 192.0) is None
    assert measured_crossover([_level(1, 250.0), _level(2, 300.0)], 192.0) == 1  # above from the first level
