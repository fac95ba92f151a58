"""Container health check: ask a service's grpc.health.v1 endpoint whether it is SERVING.

`python grpc_health_check.py HOST:PORT [SERVICE]` exits 0 when SERVING, 1 otherwise (not serving, unreachable
or too slow). The same question Kubernetes' `grpc:` probes ask, for Docker's HEALTHCHECK, which cannot speak
gRPC itself. Uses only grpcio and grpcio-health-checking, which every service image has.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout_s: float = 3.0) -> int:
    try:
        with grpc.insecure_channel(address) as channel:
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
