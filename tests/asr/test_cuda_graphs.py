"""CUDA graphs on vs off (GPU only), also after a long Recognize stepped in its offline lane.

Exactly equal are paths that run the same arithmetic: a service's graphs against the same padded steps run eagerly
(same kernels at the same shapes), for the default graphs (mel frames from the preprocessor's STFT before the step)
and for --features-in-step true (the mel frames inside the step: a DFT as a matmul), in bfloat16 as served. Same
shapes means the same padded bucket: which streams share a step depends on timing (batch wait, overlapped steps), so
two services can run one stream's step in buckets 8 and 4 (session 24's H100 run: 80 ms, graphs vs padded differed
by 0.039). The services record each step's streams, and a stream's encoder outputs and tokens are compared exactly up
to its first step run in another bucket; from there on its caches hold other roundings.

Against NeMo's own eager step (other shapes, other kernels), against the in-step mel and against the fused encoder,
the comparison runs in float32, where other kernels only reorder sums. In bfloat16 it could not tell a bug from
rounding: with random weights the encoder's output hardly depends on its input (two noise clips differ by at most
~0.13 after its final norm, CPU), and NeMo's bf16 step already differs from ours by 0.094 (session 24). So each float32
pair must agree far more closely than two different streams do, and the test checks that margin too. Transcripts
there are printed, not compared: with random weights the logits have no margin, and one rounding difference flips a
token and every later one. On the CPU these are skipped; tests/asr/test_padded_steps.py checks the same padded path
(bucket choice, padding rows, slot mapping) there, and tests/asr/test_graph_inputs.py that what a step reads stays
alive and in place."""

from __future__ import annotations

import contextlib
import io
import time
import zipfile

import numpy as np
import pytest

from services.asr.engine.step_graphs import bucket_for, buckets_up_to
from tests.asr.client import clip, config, metric, streams_together, stub
from tests.harness import start_service, venv_python
from voiceagent.v1 import asr_pb2, common_pb2

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")

BACKEND = "nemo-cache-aware"
PRESET = "fastconformer-small"
MAX_STREAMS = 8
BUCKETS = buckets_up_to(MAX_STREAMS)
FLOAT32_TOLERANCE = 0.01  # max |difference| of float32 encoder outputs (RMS 1 after the final norm); reordered sums
SPREAD_OVER_TOLERANCE = 5  # two different streams must differ at least this many tolerances: the check can fail


def _service(record_dir, name: str, dtype: str, *flags: str):
    args = ["--preset", PRESET, "--device", "cuda", "--dtype", dtype, "--max-streams", str(MAX_STREAMS)]
    args += ["--max-batch-streams", str(MAX_STREAMS), "--probe-ceilings", "false", "--join-window-ms", "100"]
    args += ["--record-encoder-dir", str(record_dir / name), *flags]
    # float32 means float32: cuDNN's convolutions would otherwise round their inputs to TF32 (10 mantissa bits)
    env = {"NVIDIA_TF32_OVERRIDE": "0"} if dtype == "float32" else None
    return start_service("services.asr", venv_python("asr"), args, env)


# name -> (dtype, flags); each service records its streams' encoder outputs in its own folder
SERVICES = {
    "graphs": ("bfloat16", "--cuda-graphs", "true"),
    "padded": ("bfloat16", "--cuda-graphs", "false", "--padded-steps", "true"),
    "in-step": ("bfloat16", "--cuda-graphs", "true", "--features-in-step", "true"),
    "padded-in-step": ("bfloat16", "--cuda-graphs", "false", "--padded-steps", "true", "--features-in-step", "true"),
    "graphs-fp32": ("float32", "--cuda-graphs", "true"),
    "eager-fp32": ("float32", "--cuda-graphs", "false"),
    "in-step-fp32": ("float32", "--cuda-graphs", "true", "--features-in-step", "true"),
    "fused-fp32": ("float32", "--cuda-graphs", "true", "--fused-encoder", "true"),
}
SAME_ARITHMETIC = [("graphs", "padded"), ("in-step", "padded-in-step")]  # exact, step by step, per bucket
WITHIN_FLOAT32 = [("graphs-fp32", "eager-fp32"), ("graphs-fp32", "in-step-fp32"), ("graphs-fp32", "fused-fp32")]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    record_dir = tmp_path_factory.mktemp("graphs")
    with contextlib.ExitStack() as stack:
        running = {}
        for name, spec in SERVICES.items():  # started together: each loads its model and captures its graphs at once
            running[name] = _service(record_dir, name, *spec)
            stack.callback(running[name].stop)
        for service in running.values():
            service.wait_serving(600)
        yield record_dir, running


def _recorded(directory, request_id: str) -> dict[str, np.ndarray]:
    """The recorded stream (encoder frames, tokens, and per step: frames, tokens, streams), retried for a few
    seconds; on failure the file's size and first bytes say what was there (the first H200 run failed reading one:
    'source code cannot contain null bytes')."""
    path = directory / f"{request_id}.{BACKEND}.streaming.npz"
    deadline = time.monotonic() + 5
    while True:
        try:  # the members read whole, then parsed (np.load streams them from the zip)
            with zipfile.ZipFile(path) as archive:
                return {n[:-4]: np.lib.format.read_array(io.BytesIO(archive.read(n))) for n in archive.namelist()}
        except Exception as exc:
            if time.monotonic() > deadline:  # what was there: session 19's H100 run found null bytes in a header
                data = path.read_bytes() if path.exists() else b""
                nulls = [i for i, byte in enumerate(data[:256]) if byte == 0]
                listing = sorted(p.name for p in directory.iterdir())[:20]
                raise AssertionError(
                    f"{path}: {exc!r}; size {len(data)}; first 256 bytes {data[:256]!r}; null bytes at {nulls}; "
                    f"dir {listing}"
                ) from exc
            time.sleep(0.2)


def _run(record_dir, services, chunk_ms: int, seconds: list[float]) -> dict[str, tuple[list[str], list[dict]]]:
    clips = [clip(s, seed=60 + index) for index, s in enumerate(seconds)]
    results = {}
    for name, service in services.items():
        ids = [f"{name}-{chunk_ms}-{index}" for index in range(len(clips))]
        responses = streams_together(service, [config(chunk_ms, request_id=i) for i in ids], clips)
        outputs = [_recorded(record_dir / name, i) for i in ids]
        results[name] = ([r[-1].transcript for r in responses], outputs)
    return results


def _same_buckets(one: dict, other: dict) -> int:
    """How many leading steps of one stream two services ran in the same padded bucket."""
    steps = 0
    for a, b in zip(one["step_rows"], other["step_rows"], strict=False):
        if bucket_for(int(a), BUCKETS) != bucket_for(int(b), BUCKETS):
            break
        steps += 1
    return steps


def _assert_same_arithmetic(label: str, one_name: str, one, other_name: str, other) -> None:
    """`one` and `other` (transcripts, recordings) of the same streams: identical encoder outputs and tokens over
    each stream's steps run in the same buckets, and identical transcripts where every step was."""
    (text, outputs), (other_text, other_outputs) = one, other
    compared = 0
    for index, (a, b) in enumerate(zip(outputs, other_outputs, strict=True)):
        steps = _same_buckets(a, b)
        assert list(a["step_frames"][:steps]) == list(b["step_frames"][:steps]), (label, index)
        frames, tokens = int(a["step_frames"][:steps].sum()), int(a["step_tokens"][:steps].sum())
        worst = float(np.abs(a["encoded"][:frames] - b["encoded"][:frames]).max()) if frames else 0.0
        print(
            f"{label}, {one_name} vs {other_name}, stream {index}: {steps} of {len(a['step_rows'])} steps in the same "
            f"buckets ({a['step_rows'].tolist()} vs {b['step_rows'].tolist()} streams), max |encoder difference| "
            f"there {worst:.3g}"
        )
        assert worst == 0.0, (label, one_name, other_name, index, worst)
        assert a["step_tokens"][:steps].tolist() == b["step_tokens"][:steps].tolist(), (label, index)
        assert a["token_ids"][:tokens].tolist() == b["token_ids"][:tokens].tolist(), (label, index)
        if steps == len(a["step_rows"]) == len(b["step_rows"]):
            assert text[index] == other_text[index], (label, index)
        compared += steps
    assert compared > 0, f"{label}: no step of {one_name} and {other_name} ran in the same bucket"


def _assert_within_float32(label: str, one_name: str, one, other_name: str, other) -> None:
    """Other kernels in float32: encoder outputs within FLOAT32_TOLERANCE, while two different streams of `one`
    differ by at least SPREAD_OVER_TOLERANCE tolerances (else the comparison could not see a stream's rows swapped
    for another's, or a stale cache)."""
    (text, outputs), (other_text, other_outputs) = one, other
    worst = max(float(np.abs(a["encoded"] - b["encoded"]).max()) for a, b in zip(outputs, other_outputs, strict=True))
    first, second = outputs[0]["encoded"], outputs[1]["encoded"]
    frames = min(len(first), len(second))
    spread = float(np.abs(first[:frames] - second[:frames]).max())
    print(
        f"{label}, {one_name} vs {other_name}: max |encoder difference| {worst:.3g} (two streams differ by "
        f"{spread:.3g}), transcripts equal {text == other_text}"
    )
    assert spread >= SPREAD_OVER_TOLERANCE * FLOAT32_TOLERANCE, (label, spread)
    assert worst <= FLOAT32_TOLERANCE, (label, one_name, other_name, worst)


@pytest.mark.parametrize("chunk_ms", [320, 80])
def test_graphs_equal_eager(services, chunk_ms):
    record_dir, running = services
    for name in ("graphs", "graphs-fp32"):
        info = stub(running[name]).GetInfo(common_pb2.InfoRequest(), timeout=10)
        assert info.limits["cuda_graphs"] == 1 and info.limits["graph_capture_s"] > 0
        # chunk sizes x (first, steady) x buckets 1, 2, 4, 8, and 80 ms's second step (its history is 1 mel frame)
        assert info.limits["cuda_graphs_captured"] == (5 * 2 + 1) * len(BUCKETS)
        assert info.limits["graph_first_steps"] == 1
    before = metric(running["graphs"], "voiceagent_asr_padded_step_rows_total", chunk_ms=str(chunk_ms))
    results = _run(record_dir, running, chunk_ms, [2.0, 3.1, 2.6, 1.5, 3.1])  # 5 streams: bucket 8
    assert metric(running["graphs"], "voiceagent_asr_padded_step_rows_total", chunk_ms=str(chunk_ms)) > before
    for one, other in SAME_ARITHMETIC:
        _assert_same_arithmetic(f"{chunk_ms} ms", one, results[one], other, results[other])
    for one, other in WITHIN_FLOAT32:
        _assert_within_float32(f"{chunk_ms} ms", one, results[one], other, results[other])


def test_graphs_after_a_long_recognize_still_equal_eager(services):
    """A Recognize longer than --offline-pass-s is stepped in the offline lane (slot max_streams, next to the
    scratch slot of padding rows) between live steps; the clip, and streams stepped on graphs afterwards, still
    give the transcripts and tokens of the same padded steps run eagerly."""
    record_dir, running = services
    audio = clip(6.0, seed=90)
    texts = {}
    for name, service in running.items():
        request = asr_pb2.RecognizeRequest(config=config(320, request_id=f"{name}-long"), audio=audio.tobytes())
        texts[name] = stub(service).Recognize(request, timeout=120).transcript
    for one, other in WITHIN_FLOAT32:
        print(f"long Recognize: {one} equals {other}: {texts[one] == texts[other]}")
    for one, other in SAME_ARITHMETIC:
        assert texts[one] == texts[other], (one, other)
    after = _run(record_dir, running, 320, [1.9, 2.6, 3.1])
    for one, other in SAME_ARITHMETIC:
        _assert_same_arithmetic("after a long Recognize", one, after[one], other, after[other])
