"""`python -m services.llm.serve_args`: the `vllm serve` flags that rebuild our engine for the side by side. On a
GPU the peer gets the same share of the device's memory as our service (two engines share one GPU); on the CPU
the same explicit KV cache. Checked without a GPU: the flags only, no engine is started."""

from __future__ import annotations

import json
import subprocess

from tests.harness import REPO, venv_python


def _serve_args(*args: str) -> dict:
    found = subprocess.run([venv_python("llm"), "-m", "services.llm.serve_args", *args], cwd=REPO,
                           capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(found.stdout.strip().splitlines()[-1])


def test_gpu_peer_gets_the_services_memory_share_and_dtype():
    found = _serve_args("qwen3-8b", "--device", "cuda", "--dtype", "bfloat16", "--max-in-flight", "512",
                        "--gpu-memory-utilization", "0.45")  # fmt: skip
    flags = found["flags"]
    assert flags[flags.index("--gpu-memory-utilization") + 1] == "0.45"
    assert flags[flags.index("--dtype") + 1] == "bfloat16" and flags[flags.index("--max-num-seqs") + 1] == "512"
    assert "--kv-cache-memory-bytes" not in flags  # on a GPU vLLM sizes the cache from its memory share
    assert "--max-num-batched-tokens" not in flags  # not set: the peer takes vLLM's API-server default, as we do
    assert found["server"].startswith("vllm.entrypoints.")


def test_cpu_peer_gets_the_explicit_kv_cache():
    flags = _serve_args("tiny")["flags"]
    assert "--kv-cache-memory-bytes" in flags and "--gpu-memory-utilization" not in flags


def test_peer_gets_the_services_step_budget():
    flags = _serve_args("tiny", "--max-num-batched-tokens", "1024")["flags"]
    assert flags[flags.index("--max-num-batched-tokens") + 1] == "1024"
