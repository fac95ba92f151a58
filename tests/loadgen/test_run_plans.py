"""What `make run DEVICE=cuda` runs, checked without a GPU: the GPU presets the issue names, sweeps wide enough to
cross each ridge, Locust workers, the services' GPU flags and the GPU memory shared between them; and that the
CPU run is what it was."""

from __future__ import annotations

import os
import subprocess

from loadgen.cli import parser
from loadgen.run_plans import PRESETS, plans, service_args, services_for, workload
from services.asr.config import AsrConfig
from services.tts.config import TtsConfig
from tests.harness import REPO
from voiceagent.serving.config import load_config


def _by_target(device: str, quick: bool = False) -> dict:
    return {plan.target: plan for plan in plans(quick, device)}


def test_cuda_run_uses_the_gpu_presets_and_crosses_each_ridge():
    assert PRESETS["cuda"] == {"asr": "nemotron-0.6b", "llm": "qwen3-8b", "tts": "voxcpm2"}
    sweeps = _by_target("cuda")
    assert sweeps["llm"].concurrency == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]  # the H200's ridge: batch ~190
    assert sweeps["tts"].concurrency == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert max(sweeps["asr"].concurrency) >= 512 and sweeps["asr"].stop_past_realtime  # until streams fall behind
    assert all(plan.workers >= 4 for plan in sweeps.values())  # the generator is never the limit
    assert workload(False, "cuda").chunk_ms == 320  # the chunk the ASR's graphs are captured for


def test_cuda_services_get_their_gpu_flags_and_share_the_memory():
    llm = service_args("cuda", "llm", "qwen3-8b")
    assert llm[:2] == ["--preset", "qwen3-8b"] and "cuda" in llm and "bfloat16" in llm
    assert float(llm[llm.index("--gpu-memory-utilization") + 1]) < 0.5  # room for ASR and TTS on the same GPU
    assert int(llm[llm.index("--max-in-flight") + 1]) >= 512
    asr = service_args("cuda", "asr", "nemotron-0.6b")
    assert "bfloat16" in asr and asr[asr.index("--graph-chunks") + 1] == "320"
    # several gRPC front ends per engine (measured on the H200), valid for the services' own config checks
    assert load_config(AsrConfig, "ASR", asr, {}).frontends == 4 and llm[llm.index("--frontends") + 1] == "4"
    tts = service_args("cuda", "tts", "voxcpm2")
    assert tts[tts.index("--backend") + 1] == "batched" and int(tts[tts.index("--max-batch") + 1]) == 256
    # the step as measured fastest on the H200 (results/h200/README.md §3e), and flags the TTS service accepts
    tts_config = load_config(TtsConfig, "TTS", tts, {})
    assert (tts_config.compile, tts_config.solver_attention, tts_config.vae_dtype) == (True, "flash", "bfloat16")


def test_cpu_run_is_unchanged():
    sweeps = _by_target("cpu")
    levels = {target: plan.concurrency for target, plan in sweeps.items()}
    assert levels == {"asr": [1, 2, 4, 8, 16, 32], "llm": [1, 2, 4, 8, 16, 32, 64], "tts": [1, 2, 4, 8, 16],
                      "voice": [1, 2, 4]}  # fmt: skip
    assert not any(plan.workers or plan.stop_past_realtime for plan in sweeps.values())
    assert service_args("cpu", "llm", "") == [] and service_args("cpu", "asr", "tiny") == ["--preset", "tiny"]
    assert workload(False, "cpu").chunk_ms == 160


def test_stages_start_only_the_services_they_need():
    assert services_for(["llm"]) == ["llm"] and services_for(["peer"]) == ["llm"]
    assert services_for(["asr", "tts"]) == ["asr", "tts"] and services_for(["voice"]) == ["asr", "llm", "tts"]


def test_make_run_device_cuda_is_loadgen_run_device_cuda():
    args = parser().parse_args(["run", "--device", "cuda", "--only", "llm,peer", "--folder", "/tmp/x"])
    assert (args.device, args.only) == ("cuda", ["llm", "peer"])
    assert _make_run_command("DEVICE=cuda").endswith("-m loadgen run --device cuda")
    assert _make_run_command().endswith("-m loadgen run")


def _make_run_command(*variables: str) -> str:
    """The loadgen command `make run` would run (make -n), also when the test itself runs under make."""
    env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = subprocess.run(["make", "-n", "--no-print-directory", "run", *variables], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return next(line for line in made.stdout.splitlines() if "-m loadgen run" in line).strip()
