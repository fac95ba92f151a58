"""Admission: at most `limit` calls at once, counted in this process or, for a pod of several front-end processes
(frontends.py), in one shared counter.

Why shared: the kernel spreads connections over the front ends (SO_REUSEPORT), not calls, and one client channel
stays with one front end. A fixed share of the limit per front end would refuse a caller whose channels happened to
land on one front end while the others had room. With one counter in shared memory every front end admits while the
pod has room and refuses once it has none, whichever front end a call came through.

A front end that dies holding admissions does not give them back, but then the pod stops (frontends.py), so no
counter outlives it. One killed inside the counter's few-microsecond update would leave its lock held: the others
then wait at most LOCK_TIMEOUT_S for it and refuse (logged), rather than hang their event loops while the pod drains.
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 1.0


def shared_counter() -> Any:
    """A counter for the front ends of one pod: made before they start, passed to each with its start arguments."""
    return multiprocessing.get_context("spawn").Value("i", 0)


class Admission:
    """Admits while fewer than `limit` are in; `shared` (from `shared_counter`) counts across processes, else a count
    of this process's own (one event loop: no lock)."""

    def __init__(self, limit: int, shared: Any = None):
        self.limit = limit
        self.shared = shared
        self.local = 0  # used when not shared

    def try_enter(self) -> bool:
        """Take one place if there is one (never blocks on the others for more than a counter update)."""
        return self._add(1)

    def leave(self) -> None:
        """Give back a place taken by `try_enter`."""
        self._add(-1)

    def _add(self, step: int) -> bool:
        if self.shared is None:
            if step > 0 and self.local >= self.limit:
                return False
            self.local += step
            return True
        lock = self.shared.get_lock()
        if not lock.acquire(timeout=LOCK_TIMEOUT_S):
            log.error("the pod's admission counter stayed locked %.1f s (a front end died holding it?)", LOCK_TIMEOUT_S)
            return False
        try:
            if step > 0 and self.shared.value >= self.limit:
                return False
            self.shared.value += step
            return True
        finally:
            lock.release()

    @property
    def held(self) -> int:
        """Places held: this process's, or the pod's when shared."""
        return self.local if self.shared is None else self.shared.value
