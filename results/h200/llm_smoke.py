"""Smoke check before the LLM benchmark on the lent H200: our VllmGenerator (vLLM's AsyncLLM) on a preset, on
CUDA, bf16, synthetic weights; a text prompt and a chat prompt, a few greedy tokens each, then the facts and
limits the service reports. Same engine settings as the benchmark's engines, so its torch.compile cache is theirs.

    python results/h200/llm_smoke.py [PRESET] [MAX_IN_FLIGHT]
"""

import asyncio
import json
import sys
import time

from services.llm.backend import ChatTurn, GenerationRequest, Sampling
from services.llm.backends.vllm import VllmGenerator
from services.llm.config import LlmConfig


async def main(preset: str, max_in_flight: int) -> None:
    config = LlmConfig(
        preset=preset, device="cuda", dtype="bfloat16", gpu_memory_utilization=0.4, max_in_flight=max_in_flight
    )
    config.validate()
    generator = VllmGenerator(config)
    started = time.perf_counter()
    await generator.start()
    print(f"engine started and warmed up in {time.perf_counter() - started:.1f} s", flush=True)
    try:
        prompts = ["The capital of France is", (ChatTurn("user", "Say hello."),)]
        for index, prompt in enumerate(prompts):
            request = GenerationRequest(
                f"smoke-{index}", prompt, Sampling(max_tokens=8, temperature=0, ignore_eos=True)
            )
            deltas = [delta async for delta in generator.generate(request)]
            done = deltas[-1].completion
            tokens = [t for delta in deltas for t in delta.token_ids]
            print(
                f"prompt {index}: {len(tokens)} tokens {tokens} finish={done.finish_reason} "
                f"ttft={1000 * done.timings.time_to_first_token_s:.1f} ms decode={1000 * done.timings.decode_s:.1f} ms"
            )
            assert len(tokens) == 8 and done.finish_reason == "length", "expected 8 tokens, finish_reason length"
        facts = generator.facts()
        print(
            json.dumps(
                {
                    "engine_version": facts.engine_version,
                    "dtype": facts.dtype,
                    "parameter_count": facts.parameter_count,
                    "limits": dict(generator.limits()),
                }
            )
        )
        print("SMOKE OK", flush=True)
    finally:
        await generator.stop()


if __name__ == "__main__":  # vLLM spawns its engine core: the guard is required
    asyncio.run(
        main(sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b", int(sys.argv[2]) if len(sys.argv) > 2 else 256)
    )
