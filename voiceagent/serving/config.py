"""Configuration: one frozen dataclass per service, filled from flags, then environment, then defaults.

A field `max_streams` of the ASR service is set by `--max-streams` or `ASR_MAX_STREAMS`. Validation runs
in the dataclass (`validate`), and a bad value stops start-up with a message naming the setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Mapping, Sequence


class ConfigError(ValueError):
    """A setting is invalid; `field` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(field, message)


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """Settings every service has. Services subclass this and add their own."""

    host: str = dataclasses.field(default="127.0.0.1", metadata={"help": "address to bind (0.0.0.0 in containers)"})
    port: int = dataclasses.field(default=0, metadata={"help": "gRPC port (0 = any free port)"})
    metrics_port: int = dataclasses.field(default=0, metadata={"help": "Prometheus /metrics port (0 = any free port)"})
    grace_s: float = dataclasses.field(default=10.0, metadata={"help": "seconds in-flight streams get on SIGTERM"})
    device: str = dataclasses.field(default="cpu", metadata={"help": "torch device: cpu, cuda, cuda:1, ..."})
    probe_ceilings: bool = dataclasses.field(
        default=True, metadata={"help": "measure memory bandwidth and matmul peak at start-up"}
    )
    max_connection_age_s: float = dataclasses.field(
        default=0.0,
        metadata={"help": "send clients GOAWAY after a connection's age (in-flight calls finish) so they re-resolve "
                  "DNS and reach new replicas; 0 = never"},
    )  # fmt: skip
    tls_cert: str = dataclasses.field(default="", metadata={"help": "PEM certificate (chain): serve TLS on gRPC"})
    tls_key: str = dataclasses.field(default="", metadata={"help": "PEM private key of --tls-cert"})
    tls_client_ca: str = dataclasses.field(
        default="", metadata={"help": "PEM CA bundle: mutual TLS, clients must present a certificate it signed"}
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        require(0 <= self.port <= 65535, "port", f"must be 0..65535, got {self.port}")
        require(0 <= self.metrics_port <= 65535, "metrics_port", f"must be 0..65535, got {self.metrics_port}")
        require(self.port == 0 or self.port != self.metrics_port, "metrics_port", "must differ from the gRPC port")
        require(self.grace_s >= 0, "grace_s", f"must be >= 0, got {self.grace_s}")
        require(
            self.max_connection_age_s >= 0, "max_connection_age_s", f"must be >= 0, got {self.max_connection_age_s}"
        )
        require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "device",
            f"must be 'cpu' or 'cuda[:N]', got {self.device!r}",
        )
        require(bool(self.tls_cert) == bool(self.tls_key), "tls_key" if self.tls_cert else "tls_cert",
                "TLS needs both a certificate (--tls-cert) and its key (--tls-key)")  # fmt: skip
        require(not self.tls_client_ca or self.tls_cert, "tls_client_ca", "mutual TLS needs --tls-cert and --tls-key")
        for field in ("tls_cert", "tls_key", "tls_client_ca"):
            path = getattr(self, field)
            require(not path or os.access(path, os.R_OK), field, f"{path!r} is not a readable file")


C = typing.TypeVar("C", bound=ServingConfig)


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(kind: typing.Any):
    if kind is bool:
        return _parse_bool
    if kind in (int, float, str):
        return kind
    raise TypeError(f"unsupported config field type {kind!r}")


def env_name(prefix: str, field: str) -> str:
    return f"{prefix.upper()}_{field.upper()}"


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def load_config(
    cls: type[C],
    prefix: str,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Build `cls` from flags (highest precedence), `PREFIX_FIELD` environment variables, then defaults.

    Raises SystemExit with a message naming the flag and variable when a value is invalid.
    """
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=f"python -m services.{prefix.lower()}", description=cls.__doc__)
    for field in dataclasses.fields(cls):
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            default=None,
            metavar=hints[field.name].__name__.upper(),
            help=f"{field.metadata.get('help', '')} (env {env_name(prefix, field.name)}; default {field.default!r})",
        )
    args = parser.parse_args(argv)
    values: dict[str, typing.Any] = {}
    for field in dataclasses.fields(cls):
        raw = getattr(args, field.name)
        source = flag_name(field.name)
        if raw is None and env_name(prefix, field.name) in environ:
            raw, source = environ[env_name(prefix, field.name)], env_name(prefix, field.name)
        if raw is None:
            continue
        try:
            values[field.name] = _converter(hints[field.name])(raw)
        except ValueError as exc:
            raise SystemExit(f"config error: {source}={raw!r}: {exc}") from None
    try:
        return cls(**values)
    except ConfigError as exc:
        raise SystemExit(f"config error: {flag_name(exc.field)} / {env_name(prefix, exc.field)} {exc}") from None
