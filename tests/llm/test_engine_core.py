"""On CPU the engine core busy-waits on the core the gRPC front end uses; the service lowers its priority."""

from __future__ import annotations

from tests.harness import child_processes, proc_stat

NICE = 16  # index of the nice value in proc_stat


def test_the_engine_core_runs_at_nice_10_and_the_front_end_at_0(tiny_llm):
    (core,) = child_processes(tiny_llm.proc.pid, lambda command: command.startswith(b"VLLM::EngineCore"))
    assert int(proc_stat(core)[NICE]) == 10
    assert int(proc_stat(tiny_llm.proc.pid)[NICE]) == 0
