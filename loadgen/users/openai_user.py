"""The peer target: an OpenAI-compatible completions endpoint (e.g. `vllm serve` on the same model), driven by
exactly the LLM user's workload — random token-id prompts, fixed output lengths, greedy, ignore_eos."""

from __future__ import annotations

import json
import time

import requests

from loadgen.results import RequestRecord
from loadgen.timing import TokenClock
from loadgen.users.base import StreamingUser

_models: dict[str, str] = {}


def served_model(base_url: str, session: requests.Session) -> str:
    """The first model the server lists; asked once per process."""
    if base_url not in _models:
        response = session.get(f"{base_url}/v1/models", timeout=10)
        response.raise_for_status()
        _models[base_url] = response.json()["data"][0]["id"]
    return _models[base_url]


class OpenAIUser(StreamingUser):
    abstract = False
    target, method = "openai", "completions"

    def on_start(self) -> None:
        super().on_start()
        self.session = requests.Session()

    def request(self) -> RequestRecord:
        base_url = self.workload.endpoints.openai.rstrip("/")
        body = {
            "prompt": self.workload.prompt_ids(self.rng),
            "max_tokens": self.workload.output_tokens.sample(self.rng),
            "temperature": 0.0,
            "ignore_eos": self.workload.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,  # vLLM: token ids per chunk, so ITL is per token
        }

        def call(record: RequestRecord, started: float) -> None:
            body["model"] = served_model(base_url, self.session)  # asked once per process, then cached
            url, timeout = f"{base_url}/v1/completions", self.workload.timeout_s
            with self.session.post(url, json=body, stream=True, timeout=timeout) as response:
                response.raise_for_status()
                self._read_stream(response, record, started)

        return self.timed(call)

    @staticmethod
    def _read_stream(response: requests.Response, record: RequestRecord, started: float) -> None:
        clock, usage = TokenClock(record, started), None
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                clock.arrived(now, len(choice.get("token_ids") or ()) or (1 if choice.get("text") else 0))
        clock.finish(usage["completion_tokens"] if usage else 0)
        if usage:
            record.extra["prompt_tokens"] = float(usage["prompt_tokens"])
