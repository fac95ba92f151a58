"""Container health check: ask a service's grpc.health.v1 endpoint whether it is SERVING.

`python grpc_health_check.py HOST:PORT [SERVICE]` exits 0 when SERVING, 1 otherwise (not serving, unreachable
or too slow). The same question Kubernetes' `grpc:` probes ask, for Docker's HEALTHCHECK, which cannot speak
gRPC itself. Uses only grpcio and grpcio-health-checking, which every service image has.

A service serving TLS is checked over TLS when HEALTH_TLS_CA names the CA file; under mutual TLS,
HEALTH_TLS_CERT and HEALTH_TLS_KEY name a client certificate and key, and HEALTH_TLS_SERVER_NAME the name in
the service's certificate when it is not the address's host (the same settings as
voiceagent/serving/tls.py's ClientTls, which this script cannot import from where it is installed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def open_channel(address: str) -> grpc.Channel:
    ca = os.environ.get("HEALTH_TLS_CA", "")
    if not ca:
        return grpc.insecure_channel(address)
    cert, key = os.environ.get("HEALTH_TLS_CERT", ""), os.environ.get("HEALTH_TLS_KEY", "")
    credentials = grpc.ssl_channel_credentials(
        Path(ca).read_bytes(),
        Path(key).read_bytes() if key else None,
        Path(cert).read_bytes() if cert else None,
    )
    name = os.environ.get("HEALTH_TLS_SERVER_NAME", "")
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", name)] if name else [])


def check(address: str, service: str = "", timeout_s: float = 3.0) -> int:
    try:
        with open_channel(address) as channel:
            status = (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
                .status
            )
    except grpc.RpcError as error:
        print(f"{address}: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    print(f"{address}: {name}")
    return 0 if status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: grpc_health_check.py HOST:PORT [SERVICE]")
    sys.exit(check(*sys.argv[1:]))
