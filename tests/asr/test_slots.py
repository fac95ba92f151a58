"""Cache slots: streams that start together read their caches as a view, also after earlier streams left."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # the asr environment always has it; the import is only slow

from services.asr.backend import StreamSettings  # noqa: E402
from services.asr.backends.in_process import load_in_process  # noqa: E402
from services.asr.config import AsrConfig  # noqa: E402
from services.asr.engine.slots import rows  # noqa: E402


def test_a_second_wave_of_streams_gets_consecutive_slots_whatever_order_the_first_left_in():
    backend = load_in_process(AsrConfig(preset="tiny", max_streams=8))
    settings = StreamSettings("wave", 160)
    first = [backend._new_stream(settings) for _ in range(5)]
    assert [stream.slot for stream in first] == [0, 1, 2, 3, 4]
    for index in (3, 0, 4, 1, 2):  # clients leave in their own order
        backend._release(first[index])
    second = [backend._new_stream(settings) for _ in range(3)]
    slots = [stream.slot for stream in second]
    assert slots == [0, 1, 2]
    assert rows(slots, "cpu") == slice(0, 3)  # a view of the pools, not a gathered copy
