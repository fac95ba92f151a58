"""A Locust worker of a distributed sweep: runs users for the master and forwards their records to it.

The master opens and closes the request gate with a `loadgen_gate` message; on close the worker waits for its
in-flight requests (their records go first, on the same connection) and answers `loadgen_drained`.
"""

from __future__ import annotations

import dataclasses

import gevent
from locust.env import Environment

from loadgen.users import USERS, LoadContext
from loadgen.workload import Workload


def run_worker(target: str, master_host: str, master_port: int, workload: Workload) -> int:
    environment = Environment(user_classes=[USERS[target]])
    runner = environment.create_worker_runner(master_host, master_port)
    context = LoadContext(workload, lambda record: runner.send_message("loadgen_record", dataclasses.asdict(record)))
    environment.loadgen = context

    def drain(timeout_s: float) -> None:
        context.drain(timeout_s)
        runner.send_message("loadgen_drained", {"in_flight": context.in_flight})

    def gate(msg, **_) -> None:
        if msg.data["accepting"]:
            context.accepting = True
        else:
            gevent.spawn(drain, msg.data["drain_timeout_s"])

    runner.register_message("loadgen_gate", gate)
    runner.greenlet.join()
    context.close()
    return 0
