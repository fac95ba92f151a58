"""A device fault ends the process that met it, so that its orchestrator starts a fresh one.

A CUDA error such as an illegal memory access is sticky: every later kernel of the process fails with it, while the
process itself lives on. An ASR engine on an H100 that met one went on accepting streams and failing each of them
(results/h200/README.md, v7), and health still said SERVING. After a device fault the process's device is unusable
until it exits, so the only way back is a new process.

`device_fault(error)` says whether `error` is one; `end_process_after(error, log)` logs it and ends this process
once, a moment later (the calls that met the fault get their errors out first). A gRPC process gets SIGTERM and
drains as on any; an engine or worker process, which ignores SIGTERM (its parent stops it), exits with
DEVICE_FAULT_EXIT, and its parent, which watches it, does what it does when its child dies: the ASR and TTS gRPC
processes fail their open calls with UNAVAILABLE and exit in turn, the TTS worker pool starts a new worker.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

_ended = threading.Event()
DELAY_S = 0.5  # for the failed calls' errors to leave
DEVICE_FAULT_EXIT = 70  # EX_SOFTWARE


def device_fault(error: BaseException) -> bool:
    """A CUDA (accelerator) runtime error: torch raises them as `torch.AcceleratorError` (older torch: RuntimeError
    'CUDA error: ...'). Out of memory is not one (`torch.OutOfMemoryError`): the device still works."""
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return isinstance(error, RuntimeError) and str(error).startswith("CUDA error")


def end_process_after(error: BaseException, log: logging.Logger) -> bool:
    """If `error` is a device fault, have this process end (once) and say so; whether it was one."""
    if not device_fault(error):
        return False
    if not _ended.is_set():
        _ended.set()
        log.critical("device fault, this process (pid %d) ends so that a fresh one can start: %s", os.getpid(), error)
        timer = threading.Timer(DELAY_S, _end)
        timer.daemon = True
        timer.start()
    return True


def exit_cause(code: int | None) -> str:
    """What a parent adds to "exited (code N)" of a child that ended itself after a device fault."""
    return " after a device fault (its log names the error)" if code == DEVICE_FAULT_EXIT else ""


def _end() -> None:
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:  # an engine or worker process: its parent stops it
        os._exit(DEVICE_FAULT_EXIT)
    os.kill(os.getpid(), signal.SIGTERM)
