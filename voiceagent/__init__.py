"""voiceagent: streaming ASR, LLM and TTS served as gRPC microservices, and a load generator that explains them."""

__version__ = "0.1.0"
