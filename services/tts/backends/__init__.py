"""Engines behind the TTS backend contract: one module per engine."""
