"""LLM engine backends, one module per engine; `load_backend` builds the configured one.

vllm.py: vLLM's async engine in this service, on CPU and GPU alike. openai_compatible.py: another server
that speaks the OpenAI API (vLLM, SGLang, TGI, a NIM, llama.cpp's server), streamed over HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.llm.backend import TextGenerator
    from services.llm.config import LlmConfig


def load_backend(config: LlmConfig) -> TextGenerator:
    """The configured backend, not started yet (`start` loads the engine or reaches the upstream)."""
    if config.backend == "openai":
        from services.llm.backends.openai_compatible import OpenAICompatibleGenerator

        return OpenAICompatibleGenerator(config)
    from services.llm.backends.vllm import VllmGenerator  # heavy: imports vLLM and torch

    return VllmGenerator(config)
