"""A background lane's threads run at a lower CPU priority than the process (the kernel reads each thread's nice
value), and do the work they are given."""

from __future__ import annotations

import os
import threading

from voiceagent.serving.lanes import LOW_PRIORITY_NICE, background_lane


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_background_lane_runs_its_work_niced_and_leaves_the_rest_of_the_process_alone():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    lane = background_lane("test-lane", workers=2)
    try:
        nices = {lane.submit(_nice_of_this_thread).result(timeout=10) for _ in range(8)}
        assert nices == {min(19, base + LOW_PRIORITY_NICE)}
        assert lane.submit(sum, range(10)).result(timeout=10) == 45
    finally:
        lane.shutdown()
    assert _nice_of_this_thread() == base  # the caller's thread is untouched
    assert os.getpriority(os.PRIO_PROCESS, 0) == base
