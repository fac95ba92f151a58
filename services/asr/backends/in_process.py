"""The in-process recognizer: the model built on the serving device and wrapped in the configured backend.

The engine process runs this in its child; with `--engine-process false` the gRPC process runs it itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from services.asr.engine import fastconformer, fused_encoder

if TYPE_CHECKING:
    from services.asr.backend import RecognizerBackend
    from services.asr.config import AsrConfig


def load_in_process(config: AsrConfig) -> RecognizerBackend:
    """Build the model (blocking) and wrap it in the configured in-process backend: cache-aware or buffered."""
    if config.threads:
        torch.set_num_threads(config.threads)
    model, source = fastconformer.build_model(
        None if config.model_path else config.preset_file, config.model_path, config.seed
    )
    # Everything runs on the serving device: the mel front end too, batched over the streams of a step.
    # The encoder, decoder and joint compute in the configured dtype (their weights and the streaming
    # caches are cast); the preprocessor stays float32, as NeMo requires, and its output is cast.
    if config.fused_encoder:
        fused_encoder.install(model.encoder)
    model = model.to(config.device)
    dtype = getattr(torch, config.dtype)
    for module in (model.encoder, model.decoder, model.joint):
        module.to(dtype)
    common = dict(
        source=source,
        preset="" if config.model_path else config.preset,
        max_streams=config.max_streams,
        max_batch_streams=config.max_batch_streams,
        record_dir=config.record_encoder_dir,
        batch_wait_fraction=config.batch_wait_fraction,
        join_window_ms=config.join_window_ms,
        offline_pass_s=config.offline_pass_s,
        offline_slice_ms=config.offline_slice_ms,
        step_policy=config.step_policy,
        overlap_steps=config.overlapped,
        fused_encoder=config.fused_encoder,
    )
    if config.backend == "buffered":
        from services.asr.backends.nemo_buffered import BufferedBackend

        return BufferedBackend(model, window_ms=config.buffered_window_ms, **common)
    from services.asr.backends.nemo_cache_aware import CacheAwareBackend

    cuda_graphs = config.cuda_graphs and str(config.device).startswith("cuda")
    return CacheAwareBackend(
        model,
        padded_steps=config.padded_steps,
        cuda_graphs=cuda_graphs,
        graph_chunks=config.graph_chunk_ms,
        graph_first_steps=config.graph_first_steps,
        features_in_step=config.features_in_step,
        **common,
    )
