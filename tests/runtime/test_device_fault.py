"""A CUDA fault ends the process that met it (voiceagent/serving/device_fault.py): checked in child processes, since
the point is that the process goes away."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from voiceagent.serving.device_fault import DEVICE_FAULT_EXIT, device_fault

CHILD = """
import logging, signal, sys, time, torch
from voiceagent.serving.device_fault import end_process_after
if {ignore_term}:  # as an engine or worker process does
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
errors = {{
    "accelerator": torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
    "old-torch": RuntimeError("CUDA error: an illegal memory access was encountered"),
    "oom": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    "value": ValueError("CUDA error: not really, a bad argument"),
}}
print(end_process_after(errors["{kind}"], logging.getLogger("test")), flush=True)
print(end_process_after(errors["{kind}"], logging.getLogger("test")), flush=True)  # a second fault: one SIGTERM
time.sleep(3)
print("still here", flush=True)
"""


def run_child(kind: str, ignore_term: bool = False) -> subprocess.CompletedProcess:
    code = CHILD.format(kind=kind, ignore_term=ignore_term)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("kind", ["accelerator", "old-torch"])
def test_a_cuda_fault_ends_the_process_soon_and_says_why(kind):
    started = time.monotonic()
    child = run_child(kind)
    assert child.returncode == -15, (child.returncode, child.stdout, child.stderr)  # SIGTERM, not the sleep's end
    assert time.monotonic() - started < 2.5
    assert child.stdout.split() == ["True", "True"]
    assert "device fault" in child.stderr and "illegal memory access" in child.stderr


def test_an_engine_process_that_ignores_sigterm_exits_with_the_device_fault_code():
    started = time.monotonic()
    child = run_child("accelerator", ignore_term=True)
    assert child.returncode == DEVICE_FAULT_EXIT, (child.returncode, child.stdout, child.stderr)
    assert time.monotonic() - started < 2.5
    assert child.stdout.split() == ["True", "True"]
    assert "device fault" in child.stderr and "illegal memory access" in child.stderr


@pytest.mark.parametrize("kind", ["oom", "value"])
def test_other_errors_leave_the_process_alone(kind):
    child = run_child(kind)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["False", "False", "still", "here"]


def test_what_counts_as_a_device_fault():
    assert device_fault(torch.AcceleratorError("CUDA error: unspecified launch failure"))
    assert not device_fault(torch.OutOfMemoryError("CUDA out of memory"))
    assert not device_fault(RuntimeError("shape mismatch"))
    assert not device_fault(KeyError("CUDA error"))
