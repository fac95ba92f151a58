"""Child processes die with the process that started them, however it dies (SIGKILL included) and whenever
(while they still load a model too): an engine process, a model worker, a front end or the engine core vLLM
starts never lives on as an orphan holding the model's memory.

The child watches its parent, in one of two ways:
- `PR_SET_PDEATHSIG` (Linux): the kernel sends the child SIGKILL the moment its parent dies. The kernel ties it
  to the parent *thread* that created the child, so it is used only when that was the parent's main thread,
  which lives as long as the process.
- Otherwise a watch thread: a child whose parent died is re-parented (to init or a sub-reaper), so its
  `getppid()` changes; the thread looks every `WATCH_S` and then kills its process. vLLM starts its engine core
  from the thread that builds the engine, so the engine core is watched this way.

How the child gets the watch: `TiedSpawnProcess` and `TiedForkProcess` are multiprocessing's process classes
that set it up in the child before anything else: a spawned child while it unpickles its process object, before
the target's modules (torch, vLLM: seconds of imports) load; a forked one as `run` begins. The child's own
children are tied the same way, so a chain of processes unwinds from the top. Our processes are started with
`start_process`; a library that starts processes with multiprocessing (vLLM: its engine core, that core's
workers) gets the tied classes once `children_die_with_us` put them in multiprocessing's contexts. vLLM has no
parent check of its own for the engine core (its workers watch the engine core through a pipe, but only once
their model is loaded).

A service the launcher (launcher.py: tests, benchmarks, the load generator) starts is told its launcher's pid in
its environment and stops with it too (`stop_with_launcher`: SIGTERM, so it drains and stops its engine).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

WATCH_S = 0.25
_PR_SET_PDEATHSIG = 1


_tied_pid = 0  # the process that die_with_parent has tied (a forked child inherits the value: not it)


def die_with_parent(parent_pid: int, parent_thread_is_main: bool, signum: int = signal.SIGKILL) -> None:
    """In a child process: be sent `signum` when `parent_pid` dies. `parent_thread_is_main`: the child was created
    by the parent's main thread (then the kernel's parent-death signal is safe to use)."""
    global _tied_pid
    _tied_pid = os.getpid()
    if parent_thread_is_main and sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0:
            if os.getppid() != parent_pid:  # the parent died before the signal was armed
                os.kill(os.getpid(), signum)
            return
    threading.Thread(target=_watch, args=(parent_pid, signum), name="parent-death-watch", daemon=True).start()


def _watch(parent_pid: int, signum: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_S)
    os.kill(os.getpid(), signum)


class _TieOnArrival:
    """Unpickled in a spawned child before the process object's target and arguments: ties the child."""

    def __init__(self, lifeline: tuple[int, bool]):
        self.lifeline = lifeline

    def __reduce__(self):
        return die_with_parent, self.lifeline


def _tied_process(_tie: None, cls: type):
    return cls.__new__(cls)


class _Tied:
    """Mixed into a multiprocessing process class: `start` notes who starts it; the child is tied on arrival
    (spawn) or as `run` begins (fork), and its own children will be tied too."""

    def start(self) -> None:
        self._lifeline = (os.getpid(), threading.current_thread() is threading.main_thread())
        super().start()

    def __reduce__(self):  # spawn pickles the process object for the child: the tie goes first
        return _tied_process, (_TieOnArrival(self._lifeline), type(self)), self.__dict__

    def run(self) -> None:
        if _tied_pid != os.getpid():
            die_with_parent(*self._lifeline)
        children_die_with_us()
        super().run()


class TiedSpawnProcess(_Tied, multiprocessing.context.SpawnProcess):
    pass


class TiedForkProcess(_Tied, multiprocessing.context.ForkProcess):
    pass


def start_process(target: Callable, args: Sequence[Any] = (), *, name: str, daemon: bool = False):
    """Start `target(*args)` in a spawned process (a clean interpreter: no inherited threads, locks or torch
    state) that dies with this one. `target` and `args` must pickle (a module-level function)."""
    process = TiedSpawnProcess(target=target, args=tuple(args), name=name, daemon=daemon)
    process.start()
    return process


def children_die_with_us() -> None:
    """Every process that this one starts with multiprocessing from now on, whoever starts it (a library's engine
    process, say), dies with it. Idempotent."""
    multiprocessing.get_context("spawn").Process = TiedSpawnProcess
    multiprocessing.get_context("fork").Process = TiedForkProcess


# --- a service started by the launcher (tests, benchmarks, the load generator's runs and soak) ----------------
LAUNCHER_ENV = "VOICEAGENT_STOP_WITH"


def launcher_env() -> dict[str, str]:
    """Environment for a service the launcher starts here: it stops when this process dies (`stop_with_launcher`)."""
    return {LAUNCHER_ENV: f"{os.getpid()}:{int(threading.current_thread() is threading.main_thread())}"}


def stop_with_launcher() -> None:
    """In a service's main process: if a launcher started it, SIGTERM when the launcher dies (the service drains
    and stops its engine; its children are tied to it). Read once and removed from the environment, so that the
    service's own children are tied to the service, not to the launcher."""
    if value := os.environ.pop(LAUNCHER_ENV, ""):
        pid, main = value.split(":")
        die_with_parent(int(pid), main == "1", signal.SIGTERM)
