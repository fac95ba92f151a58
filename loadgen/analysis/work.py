"""The work one engine step must do, from first principles: bytes it must move and FLOPs it must compute.

Every service's step is modelled as linear in the number of streams B sharing it:

    bytes(B) = bytes_fixed + bytes_per_stream·B        flops(B) = flops_fixed + flops_per_stream·B

- LLM decode: every weight is read once per step whatever the batch (bytes_fixed = weight bytes); each sequence
  adds its KV-cache reads (2·layers·kv_heads·head_dim·dtype bytes per context token) and 2·params FLOPs per
  token plus attention (4·layers·heads·head_dim per context token).
- ASR cache-aware: one step encodes (right context + 1) new 80 ms frames per stream, batched: weights read once,
  2·params FLOPs per frame per stream, plus the per-stream attention/convolution caches.
- TTS: requests are not batched (one per worker), so each stream's 160 ms patch re-reads the LM once and the
  diffusion transformer once per diffusion step: everything is per stream, nothing is shared.

Shape keys come from the service's GetInfo (names vary between services, so several spellings are accepted,
and the services' own per-step terms are used where published); when they are missing the per-step work falls
back to what the service's own counters say one step did, and failing that to a weights-only floor. TTS
publishes no per-patch bytes, so its counters come first there. `source` says which was used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from loadgen.results import LevelResult, ServiceFacts

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "fp8": 1, "int8": 1}
ENCODER_FRAME_MS = 80.0  # FastConformer with 8× subsampling of 10 ms mel frames
TTS_PATCH_MS = 160.0  # VoxCPM2: 4 latent frames at 25 Hz per LM step


@dataclasses.dataclass(frozen=True)
class StepWork:
    """Per-step work, linear in the streams B sharing a step, and what one stream gets from a step."""

    bytes_fixed: float
    bytes_per_stream: float
    flops_fixed: float
    flops_per_stream: float
    units_per_stream_step: float  # tokens (LLM) or audio seconds (ASR chunk, TTS patch) per stream per step
    unit: str  # "tokens" | "audio s"
    max_batch: int | None  # streams one step can serve (admission limit, workers); None = unlimited
    paced: bool  # streams arrive in real time (ASR): offered load caps throughput at concurrency × 1
    batched: bool  # streams share one step (weights read once); False = one request per worker
    source: str  # "shape", "service's counters" or "weights-only floor"
    what: str  # in words: what determines the step's time
    notes: tuple[str, ...] = ()
    prefill_flops_per_token: float = 0.0  # LLM: FLOPs per prompt token of the prefill pass

    def read_bytes(self, batch: float) -> float:
        return self.bytes_fixed + self.bytes_per_stream * batch

    def flops(self, batch: float) -> float:
        return self.flops_fixed + self.flops_per_stream * batch


def shape_value(shape: Mapping[str, float], *names: str, default: float | None = None) -> float | None:
    """The first of `names` present (and positive) in the shape facts."""
    for name in names:
        value = shape.get(name)
        if value is not None and value > 0:
            return float(value)
    return default


def dtype_bytes(facts: ServiceFacts) -> float:
    if facts.parameter_count and facts.weight_bytes:
        return facts.weight_bytes / facts.parameter_count
    return DTYPE_BYTES.get(facts.dtype.lower().removeprefix("torch."), 2)


def max_batch(facts: ServiceFacts) -> int | None:
    limit = shape_value(
        facts.limits, "max_batch_streams", "max_batch", "max_num_seqs", "max_batch_size", "workers", "max_streams"
    )
    return int(limit) if limit else None


def counters_per_step(levels: Sequence[LevelResult]) -> tuple[float, float, float] | None:
    """(bytes, FLOPs, units of work) per step at the lowest level whose service counted steps, or None."""
    for level in sorted(levels, key=lambda lv: lv.concurrency):
        steps = level.server.steps_per_s
        if steps > 0 and level.server.read_bytes_per_s > 0:
            server = level.server
            return server.read_bytes_per_s / steps, server.flops_per_s / steps, level.throughput / steps
    return None


def _explicit_step(facts: ServiceFacts) -> tuple[float, float] | None:
    """Per-stream step work published directly by the service (bytes, FLOPs at one stream), if it does."""
    step_bytes = shape_value(facts.shape, "step_read_bytes", "read_bytes_per_step")
    step_flops = shape_value(facts.shape, "step_flops", "flops_per_step")
    return (step_bytes, step_flops) if step_bytes and step_flops else None


def llm_step_work(
    facts: ServiceFacts, levels: Sequence[LevelResult], workload: Mapping[str, float] | None = None
) -> StepWork:
    """Decode step. Uses the service's own per-step terms where it publishes them (step_weight_bytes: the matmul
    weights, LM head included, embedding gathered not read; flops_per_token; kv_bytes_per_token;
    attention_flops_per_pair; logits_flops_per_row), else 2·params and the shape's layers/heads/head_dim."""
    shape, workload = facts.shape, workload or {}
    params, weights = float(facts.parameter_count), float(facts.weight_bytes)
    prompt = workload.get("prompt_tokens", 0.0)
    context = workload.get("context_tokens") or (prompt + workload.get("output_tokens", 0.0) / 2)
    notes: list[str] = []
    source = "shape"
    if not weights or not params:
        measured = counters_per_step(levels)
        if measured is None:
            raise ValueError("LLM facts carry no weight_bytes/parameter_count and no level reported work counters")
        step_bytes, step_flops, tokens = measured
        weights, params, source = step_bytes, step_flops / (2 * max(tokens, 1.0)), "service's counters"
    layers = shape_value(shape, "layers", "num_layers", "num_hidden_layers")
    heads = shape_value(shape, "heads", "num_heads", "num_attention_heads")
    kv_heads = shape_value(shape, "kv_heads", "num_kv_heads", "num_key_value_heads", default=heads)
    hidden = shape_value(shape, "hidden_size", "d_model")
    head_dim = shape_value(shape, "head_dim", default=hidden / heads if hidden and heads else None)
    kv_element = shape_value(shape, "kv_bytes_per_element", "kv_dtype_bytes", default=dtype_bytes(facts))
    derivable = layers and kv_heads and head_dim and heads
    kv_per_token = shape_value(
        shape, "kv_bytes_per_token", default=2 * layers * kv_heads * head_dim * kv_element if derivable else None
    )
    per_pair = shape_value(
        shape, "attention_flops_per_pair", default=4 * layers * heads * head_dim if derivable else None
    )
    if not context:
        notes.append("KV-cache reads and attention left out (context length unknown): a weights-only bound")
    elif not (kv_per_token and per_pair):
        notes.append("KV-cache reads and attention left out (layers/heads/head_dim missing from the shape)")
    context = context if kv_per_token and per_pair else 0.0
    token_flops = shape_value(shape, "flops_per_token")
    # Per generated token: projections and MLP, one row of logits, attention over the context.
    flops_per_token = (
        (token_flops + shape_value(shape, "logits_flops_per_row", default=0.0)) if token_flops else 2 * params
    )
    return StepWork(
        bytes_fixed=shape_value(shape, "step_weight_bytes", default=weights),
        bytes_per_stream=shape_value(shape, "embedding_bytes_per_token", default=0.0) + (kv_per_token or 0) * context,
        flops_fixed=0.0,
        flops_per_stream=flops_per_token + (per_pair or 0) * context,
        units_per_stream_step=1.0,
        unit="tokens",
        max_batch=max_batch(facts),
        paced=False,
        batched=True,
        source=source,
        what="decode step: all weights + each sequence's KV cache read once; 2·params FLOPs per token",
        notes=tuple(notes),
        # A prompt token attends on average to half the prompt.
        prefill_flops_per_token=(token_flops or 2 * params) + (per_pair or 0) * prompt / 2,
    )


DEFAULT_CHUNK_MS = 160.0  # the load generator's default ASR chunk, assumed when nothing says otherwise


def asr_chunk_frames(facts: ServiceFacts, workload: Mapping[str, float] | None = None) -> tuple[float, float, bool]:
    """(encoder frames per chunk, frame seconds, known): chunk = (right context + 1) × 80 ms.

    The chunk is a per-stream setting of the ASR service, so it comes from the sweep's workload (`chunk_ms`),
    else from the shape; `known` is False when it had to be assumed.
    """
    frame_ms = shape_value(facts.shape, "encoder_frame_ms", "frame_ms", default=ENCODER_FRAME_MS)
    right = next((facts.shape[k] for k in ("right_context_frames", "att_context_right") if k in facts.shape), None)
    chunk_ms = (workload or {}).get("chunk_ms") or shape_value(facts.shape, "chunk_ms")
    if chunk_ms:
        return chunk_ms / frame_ms, frame_ms / 1000, True
    if right is not None:
        return right + 1, frame_ms / 1000, True
    return DEFAULT_CHUNK_MS / frame_ms, frame_ms / 1000, False


def asr_step_work(
    facts: ServiceFacts, levels: Sequence[LevelResult], workload: Mapping[str, float] | None = None
) -> StepWork:
    shape, limits = facts.shape, facts.limits
    frames, frame_s, chunk_known = asr_chunk_frames(facts, workload)
    chunk_s = frames * frame_s
    buffered = "buffer" in facts.backend.lower()
    window = shape_value(shape, "buffer_window_frames", "window_frames")
    window_ms = shape_value({**limits, **shape}, "buffered_window_ms", "buffer_window_ms")
    if window is None and window_ms:
        window = window_ms / 1000 / frame_s
    encoded = window if buffered and window else frames  # buffered re-encodes its whole window every chunk
    layers = shape_value(shape, "layers", "num_layers", "encoder_layers")
    d_model = shape_value(shape, "d_model", "hidden_size")
    left = shape_value(shape, "left_context_frames", "att_context_left", "left_context", default=0.0)
    kernel = shape_value(shape, "conv_kernel_size", "conv_kernel", default=9.0)
    notes: list[str] = []
    if not chunk_known:
        notes.append(f"chunk size not given (workload chunk_ms): assumed {DEFAULT_CHUNK_MS:.0f} ms")
    cache_read = attention_flops = 0.0
    if layers and d_model:
        context = encoded if buffered else left + frames
        attention_flops = 4 * layers * d_model * context * encoded
        if not buffered:  # cache-aware keeps the left attention context and the conv tail per stream
            published = shape_value(shape, "cache_bytes_per_stream")
            cache_read = published or layers * d_model * (left + kernel - 1) * dtype_bytes(facts)
    else:
        notes.append("attention and cache reads left out (layers/d_model missing from the shape)")
    if buffered and not window:
        notes.append("buffered backend without a window size: modelled as encoding the chunk only")
    weights, params = float(facts.weight_bytes), float(facts.parameter_count)
    per_frame = shape_value(shape, "encoder_flops_per_frame")
    if per_frame:  # the service's own per-frame encoder count, plus 2·params for the RNN-T decoder and joint
        flops_per_stream = (per_frame + 2 * shape_value(shape, "decoder_params", default=0.0)) * encoded
    else:
        flops_per_stream = 2 * params * encoded + attention_flops
    source = "shape"
    explicit = _explicit_step(facts)
    if explicit:
        cache_read, flops_per_stream = explicit[0] - weights, explicit[1]
    elif not weights or not params:
        measured = counters_per_step(levels)
        if measured is None:
            raise ValueError("ASR facts carry no weight_bytes/parameter_count and no level reported work counters")
        streams = max(1.0, measured[2] / chunk_s)  # audio seconds per step ÷ chunk = streams per step
        weights, flops_per_stream, source = measured[0], measured[1] / streams, "service's counters"
    kind = f"buffered: re-encodes a {encoded * frame_s:.2f} s window" if buffered else "cache-aware"
    return StepWork(
        bytes_fixed=weights,
        bytes_per_stream=max(0.0, cache_read),
        flops_fixed=0.0,
        flops_per_stream=flops_per_stream,
        units_per_stream_step=chunk_s,
        unit="audio s",
        max_batch=max_batch(facts),
        paced=True,
        batched=True,
        source=source,
        what=f"{kind} step over {frames:g} new 80 ms frames per stream (chunk {chunk_s * 1000:.0f} ms); "
        "weights read once per step",
        notes=tuple(notes),
    )


def dit_calls(timesteps: float) -> float:
    """Diffusion-transformer calls per patch: VoxCPM2's Euler solver skips the first max(1, 4%) of the steps."""
    return timesteps - max(1, int((timesteps + 1) * 0.04))


def tts_step_work(
    facts: ServiceFacts, levels: Sequence[LevelResult], workload: Mapping[str, float] | None = None
) -> StepWork:
    """One stream's patch. Per-patch work, most exact first: the service's own counters over the levels (what
    its model says each patch did, audio VAE and context attention included), the per-patch FLOPs it publishes
    (`flops_per_patch_at_context_0`, at its default steps), then the shape formula (DiT size from
    dit_layers/dit_hidden_size/dit_intermediate_size). Other diffusion steps than those add or remove DiT calls."""
    shape, workload = facts.shape, workload or {}
    patch_s = shape_value(shape, "patch_ms", default=TTS_PATCH_MS) / 1000
    default_steps = shape_value(shape, "inference_timesteps", "diffusion_steps", default=10.0)
    default_calls = shape_value(shape, "dit_calls_per_patch", default=dit_calls(default_steps))
    timesteps = workload.get("inference_timesteps") or default_steps
    calls = dit_calls(timesteps) if workload.get("inference_timesteps") else default_calls
    dit_params = shape_value(shape, "dit_parameter_count", "dit_params", "dit_parameters")
    dit_layers, dit_hidden = shape_value(shape, "dit_layers"), shape_value(shape, "dit_hidden_size")
    if dit_params is None and dit_layers and dit_hidden:  # attention 4·h² + gated feed-forward 3·h·ffn per layer
        dit_ffn = shape_value(shape, "dit_intermediate_size", default=4 * dit_hidden)
        dit_params = dit_layers * (4 * dit_hidden**2 + 3 * dit_hidden * dit_ffn)
    cfg_batch = shape_value(shape, "dit_batch", "cfg_batch", default=2.0)  # guidance: conditional + unconditional
    patch_frames = shape_value(shape, "patch_size", "patch_frames", default=4.0)
    # The DiT runs over the previous patch (prefix), the noisy patch and a few conditioning tokens (VoxCPM2).
    dit_tokens = shape_value(shape, "dit_tokens", default=2 * patch_frames + 3)
    call_bytes = dit_params * dtype_bytes(facts) if dit_params else 0.0
    call_flops = 2 * dit_params * dit_tokens * cfg_batch if dit_params else 0.0
    params, weights = float(facts.parameter_count), float(facts.weight_bytes)
    notes: list[str] = []
    measured = counters_per_step(levels)  # one step = one stream's patch
    published_flops = shape_value(shape, "step_flops", "flops_per_patch", "flops_per_patch_at_context_0")
    published_bytes = shape_value(shape, "step_read_bytes", "read_bytes_per_patch")
    # The LM and encoders take one position per patch; the DiT is re-read and re-run at every call.
    formula = (weights + (calls - 1) * call_bytes, 2 * (params - (dit_params or 0)) + calls * call_flops)
    if measured is not None:
        step_bytes, step_flops, source = measured[0], measured[1], "service's counters"
    elif published_flops:
        step_flops = published_flops + (calls - default_calls) * call_flops
        step_bytes = (published_bytes + (calls - default_calls) * call_bytes) if published_bytes else formula[0]
        source = "shape"
    elif dit_params and params:
        (step_bytes, step_flops), source = formula, "shape"
        notes.append("audio-VAE decoding and attention left out of the FLOPs: the bound stays a bound")
    elif params:
        step_bytes, step_flops, source = weights, 2 * params, "weights-only floor"
        notes.append("no DiT size in the shape and no counters: one read of the weights per patch (a floor)")
    else:
        raise ValueError("TTS facts carry no weight_bytes/parameter_count and no level reported work counters")
    # The batched backend (limits carry max_batch, not workers) steps every request in one pass: the weights
    # are read once per step, each request adds its patch's FLOPs. Its counters at C=1 are one row's step.
    batched = bool(facts.limits.get("max_batch")) and not facts.limits.get("workers")
    if batched:
        return StepWork(
            bytes_fixed=step_bytes,
            bytes_per_stream=0.0,  # a request's K/V cache is small next to the weights at these contexts
            flops_fixed=0.0,
            flops_per_stream=step_flops,
            units_per_stream_step=patch_s,
            unit="audio s",
            max_batch=max_batch(facts),
            paced=False,
            batched=True,
            source=source,
            what=(
                f"one {patch_s * 1000:.0f} ms patch per request per step: an LM step + {calls:g} "
                f"diffusion-transformer calls ({timesteps:g} steps) for every request at once, weights read once"
            ),
            notes=tuple(notes),
        )
    return StepWork(
        bytes_fixed=0.0,
        bytes_per_stream=step_bytes,
        flops_fixed=0.0,
        flops_per_stream=step_flops,
        units_per_stream_step=patch_s,
        unit="audio s",
        max_batch=max_batch(facts),
        paced=False,
        batched=False,
        source=source,
        what=(
            f"one {patch_s * 1000:.0f} ms patch per step: an LM step + {calls:g} diffusion-transformer calls "
            f"({timesteps:g} steps), patches one after another, weights re-read per request (no batching)"
        ),
        notes=tuple(notes),
    )


STEP_MODELS = ("llm", "openai", "asr", "tts")


def step_work(
    target: str, facts: ServiceFacts, levels: Sequence[LevelResult], workload: Mapping[str, float] | None = None
) -> StepWork:
    if target in ("llm", "openai"):
        return llm_step_work(facts, levels, workload)
    if target == "asr":
        return asr_step_work(facts, levels, workload)
    if target == "tts":
        return tts_step_work(facts, levels, workload)
    raise ValueError(f"no step model for target {target!r} (expected llm, openai, asr or tts)")
