"""A lane for work whose size a client chooses: threads at a lower CPU priority than the serving path.

Tokenising a prompt costs ~1 ms per 4 KB on a CPU core. A client sending long prompts back to back (legal, or
just under a limit and refused once counted) keeps a thread busy on the cores the engine and the other requests'
threads use; at the same priority the kernel shares the core evenly, and a 5-character request's first token took
3x its quiet time (results/cpu/README.md, "LLM isolation"). In a `background_lane` that work runs niced (Linux
schedules threads, each with its own nice value): it gets the core while nothing else wants it, and yields it to
the engine and to small requests when they do. Nothing is slower on an idle machine.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading

LOW_PRIORITY_NICE = 10  # a nice-10 thread weighs ~1/10 of a nice-0 one in the kernel's fair share


def _lower_priority(nice: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # a platform without per-thread nice keeps the default
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def background_lane(name: str, workers: int = 1, nice: int = LOW_PRIORITY_NICE) -> concurrent.futures.Executor:
    """A thread pool whose threads run at `nice` (relative to the process's own, never above it)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=name, initializer=_lower_priority, initargs=(min(19, base + nice),)
    )
