"""The ASR engine both NeMo backends drive: the model and its work formulas (fastconformer.py), streamed mel
features (features.py), a stream's state (stream.py), the batching loop that steps streams together
(batching.py), cache slots (slots.py), batched greedy RNN-T decoding (greedy.py) and padded steps captured as
CUDA graphs per batch-size bucket (step_graphs.py). The backends (services/asr/backends/) say how a group of
streams is encoded and how the engine is hosted (in this process or an engine process).
"""
