"""What the users send: length distributions, prompts, texts and utterances, and where the services listen.

One `Workload` describes a sweep's traffic for every target, so the same LLM workload drives our gRPC service
and an OpenAI-compatible peer, and a worker process rebuilds exactly the master's workload from its JSON.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re

from loadgen.speech import speech_like
from voiceagent.serving.tls import ClientTls

TARGETS = ("asr", "llm", "tts", "voice", "openai")

# Words for TTS texts and LLM fallbacks: ordinary short English words, so text length in words ≈ speech time.
_WORDS = (
    "the a voice agent listens and answers quickly when you ask about weather trains music news time place today "
    "tomorrow morning evening please could would tell me more about this that open close play stop next one two "
    "three four five small large green blue city river station ticket price minute hour window"
)


@dataclasses.dataclass(frozen=True)
class Lengths:
    """A length distribution: "64" (fixed), "32-128" (uniform) or "lognormal:64,0.5" (median, sigma)."""

    spec: str

    def __post_init__(self) -> None:
        self.sample(random.Random(0))  # fail on a malformed spec at parse time, not inside a user

    def sample(self, rng: random.Random) -> int:
        spec = self.spec.strip()
        if match := re.fullmatch(r"(\d+)", spec):
            return int(match[1])
        if match := re.fullmatch(r"(\d+)-(\d+)", spec):
            low, high = int(match[1]), int(match[2])
            if low > high:
                raise ValueError(f"length range {spec!r}: low above high")
            return rng.randint(low, high)
        if match := re.fullmatch(r"lognormal:(\d+(?:\.\d+)?),(\d+(?:\.\d+)?)", spec):
            return max(1, round(rng.lognormvariate(0, float(match[2])) * float(match[1])))
        raise ValueError(f"length {spec!r}: expected N, LOW-HIGH or lognormal:MEDIAN,SIGMA")


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """Where each service's gRPC port and metrics endpoint are; the defaults are the services' defaults.

    A gRPC address is HOST:PORT or any grpc target; `dns:///NAME:PORT` of a headless Service (or a scaled compose
    service) spreads the calls round-robin over every replica. `grpc_tls_*` are PEM files: the CA the services'
    certificates are signed by (TLS), and this client's certificate and key (mutual TLS).
    """

    asr: str = "127.0.0.1:50051"
    llm: str = "127.0.0.1:50052"
    tts: str = "127.0.0.1:50053"
    asr_metrics: str = "http://127.0.0.1:9091/metrics"
    llm_metrics: str = "http://127.0.0.1:9092/metrics"
    tts_metrics: str = "http://127.0.0.1:9093/metrics"
    openai: str = "http://127.0.0.1:8000"  # base URL of an OpenAI-compatible server (vllm serve)
    # (grpc_ in the names: Locust's own --tls-cert/--tls-key are its web UI's)
    grpc_tls_ca: str = ""
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    grpc_tls_server_name: str = ""  # the name the services' certificates carry, when the address is not it

    @property
    def tls(self) -> ClientTls:
        return ClientTls(self.grpc_tls_ca, self.grpc_tls_cert, self.grpc_tls_key, self.grpc_tls_server_name)

    def metrics_url(self, service: str) -> str:
        return getattr(self, f"{service}_metrics")


@dataclasses.dataclass(frozen=True)
class Workload:
    endpoints: Endpoints = Endpoints()
    # LLM (and the OpenAI peer): prompt and output lengths in tokens; prompts are random token ids, distinct
    # per request, so no two requests share a prefix and prefix caching cannot flatter the numbers.
    prompt_tokens: Lengths = Lengths("128")
    output_tokens: Lengths = Lengths("64")
    ignore_eos: bool = True
    vocab_size: int = 0  # token ids are drawn below this (from the service's GetInfo); 0 = 1000
    # ASR: utterance length and the chunk the model consumes; audio is sent in pieces of `chunk_ms`, paced in
    # real time, as a microphone would deliver it.
    utterance_s: Lengths = Lengths("3")
    chunk_ms: int = 160
    # TTS: text length in words; diffusion steps (None = the service's default).
    text_words: Lengths = Lengths("8-16")
    inference_timesteps: int | None = None
    # Voice turn: the reply length in LLM tokens, and how many words are buffered before the first flush to TTS.
    reply_tokens: Lengths = Lengths("24")
    flush_words: int = 4
    timeout_s: float = 120.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Workload:
        fields = json.loads(text)
        fields["endpoints"] = Endpoints(**fields["endpoints"])
        for name in ("prompt_tokens", "output_tokens", "utterance_s", "text_words", "reply_tokens"):
            fields[name] = Lengths(**fields[name])
        return cls(**fields)

    def prompt_ids(self, rng: random.Random) -> list[int]:
        # Skip the lowest ids: special and byte tokens in most vocabularies.
        high = (self.vocab_size or 1000) - 1
        return [rng.randint(min(256, high // 2), high) for _ in range(self.prompt_tokens.sample(rng))]

    def text(self, rng: random.Random, words: int) -> str:
        sentence = " ".join(rng.choice(_WORDS.split()) for _ in range(words))
        return sentence[0].upper() + sentence[1:] + "."

    def utterance(self, rng: random.Random):
        """A speech-like utterance; durations are rounded to 0.5 s and voices to 8 so the cache stays small."""
        duration_s = max(0.5, round(self.utterance_s.sample(rng) * 2) / 2)
        return speech_like(duration_s, seed=rng.randrange(8))
