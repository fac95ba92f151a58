"""The ASR service: streaming speech recognition on NeMo cache-aware FastConformer RNN-T.

Streams with the same chunk size are stepped through the encoder together, one batched cache-aware step
with per-stream cache slots; a buffered baseline that re-encodes a sliding window is the other backend.
"""
