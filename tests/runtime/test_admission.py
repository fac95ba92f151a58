"""Admission (voiceagent/serving/admission.py): a local limit, and one counter shared by a pod's front ends, here
two Admission objects in two spawned processes on one shared counter."""

from __future__ import annotations

import multiprocessing
import threading

from voiceagent.serving.admission import Admission, shared_counter


def test_a_local_admission_admits_up_to_its_limit_and_again_after_a_leave():
    admission = Admission(2)
    assert admission.try_enter() and admission.try_enter()
    assert not admission.try_enter() and admission.held == 2
    admission.leave()
    assert admission.try_enter()


def _enter(shared, limit: int, tries: int, results) -> None:
    admission = Admission(limit, shared)
    results.put(sum(admission.try_enter() for _ in range(tries)))


def test_front_ends_on_one_shared_counter_admit_the_pods_limit_between_them():
    context = multiprocessing.get_context("spawn")
    shared, results = shared_counter(), context.Queue()
    workers = [context.Process(target=_enter, args=(shared, 5, 4, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    admitted = sorted(results.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(10)
    assert sum(admitted) == 5 and admitted[1] == 4  # whichever came first took 4, the other the last place
    here = Admission(5, shared)
    assert not here.try_enter() and here.held == 5


def test_a_counter_left_locked_refuses_after_the_timeout_instead_of_hanging(monkeypatch):
    from voiceagent.serving import admission as module

    monkeypatch.setattr(module, "LOCK_TIMEOUT_S", 0.1)
    shared = shared_counter()
    held, done = threading.Event(), threading.Event()

    def hold() -> None:  # another thread (the lock is re-entrant), as a front end killed in its update would
        with shared.get_lock():
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        assert not Admission(5, shared).try_enter()
    finally:
        done.set()
        holder.join()
    assert Admission(5, shared).try_enter()  # unlocked again: admits
