"""Admission (voiceagent/serving/admission.py): a local limit, and one counter shared by a pod's front ends, here
two Admission objects in two spawned processes on one shared counter."""

from __future__ import annotations

import multiprocessing

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
