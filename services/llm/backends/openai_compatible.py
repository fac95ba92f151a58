"""The OpenAI-compatible backend: generation streamed from another server's `/v1/completions` or
`/v1/chat/completions` (vLLM, SGLang, TGI, a NIM, llama.cpp's server), over one pooled async HTTP client (httpx).

Text and token-id prompts go to /v1/completions, chat turns to /v1/chat/completions, always with
`stream: true`; each server-sent event with new text or token ids becomes one TokenDelta as it arrives, and a
last delta carries the usage the upstream reports. Closing the stream (the gRPC call cancelled, the client gone)
closes the HTTP response and its connection, which is how an OpenAI-compatible server learns to abort.

Upstream failures end the call with a gRPC status (`status_for`, `transport_failure`): connection refused or
reset, TLS refused, 5xx -> UNAVAILABLE; 429 -> RESOURCE_EXHAUSTED; other 4xx -> INVALID_ARGUMENT with the
upstream's message; 401/403 -> UNAVAILABLE saying that the service's own key was refused (`http_failure`); no
connection within the connect timeout -> UNAVAILABLE; no bytes within the read timeout (first token included)
-> DEADLINE_EXCEEDED.

Why 401/403 are UNAVAILABLE, not UNAUTHENTICATED / PERMISSION_DENIED: those two tell a caller that *its*
credentials are missing or lack a permission, and a client acts on them by refreshing its own token or giving
up. Here the caller's request was fine; the key this service sends upstream (upstream_api_key_file/_env) was
refused: a deployment fault that the caller cannot fix, which another replica (with a good key) or a retry after
the key is fixed can serve. INTERNAL would hide that; UNAVAILABLE with the reason is retryable and says so.

What the upstream runs on is not known here: GetInfo carries the upstream's URL and model, and no weight
bytes, model shape or device ceilings, so the load generator does not classify a remote engine's regime.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import httpx

from services.llm import metrics
from services.llm.backend import (
    FINISH_REASONS,
    ChatTurn,
    Completion,
    EngineFailure,
    GenerationRequest,
    Timings,
    TokenDelta,
)
from services.llm.config import LlmConfig
from voiceagent.serving.config import require
from voiceagent.serving.info import ModelFacts

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

UNKNOWN_VOCAB = 1 << 32  # token ids are uint32 on the wire; the upstream checks them against its own vocabulary
ERROR_TEXT_CHARS = 500  # of an error body that is not OpenAI-style JSON


def status_for(http_status: int) -> str:
    """The gRPC status an upstream HTTP error status ends the call with."""
    if http_status == 429:
        return "RESOURCE_EXHAUSTED"  # the upstream sheds load, as our own admission limit does
    if http_status in (401, 403):
        return "UNAVAILABLE"  # the service's own credentials were refused: a deployment fault, not the caller's
    if http_status == 408:
        return "DEADLINE_EXCEEDED"
    if http_status >= 500:
        return "UNAVAILABLE"
    return "INVALID_ARGUMENT"  # the upstream refused the request itself; its message says why


def http_failure(http_status: int, where: str, message: str) -> EngineFailure:
    """An upstream HTTP error as the call's failure; 401/403 say whose credentials were refused."""
    text = f"upstream {where}: HTTP {http_status}: {message}"
    if http_status in (401, 403):
        text += (
            "; the upstream refused this service's own API key (upstream_api_key_file / upstream_api_key_env),"
            " not the caller's credentials: a deployment fault, retry on another replica or once it is fixed"
        )
    return EngineFailure(status_for(http_status), text)


def error_message(body: bytes) -> str:
    """The upstream's own words from an error body: OpenAI's {"error": {"message": ...}}, or the text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:ERROR_TEXT_CHARS] or "(empty body)"
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        for key in ("message", "detail"):
            if error.get(key):
                return str(error[key])
    if isinstance(error, str) and error:
        return error
    return text[:ERROR_TEXT_CHARS]


def transport_failure(error: httpx.TransportError, config: LlmConfig) -> EngineFailure:
    """The gRPC status of an HTTP transport failure (no status line, or a stream broken off)."""
    where = config.upstream_url
    if isinstance(error, httpx.ConnectTimeout | httpx.PoolTimeout):
        return EngineFailure(
            "UNAVAILABLE", f"upstream {where}: no connection within {config.upstream_connect_timeout_s:g} s"
        )
    if isinstance(error, httpx.TimeoutException):  # read or write: connected, but the upstream went silent
        return EngineFailure(
            "DEADLINE_EXCEEDED", f"upstream {where}: nothing received for {config.upstream_read_timeout_s:g} s"
        )
    return EngineFailure("UNAVAILABLE", f"upstream {where}: {type(error).__name__}: {error}")


def api_key(config: LlmConfig) -> str:
    """The upstream's API key: the key file's content, else the named environment variable ('' = none)."""
    if config.upstream_api_key_file:
        return Path(config.upstream_api_key_file).read_text(encoding="utf-8").strip()
    return os.environ.get(config.upstream_api_key_env, "").strip()


def tls_context(config: LlmConfig) -> ssl.SSLContext:
    """Verification of an https upstream: against the CA file alone when one is set, else the system's CAs."""
    return ssl.create_default_context(cafile=config.upstream_ca_file or None)


async def server_sent_events(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON payload of each `data:` line of an event stream, until `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments (": ping"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise EngineFailure("UNAVAILABLE", f"the upstream sent an event that is not JSON: {data[:200]!r}") from None
        if isinstance(event, dict):
            yield event


def request_body(model: str, request: GenerationRequest, token_ids: bool) -> tuple[str, dict]:
    """The endpoint (relative to the base URL) and JSON body of a streamed generation request."""
    sampling = request.sampling
    body: dict = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    # Not in OpenAI's API (vLLM and SGLang have both): sent only when asked for.
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if token_ids:
        body["return_token_ids"] = True
    prompt = request.prompt
    if isinstance(prompt, str):
        return "completions", {**body, "prompt": prompt}
    if prompt and isinstance(prompt[0], ChatTurn):
        messages = [{"role": turn.role, "content": turn.content} for turn in prompt]
        return "chat/completions", {**body, "messages": messages}
    return "completions", {**body, "prompt": list(prompt)}


class OpenAICompatibleGenerator:
    """A TextGenerator on another server's OpenAI-compatible streaming API."""

    def __init__(self, config: LlmConfig):
        self.config = config
        self.base_url = config.upstream_url.rstrip("/")
        self.model = config.upstream_model
        self.vocab_size = UNKNOWN_VOCAB
        self.max_model_len = 0  # unknown unless the upstream's model list says (vLLM's does)
        self.connections = config.upstream_max_connections or config.max_in_flight
        self.client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        config = self.config
        # Checked here, not with the other settings: a deployment mounts these files only where the service runs.
        for name in ("upstream_api_key_file", "upstream_ca_file"):
            path = getattr(config, name)
            # Not is_file(): compose mounts /dev/null, a device, as the secret when there is no key.
            require(not path or (Path(path).exists() and not Path(path).is_dir()), name, f"no such file: {path!r}")
        key = api_key(config)
        self.client = httpx.AsyncClient(
            base_url=self.base_url + "/",
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx.Timeout(
                connect=config.upstream_connect_timeout_s,
                read=config.upstream_read_timeout_s,
                write=config.upstream_read_timeout_s,
                pool=config.upstream_connect_timeout_s,
            ),
            limits=httpx.Limits(max_connections=self.connections, max_keepalive_connections=self.connections),
            verify=tls_context(config),
        )
        try:
            await self._discover()
        except EngineFailure as error:
            # Served anyway: the upstream may come up later; until then each request gets the failure's status.
            log.warning("upstream not ready (%s): requests fail until it answers", error)

    async def _discover(self) -> None:
        """The model to ask for (the first listed unless configured) and its max length, from GET /models."""
        try:
            response = await self.client.get("models")
        except httpx.TransportError as error:
            raise transport_failure(error, self.config) from None
        if response.status_code >= 400:
            raise http_failure(response.status_code, f"{self.base_url}/models", error_message(response.content))
        try:
            cards = response.json().get("data") or []
        except (ValueError, AttributeError):  # not JSON, or not an object
            raise EngineFailure("UNAVAILABLE", f"upstream {self.base_url}/models: not an OpenAI model list") from None
        listed = {card.get("id"): card for card in cards if isinstance(card, dict)}
        if not self.model:
            if not listed:
                raise EngineFailure("UNAVAILABLE", f"upstream {self.base_url} lists no models")
            self.model = next(iter(listed))
        elif self.model not in listed:
            log.warning("upstream %s does not list model %r (it lists %s)", self.base_url, self.model, list(listed))
        self.max_model_len = int(listed.get(self.model, {}).get("max_model_len") or 0)
        log.info("upstream %s: model %r, max_model_len %s", self.base_url, self.model, self.max_model_len or "unknown")

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None

    def facts(self) -> ModelFacts:
        """What is known of a remote engine: where it is and which model. Its weights, shape, dtype and
        device are not (zero or empty), so nothing downstream predicts or classifies its steps."""
        return ModelFacts(
            backend="openai",
            engine_version="",
            preset=self.model,
            source=self.base_url,
            synthetic_weights=False,
            parameter_count=0,
            weight_bytes=0,
            dtype="",
            device="remote",
            shape={"max_model_len": self.max_model_len} if self.max_model_len else {},
        )

    def limits(self) -> Mapping[str, float]:
        known = {"upstream_max_connections": self.connections}
        return {**known, "max_model_len": self.max_model_len} if self.max_model_len else known

    async def prepare(self, request: GenerationRequest) -> GenerationRequest:
        """Nothing to check here: the upstream tokenises and refuses (its 400s become INVALID_ARGUMENT)."""
        return request

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        received = time.perf_counter()
        if not self.model:
            await self._discover()  # the upstream was down at start-up
        path, body = request_body(self.model, request, self.config.upstream_token_ids)
        stream = RequestStream(received)
        try:
            # Leaving this block for any reason (the consumer closing us included) closes the response and, as it
            # was not read to the end, its connection: the upstream sees the client go and aborts the request.
            async with self.client.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    message = error_message(await response.aread())
                    raise http_failure(response.status_code, f"{self.base_url}/{path}", message)
                async with contextlib.aclosing(server_sent_events(response)) as events:
                    async for event in events:
                        delta = stream.read(event, self.base_url)
                        if delta is not None:
                            yield delta
        except httpx.TransportError as error:
            raise transport_failure(error, self.config) from None
        yield TokenDelta("", (), stream.completion(self.base_url))


class RequestStream:
    """One request's stream of events: its deltas, then its completion, with the service's latency metrics."""

    def __init__(self, received: float):
        self.received = received
        self.first_at = self.last_at = 0.0
        self.tokens = 0  # generated tokens seen, counted by their ids (or one per event where none come)
        self.finish_reason = self.stop = ""
        self.usage: dict = {}

    def read(self, event: dict, upstream: str) -> TokenDelta | None:
        """The delta in one event (None if it carries no text or ids: a role header, usage, a keep-alive)."""
        if "error" in event:  # an error after the stream started (vLLM sends these mid-stream)
            error = event["error"] if isinstance(event["error"], dict) else {"message": event["error"]}
            code = error.get("code")
            status = status_for(code) if isinstance(code, int) else "UNAVAILABLE"
            raise EngineFailure(status, f"upstream {upstream}: {error.get('message') or error}")
        self.usage = event.get("usage") or self.usage
        choices = event.get("choices") or ()
        if not choices:
            return None
        choice = choices[0]  # one completion per request (n = 1)
        text = choice["text"] if "text" in choice else (choice.get("delta") or {}).get("content")
        text = text or ""
        ids = tuple(choice.get("token_ids") or ())
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if isinstance(choice.get("stop_reason"), str):
            self.stop = choice["stop_reason"]
        if not (text or ids):
            return None
        now = time.perf_counter()
        count = len(ids) or 1
        if not self.tokens:
            self.first_at = now
            metrics.time_to_first_token.observe(now - self.received)
        else:
            gap = (now - self.last_at) / count
            for _ in range(count):
                metrics.inter_token_latency.observe(gap)
        self.tokens += count
        self.last_at = now
        return TokenDelta(text, ids)

    def completion(self, upstream: str) -> Completion:
        if not self.finish_reason:
            raise EngineFailure("UNAVAILABLE", f"upstream {upstream}: the stream ended without a finish reason")
        now = time.perf_counter()
        # Reasons outside ours (tool_calls, content_filter, ...) ended the text as a stop does.
        reason = self.finish_reason if self.finish_reason in FINISH_REASONS else "stop"
        usage = self.usage
        generated = int(usage.get("completion_tokens") or self.tokens)
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        metrics.prompt_tokens.inc(prompt_tokens)
        metrics.generated_tokens.inc(generated)
        metrics.cached_prompt_tokens.inc(cached)
        metrics.e2e_latency.labels(reason).observe(now - self.received)
        return Completion(
            finish_reason=reason,
            stop=self.stop if reason == "stop" else "",
            prompt_tokens=prompt_tokens,
            completion_tokens=generated,
            cached_tokens=cached,
            timings=Timings(
                queue_s=0.0,  # the upstream's queue is not visible from here
                time_to_first_token_s=(self.first_at - self.received) if self.tokens else 0.0,
                decode_s=(self.last_at - self.first_at) if self.tokens else 0.0,
                e2e_s=now - self.received,
            ),
        )
