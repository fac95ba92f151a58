"""CUDA graphs on vs off (GPU only), also after a long Recognize stepped in its offline lane:
- graphs (the defaults: mel frames from the preprocessor's cuFFT STFT before the step) give the eager service's
  transcripts and its encoder outputs within bf16 tolerance;
- graphs that compute the mel frames inside the step (--features-in-step true: a DFT as a matmul, equal to the
  preprocessor to float rounding, tests/asr/test_features.py) equal the same padded steps run eagerly, exactly (same
  kernels, same shapes), and stay within bf16 tolerance of the default graphs, as graphs of the fused encoder do.
  Transcripts across different mel arithmetic are printed, not compared: with random weights a rounding difference
  in one mel frame changes later tokens (session 19's H100 run: a 6 s Recognize diverged after ~90 characters).
On the CPU these are skipped; tests/asr/test_padded_steps.py checks the same padded path (bucket choice, padding
rows, slot mapping) there, and tests/asr/test_graph_inputs.py that what a step reads stays alive and in place."""

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
        _service(record_dir, "eager", "--cuda-graphs", "false") as eager,
        _service(record_dir, "in-step", "--cuda-graphs", "true", "--features-in-step", "true") as in_step,
        _service(
            record_dir, "padded", "--cuda-graphs", "false", "--padded-steps", "true", "--features-in-step", "true"
        ) as padded,
        _service(record_dir, "fused", "--cuda-graphs", "true", "--fused-encoder", "true") as fused,
    ):
        running = {"graphs": graphs, "eager": eager, "in-step": in_step, "padded": padded, "fused": fused}
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
            if time.monotonic() > deadline:  # what was there: session 19's H100 run found null bytes in a header
                data = path.read_bytes() if path.exists() else b""
                nulls = [i for i, byte in enumerate(data[:256]) if byte == 0]
                listing = sorted(p.name for p in directory.iterdir())[:20]
                raise AssertionError(
                    f"{path}: {exc!r}; size {len(data)}; first 256 bytes {data[:256]!r}; null bytes at {nulls}; "
                    f"dir {listing}"
                ) from exc
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
    # in-step vs padded: the same steps eagerly (identical); graphs vs eager: graphs given the preprocessor's mel
    # frames against NeMo's step (transcripts equal); graphs vs in-step and fused: mel rounding and the fused
    # encoder's arithmetic (encoder outputs within bf16 tolerance)
    pairs = [("in-step", "padded", 0.0, True), ("graphs", "eager", BF16_TOLERANCE, True)]
    pairs += [("graphs", name, BF16_TOLERANCE, False) for name in ("in-step", "fused")]
    for one, other, tolerance, same_text in pairs:
        (text, outputs), (other_text, other_outputs) = results[one], results[other]
        worst = max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(outputs, other_outputs, strict=True))
        print(
            f"{chunk_ms} ms, {one} vs {other}: max |encoder difference| {worst:.3g}, "
            f"transcripts equal {text == other_text}"
        )
        assert worst <= tolerance, (one, other, worst)
        if tolerance == 0:  # the same kernels at the same shapes: identical tokens too
            assert [o[1] for o in outputs] == [o[1] for o in other_outputs]
        if same_text:
            assert text == other_text, (one, other)


def test_graphs_after_a_long_recognize_still_equal_eager(services):
    """A Recognize longer than --offline-pass-s is stepped in the offline lane (slot max_streams, next to the
    scratch slot of padding rows) between live steps; streams stepped on graphs afterwards still give the
    eager transcripts, and so does the clip."""
    record_dir, running = services
    audio = clip(6.0, seed=90)
    names = ("graphs", "eager", "in-step", "padded")  # the pairs whose transcripts must agree, as above
    texts = {}
    for name in names:
        request = asr_pb2.RecognizeRequest(config=config(320, request_id=f"{name}-long"), audio=audio.tobytes())
        texts[name] = stub(running[name]).Recognize(request, timeout=120).transcript
    print(f"long Recognize: in-step equals graphs {texts['in-step'] == texts['graphs']}")
    assert texts["graphs"] == texts["eager"]
    assert texts["in-step"] == texts["padded"]
    after = _run(record_dir, {name: running[name] for name in names}, 320, [1.9, 2.6, 3.1])
    assert after["graphs"][0] == after["eager"][0]
    assert after["in-step"][0] == after["padded"][0]
