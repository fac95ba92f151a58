"""Transport security and load spreading of every gRPC channel the project opens, server and client side.

A server serves plaintext by default, TLS when given a certificate and key, mutual TLS when also given a client
CA (`ServingConfig.tls_*`). A client trusts a CA (`ClientTls.ca`) and, for mutual TLS, presents its own
certificate. Every client channel balances with `round_robin`: pointed at `dns:///NAME:PORT` of a headless
Kubernetes Service (or a compose service scaled out), it opens one connection per address DNS returns and spreads
its calls over them, re-resolving as replicas come and go; with a single address it is one connection as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import grpc

from voiceagent.serving.config import ConfigError, require

# Client-side load balancing over every address the target resolves to (grpc's default is pick_first: one).
BALANCING_OPTIONS = (("grpc.lb_policy_name", "round_robin"),)


def read_pem(path: str, field: str) -> bytes:
    """The bytes of a PEM file; a missing, unreadable or non-PEM file is a ConfigError naming `field`."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(field, f"cannot read {path!r}: {error.strerror or error}") from None
    require(b"-----BEGIN " in data, field, f"{path!r} is not a PEM file")
    return data


def server_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """TLS with `cert` and `key`; with `client_ca`, mutual TLS: clients must present a certificate it signed."""
    pair = (read_pem(key, "tls_key"), read_pem(cert, "tls_cert"))
    roots = read_pem(client_ca, "tls_client_ca") if client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=bool(client_ca))


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How a client reaches TLS servers: the CA it trusts, and its own certificate and key for mutual TLS.

    `server_name` overrides the name checked against the server's certificate (the target's host otherwise),
    e.g. when a pod is reached by IP. All empty: plaintext.
    """

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        require(bool(self.cert) == bool(self.key), "tls_cert", "a client certificate needs its key and vice versa")
        require(bool(self.ca) or not self.cert, "tls_ca", "a client certificate needs the CA that signed the servers'")

    @property
    def enabled(self) -> bool:
        return bool(self.ca)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(self.ca, "tls_ca"),
            private_key=read_pem(self.key, "tls_key") if self.key else None,
            certificate_chain=read_pem(self.cert, "tls_cert") if self.cert else None,
        )


PLAINTEXT = ClientTls()


def open_channel(target: str, tls: ClientTls = PLAINTEXT, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A blocking channel to `target` (HOST:PORT, dns:///NAME:PORT, ipv4:A:P,B:Q ...), TLS when `tls` says so,
    balancing round-robin over every address the target resolves to."""
    options = [*BALANCING_OPTIONS, *options]
    if not tls.enabled:
        return grpc.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, tls.credentials(), options=options)
