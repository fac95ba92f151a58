"""CUDA graphs on vs off (GPU only): the captured first and steady steps give the transcripts and encoder
outputs of the eager step, also after a long Recognize stepped in its offline lane; so do graphs given mel frames
computed before the step (--features-in-step false) and graphs of the fused encoder. On the CPU these are
skipped; tests/asr/test_padded_steps.py checks the same padded path (bucket choice, padding rows, slot
mapping) there, and tests/asr/test_graph_inputs.py that what a step reads stays alive and in place."""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from tests.asr.client import clip, config, metric, recorded, streams_together, stub
from tests.harness import running_service, venv_python
from voiceagent.v1 import asr_pb2, common_pb2

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")

BACKEND = "nemo-cache-aware"
PRESET = "fastconformer-small"
BF16_TOLERANCE = 0.05  # encoder outputs of order 1 in bfloat16 (8 mantissa bits); the same kernels give 0


def _service(record_dir, name: str, *flags: str):
    args = ["--preset", PRESET, "--device", "cuda", "--dtype", "bfloat16", "--max-streams", "8"]
    args += ["--max-batch-streams", "8", "--probe-ceilings", "false", "--join-window-ms", "100"]
    args += ["--record-encoder-dir", str(record_dir / name), *flags]
    return running_service("services.asr", venv_python("asr"), args)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    record_dir = tmp_path_factory.mktemp("graphs")
    with (
        _service(record_dir, "graphs", "--cuda-graphs", "true") as graphs,
        _service(record_dir, "padded", "--cuda-graphs", "false", "--padded-steps", "true") as padded,
        _service(record_dir, "eager", "--cuda-graphs", "false") as eager,
        _service(record_dir, "host-features", "--cuda-graphs", "true", "--features-in-step", "false") as host,
        _service(record_dir, "fused", "--cuda-graphs", "true", "--fused-encoder", "true") as fused,
    ):
        running = {"graphs": graphs, "padded": padded, "eager": eager, "host-features": host, "fused": fused}
        yield record_dir, running


def _recorded(directory, request_id: str):
    """The recorded stream, retried for a few seconds; on failure the file's size and first bytes say what
    was there (the first H200 run failed reading one: 'source code cannot contain null bytes')."""
    path = directory / f"{request_id}.{BACKEND}.streaming.npz"
    deadline = time.monotonic() + 5
    while True:
        try:
            return recorded(directory, request_id, BACKEND, "streaming")
        except Exception as exc:
            try:  # the members read whole, then parsed (np.load streams them from the zip)
                with zipfile.ZipFile(path) as archive:
                    arrays = {n[:-4]: np.lib.format.read_array(io.BytesIO(archive.read(n))) for n in archive.namelist()}
                return arrays["encoded"], arrays["token_ids"].tolist()
            except Exception:
                pass
            if time.monotonic() > deadline:
                head = path.read_bytes()[:96] if path.exists() else b"(missing)"
                listing = sorted(p.name for p in directory.iterdir())[:20]
                size = path.stat().st_size if path.exists() else None
                raise AssertionError(f"{path}: {exc!r}; size {size}; head {head!r}; dir {listing}") from exc
            time.sleep(0.2)


def _run(record_dir, services, chunk_ms: int, seconds: list[float]):
    clips = [clip(s, seed=60 + index) for index, s in enumerate(seconds)]
    results = {}
    for name, service in services.items():
        ids = [f"{name}-{chunk_ms}-{index}" for index in range(len(clips))]
        responses = streams_together(service, [config(chunk_ms, request_id=i) for i in ids], clips)
        outputs = [_recorded(record_dir / name, i) for i in ids]
        results[name] = ([r[-1].transcript for r in responses], outputs)
    return results


@pytest.mark.parametrize("chunk_ms", [320, 80])
def test_graphs_equal_eager(services, chunk_ms):
    record_dir, running = services
    info = stub(running["graphs"]).GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert info.limits["cuda_graphs"] == 1 and info.limits["graph_capture_s"] > 0
    # chunk sizes x (first, steady) x buckets 1, 2, 4, 8, and 80 ms's second step (its history is 1 mel frame)
    assert info.limits["cuda_graphs_captured"] == (5 * 2 + 1) * 4
    assert info.limits["graph_first_steps"] == 1
    before = metric(running["graphs"], "voiceagent_asr_padded_step_rows_total", chunk_ms=str(chunk_ms))
    results = _run(record_dir, running, chunk_ms, [2.0, 3.1, 2.6, 1.5, 3.1])  # 5 streams: bucket 8
    assert metric(running["graphs"], "voiceagent_asr_padded_step_rows_total", chunk_ms=str(chunk_ms)) > before
    graphs_text, graphs_out = results["graphs"]
    # padded: the same function eagerly; eager: NeMo's step; host-features: graphs given mel frames computed before
    # the step (cuFFT) instead of computing them inside it; fused: graphs of the fused encoder (not yet the default)
    for name in ("padded", "eager", "host-features", "fused"):
        text, outputs = results[name]
        worst = max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(graphs_out, outputs, strict=True))
        print(
            f"{chunk_ms} ms, graphs vs {name}: max |encoder difference| {worst:.3g}, "
            f"transcripts equal {text == graphs_text}"
        )
        assert worst <= (0 if name == "padded" else BF16_TOLERANCE)
        if name == "padded":  # the same kernels at the same shapes: identical
            assert [o[1] for o in outputs] == [o[1] for o in graphs_out]
        assert text == graphs_text


def test_graphs_after_a_long_recognize_still_equal_eager(services):
    """A Recognize longer than --offline-pass-s is stepped in the offline lane (slot max_streams, next to the
    scratch slot of padding rows) between live steps; streams stepped on graphs afterwards still give the
    eager transcripts, and so does the clip."""
    record_dir, running = services
    audio = clip(6.0, seed=90)
    texts = {}
    for name in ("graphs", "eager"):
        request = asr_pb2.RecognizeRequest(config=config(320, request_id=f"{name}-long"), audio=audio.tobytes())
        texts[name] = stub(running[name]).Recognize(request, timeout=120).transcript
    assert texts["graphs"] == texts["eager"]
    after = _run(record_dir, {name: running[name] for name in ("graphs", "eager")}, 320, [1.9, 2.6, 3.1])
    assert after["graphs"][0] == after["eager"][0]
