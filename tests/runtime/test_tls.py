"""TLS and mutual TLS on the shared runtime's gRPC port, with certificates made for the test: a real service
process serves them, the launcher's health check, the load generator's GetInfo and a plain client speak them."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

from loadgen.scrape import service_facts
from tests.certs import make_certificates
from tests.harness import REPO, running_service, venv_python
from tests.runtime.paced_service import PacedConfig
from voiceagent.serving.config import load_config
from voiceagent.serving.tls import ClientTls, open_channel
from voiceagent.v1 import common_pb2, tts_pb2_grpc

ARGS = ["--load-s", "0", "--probe-ceilings", "false"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def info(address: str, tls: ClientTls) -> str:
    with open_channel(address, tls) as channel:
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        return stub.GetInfo(common_pb2.InfoRequest(), timeout=10).service


def refused(address: str, tls: ClientTls) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as error:
        info(address, tls)
    return error.value.code()


def image_health_check(address: str, **tls: str) -> subprocess.CompletedProcess:
    """The images' HEALTHCHECK script, with its HEALTH_TLS_* settings."""
    env = {**os.environ, **{f"HEALTH_TLS_{key.upper()}": value for key, value in tls.items()}}
    script = REPO / "deploy" / "docker" / "grpc_health_check.py"
    return subprocess.run(
        [venv_python("dev"), str(script), address], env=env, capture_output=True, text=True, timeout=60
    )


def test_mutual_tls_serves_a_client_with_a_certificate_and_refuses_others(certs, tmp_path):
    server = ["--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-client-ca", certs.ca]
    client = ClientTls(certs.ca, certs.client_cert, certs.client_key)
    # wait_serving asks grpc.health.v1 over mutual TLS: the launcher's health check speaks it
    with running_service("tests.runtime.paced_service", venv_python("dev"), [*ARGS, *server], tls=client) as paced:
        assert "(mutual TLS)" in paced.output()
        assert info(paced.address, client) == "paced"
        assert service_facts("tts", paced.address, tls=client).service == "paced"  # the load generator's query
        assert refused(paced.address, ClientTls(certs.ca)) == grpc.StatusCode.UNAVAILABLE  # no certificate
        assert refused(paced.address, ClientTls()) == grpc.StatusCode.UNAVAILABLE  # plaintext
        stranger = make_certificates(tmp_path / "stranger", "stranger-ca")  # a certificate another CA signed
        with_foreign_cert = ClientTls(certs.ca, stranger.client_cert, stranger.client_key)
        assert refused(paced.address, with_foreign_cert) == grpc.StatusCode.UNAVAILABLE
        # the images' health check: SERVING with the client certificate, a failure without one
        served = image_health_check(paced.address, ca=certs.ca, cert=certs.client_cert, key=certs.client_key)
        assert served.returncode == 0 and "SERVING" in served.stdout, served.stdout + served.stderr
        assert image_health_check(paced.address, ca=certs.ca).returncode == 1
        assert image_health_check(paced.address).returncode == 1


def test_tls_serves_a_client_that_trusts_the_ca_and_refuses_one_that_does_not(certs, tmp_path):
    server = ["--tls-cert", certs.server_cert, "--tls-key", certs.server_key]
    with running_service(
        "tests.runtime.paced_service", venv_python("dev"), [*ARGS, *server], tls=ClientTls(certs.ca)
    ) as paced:
        assert "(TLS)" in paced.output()
        assert info(paced.address, ClientTls(certs.ca)) == "paced"
        # the server's name is checked: a name its certificate does not carry is refused
        assert refused(paced.address, ClientTls(certs.ca, server_name="asr.example")) == grpc.StatusCode.UNAVAILABLE
        other = make_certificates(tmp_path / "other", "other-ca")
        assert refused(paced.address, ClientTls(other.ca)) == grpc.StatusCode.UNAVAILABLE
        assert refused(paced.address, ClientTls()) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tls-cert", "{cert}"], "--tls-key / PACED_TLS_KEY"),
        (["--tls-key", "{key}"], "--tls-cert / PACED_TLS_CERT"),
        (["--tls-client-ca", "{ca}"], "--tls-client-ca / PACED_TLS_CLIENT_CA"),
        (["--tls-cert", "/nonexistent.pem", "--tls-key", "{key}"], "--tls-cert / PACED_TLS_CERT"),
    ],
)
def test_incomplete_tls_settings_stop_start_up_naming_the_flag(certs, argv, named):
    paths = {"cert": certs.server_cert, "key": certs.server_key, "ca": certs.ca}
    with pytest.raises(SystemExit) as stopped:
        load_config(PacedConfig, "PACED", [arg.format(**paths) for arg in argv], {})
    assert named in str(stopped.value)


def test_tls_settings_come_from_the_environment_too(certs):
    env = {"PACED_TLS_CERT": certs.server_cert, "PACED_TLS_KEY": certs.server_key, "PACED_TLS_CLIENT_CA": certs.ca}
    config = load_config(PacedConfig, "PACED", [], env)
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == (certs.server_cert, certs.server_key, certs.ca)
