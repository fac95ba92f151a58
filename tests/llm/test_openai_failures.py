"""The openai backend's upstream failures, each caused by a real server that fails that way: a small
OpenAI-compatible HTTP server on loopback (upstream_server.py) that answers 429/5xx/4xx, goes silent, hangs up
or errors mid-stream on demand, a closed port, and the same server behind TLS. Each maps to one gRPC status."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import grpc
import pytest

from tests.harness import REPO, sample_sum, scrape_samples, start_service, venv_python
from tests.llm.conftest import generate
from tests.llm.upstream_server import PACE_S
from voiceagent.v1 import common_pb2, llm_pb2, llm_pb2_grpc

READ_TIMEOUT_S = 1.0
API_KEY = "sk-test-key-from-a-file"


class Upstream:
    """upstream_server.py in its own process; `url` is its base URL, /v1 included."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-u", "-m", "tests.llm.upstream_server", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        line = self.proc.stdout.readline()
        match = re.search(r"listening on (\S+):(\d+)", line)
        assert match, f"upstream did not start: {line}{self.proc.stdout.read() if self.proc.poll() else ''}"
        scheme = "https" if args else "http"
        self.url = f"{scheme}://localhost:{match[2]}/v1"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class RemoteLlm:
    """Our LLM service with the openai backend in front of `upstream_url`, and a stub to call it."""

    def __init__(self, upstream_url: str, *args: str, env: dict[str, str] | None = None):
        argv = ["--backend", "openai", "--upstream-url", upstream_url, "--upstream-read-timeout-s",
                str(READ_TIMEOUT_S), "--upstream-connect-timeout-s", "2", *args]  # fmt: skip
        self.service = start_service("services.llm", venv_python("llm"), argv, env)
        self.service.wait_serving(60)
        self.channel = grpc.insecure_channel(self.service.address)
        self.stub = llm_pb2_grpc.TextGeneratorStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.service.terminate()


@pytest.fixture(scope="module")
def upstream():
    server = Upstream()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote(upstream, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("secrets") / "api-key"
    key_file.write_text(API_KEY + "\n")
    service = RemoteLlm(upstream.url, "--upstream-api-key-file", str(key_file))
    yield service
    service.stop()


def failure(stub, text: str, **fields) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, text=text, timeout=30, **fields)
    return caught.value


@pytest.mark.parametrize(
    ("http_status", "grpc_status"),
    [
        (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (500, grpc.StatusCode.UNAVAILABLE),
        (503, grpc.StatusCode.UNAVAILABLE),
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (404, grpc.StatusCode.INVALID_ARGUMENT),
        (422, grpc.StatusCode.INVALID_ARGUMENT),
        # the service's own key was refused: not the caller's fault, retryable elsewhere (openai_compatible.py)
        (401, grpc.StatusCode.UNAVAILABLE),
        (403, grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_http_errors_map_to_a_status_with_the_upstreams_message(remote, http_status, grpc_status):
    error = failure(remote.stub, f"status {http_status}")
    assert error.code() == grpc_status
    assert f"HTTP {http_status}: synthetic failure {http_status} for this request" in error.details()
    assert ("this service's own API key" in error.details()) == (http_status in (401, 403))


def test_http_errors_on_the_chat_endpoint_too(remote):
    chat = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="status 429")])
    with pytest.raises(grpc.RpcError) as caught:
        generate(remote.stub, chat=chat)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "chat/completions" in caught.value.details()


def test_a_silent_upstream_is_deadline_exceeded_after_the_read_timeout(remote):
    started = time.perf_counter()
    error = failure(remote.stub, "silent")
    waited = time.perf_counter() - started
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"nothing received for {READ_TIMEOUT_S:g} s" in error.details()
    assert READ_TIMEOUT_S <= waited < READ_TIMEOUT_S + 5


def test_an_upstream_that_hangs_up_mid_stream_is_unavailable_after_what_it_sent(remote):
    call = remote.stub.Generate(llm_pb2.GenerateRequest(text="hang up", sampling=llm_pb2.SamplingParams(max_tokens=8)))
    received = []
    with pytest.raises(grpc.RpcError) as caught:
        received.extend(call)
    assert [r.text for r in received] == ["one"], "what arrived before the failure was streamed on"
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE and "RemoteProtocolError" in caught.value.details()


def test_an_error_event_mid_stream_is_unavailable_with_its_message(remote):
    error = failure(remote.stub, "error event")
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "synthetic engine failure mid-stream" in error.details()


def test_deltas_are_sent_on_as_the_upstream_sends_them(remote):
    started, arrivals = time.perf_counter(), []
    responses = []
    for response in remote.stub.Generate(
        llm_pb2.GenerateRequest(text="slow", sampling=llm_pb2.SamplingParams(max_tokens=3)), timeout=30
    ):
        arrivals.append(time.perf_counter() - started)
        responses.append(response)
    assert [r.text for r in responses] == ["one", " two", " three", ""]
    assert [list(r.token_ids) for r in responses] == [[1], [2], [3], []]
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:3], strict=False)]
    assert arrivals[0] < PACE_S, "the first word was not held back"
    assert all(0.8 * PACE_S < gap < 3 * PACE_S for gap in gaps), f"gaps {gaps}: each word arrived when it was sent"
    done = responses[-1].completion
    assert done.finish_reason == llm_pb2.FINISH_REASON_LENGTH
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (5, 3)
    assert done.timings.decode_s >= 2 * 0.8 * PACE_S


def test_the_api_key_comes_from_the_key_file(remote):
    responses = generate(remote.stub, text="whoami")
    assert "".join(r.text for r in responses) == f"Bearer {API_KEY}"


def test_info_reports_the_upstream_and_no_ceilings(remote, upstream):
    info = remote.stub.GetInfo(common_pb2.InfoRequest(), timeout=10)
    assert (info.model.backend, info.model.source, info.model.preset) == ("openai", upstream.url, "fake-upstream")
    assert info.ceilings.device == "unmeasured" and info.model.weight_bytes == 0
    # The service's own latency metrics still count the relayed requests.
    samples = scrape_samples(remote.service.metrics_url)
    assert sample_sum(samples, "voiceagent_llm_time_to_first_token_seconds_count") >= 1


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when this returns: nothing listens there


def test_connection_refused_is_unavailable_and_the_service_still_serves():
    service = RemoteLlm(f"http://127.0.0.1:{closed_port()}/v1", "--upstream-model", "any")
    try:
        error = failure(service.stub, "hello")
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "ConnectError" in error.details()
        assert "upstream not ready" in service.service.output()
    finally:
        service.stop()


@pytest.fixture(scope="module")
def tls_upstream(tmp_path_factory):
    """The same upstream behind TLS, with a self-signed certificate for localhost."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    server = Upstream("--certfile", str(cert), "--keyfile", str(key))
    yield server, cert
    server.stop()


def test_tls_to_the_upstream_is_verified_against_the_ca_file(tls_upstream):
    server, cert = tls_upstream
    trusted = RemoteLlm(server.url, "--upstream-ca-file", str(cert), env={"OPENAI_API_KEY": "sk-from-env"})
    untrusted = RemoteLlm(server.url, "--upstream-model", "fake-upstream")
    try:
        assert "".join(r.text for r in generate(trusted.stub, text="hello")) == "ok"
        assert "".join(r.text for r in generate(trusted.stub, text="whoami")) == "Bearer sk-from-env"
        error = failure(untrusted.stub, "hello")  # the system's CAs do not know a self-signed certificate
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "CERTIFICATE_VERIFY_FAILED" in error.details()
    finally:
        trusted.stop()
        untrusted.stop()
