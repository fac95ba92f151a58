"""Throwaway certificates for the TLS tests, made with the `openssl` command line in a temporary folder:
a CA, a server certificate it signs for localhost and 127.0.0.1, and a client certificate it signs."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Certificates:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(folder: Path, name: str, usage: str, ca: str = "ca") -> None:
    key_options = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", *key_options, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=folder)
    (folder / f"{name}.ext").write_text(f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)  # fmt: skip


def make_certificates(folder: Path, ca_name: str = "ca") -> Certificates:
    """A fresh CA named `ca_name` and a server and a client certificate it signed, as PEM files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
             "-keyout", f"{ca_name}.key", "-out", f"{ca_name}.crt", "-subj", f"/CN={ca_name}", cwd=folder)  # fmt: skip
    _signed(folder, "server", "serverAuth", ca_name)
    _signed(folder, "client", "clientAuth", ca_name)
    path = lambda name: str(folder / name)  # noqa: E731
    return Certificates(path(f"{ca_name}.crt"), path("server.crt"), path("server.key"), path("client.crt"),
                        path("client.key"))  # fmt: skip
