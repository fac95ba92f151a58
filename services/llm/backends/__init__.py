"""LLM engine backends, one module per engine (vllm.py: vLLM, on CPU and GPU alike)."""
