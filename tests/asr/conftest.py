"""ASR test fixtures: a tiny `.nemo` checkpoint saved locally, and real servers in their own processes.

The cache-aware server restores that checkpoint (the real-checkpoint path); the buffered one builds the
tiny preset, and runs it in the gRPC process (`--engine-process false`; the others run their model in an
engine process). Both record every stream's encoder output to a directory (`--record-encoder-dir`), which
is how tests compare streamed encoder frames with an offline pass bit for bit.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.harness import REPO, running_service, venv_python

BUFFERED_WINDOW_MS = 960
JOIN_WINDOW_MS = 100  # wider than the default 20 ms: the test clients' start times jitter by several ms


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    """The tiny preset saved with NeMo's own `save_to`, in a child process like the servers."""
    path = tmp_path_factory.mktemp("checkpoint") / "tiny.nemo"
    script = (
        "from services.asr.config import AsrConfig; from services.asr.engine import fastconformer as fc; "
        f"model, _ = fc.build_model(AsrConfig(preset='tiny').preset_file, seed=7); model.save_to({str(path)!r})"
    )
    subprocess.run([venv_python("asr"), "-c", script], cwd=REPO, check=True, capture_output=True, timeout=300)
    return str(path)


@pytest.fixture(scope="session")
def record_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("encoder")


@pytest.fixture(scope="session")
def cache_aware(tiny_checkpoint, record_dir):
    args = ["--model-path", tiny_checkpoint, "--max-streams", "4", "--probe-ceilings", "false"]
    args += ["--record-encoder-dir", str(record_dir), "--threads", "1"]
    args += ["--join-window-ms", str(JOIN_WINDOW_MS)]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


@pytest.fixture(scope="session")
def buffered(record_dir):
    args = ["--preset", "tiny", "--backend", "buffered", "--buffered-window-ms", str(BUFFERED_WINDOW_MS)]
    args += ["--probe-ceilings", "false", "--record-encoder-dir", str(record_dir), "--threads", "1"]
    args += ["--engine-process", "false"]  # the single-process mode (steps in a worker thread) stays covered
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


@pytest.fixture(scope="session")
def bfloat16(record_dir):
    """The tiny preset computing in bfloat16 (the GPU setting), on the CPU."""
    args = ["--preset", "tiny", "--dtype", "bfloat16", "--max-streams", "2", "--probe-ceilings", "false"]
    args += ["--record-encoder-dir", str(record_dir), "--threads", "1"]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


@pytest.fixture(scope="session")
def padded(tiny_checkpoint, record_dir):
    """Steady steps on padded batch-size buckets 1, 2, 4, 5 in static buffers, eagerly: the CPU twin of the
    CUDA-graph path (the same function a GPU captures, on the same padded buffers and scratch slot)."""
    args = ["--model-path", tiny_checkpoint, "--max-streams", "5", "--probe-ceilings", "false"]
    args += ["--record-encoder-dir", str(record_dir), "--threads", "1", "--padded-steps", "true"]
    args += ["--join-window-ms", str(JOIN_WINDOW_MS)]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service


@pytest.fixture(scope="session", params=["ready", "clocked"])
def overlapped(request, tiny_checkpoint, record_dir):
    """Overlapped steps forced on the CPU (auto is on only on a CUDA device), on padded steps: a step is launched
    while the last is still to be read back. Two streams per step, so four streams take two steps per chunk; under
    either step policy."""
    args = ["--model-path", tiny_checkpoint, "--max-streams", "4", "--max-batch-streams", "2"]
    args += ["--step-policy", request.param]
    args += ["--probe-ceilings", "false", "--record-encoder-dir", str(record_dir), "--threads", "1"]
    args += ["--padded-steps", "true", "--overlap-steps", "on", "--join-window-ms", str(JOIN_WINDOW_MS)]
    with running_service("services.asr", venv_python("asr"), args) as service:
        yield service
