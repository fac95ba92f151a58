"""Load across replicas: the load generator's channel to one target that resolves to several real service
processes spreads its calls over all of them (round_robin), as it does over a headless Service's pods.

The target here is grpc's static `ipv4:127.0.0.1:P1,127.0.0.1:P2,...` list: the same channel, load-balancing
policy and per-address connections as `dns:///NAME:PORT` when DNS returns several addresses, without a DNS server
the test would have to run. Each replica's own /metrics count is the evidence.
"""

from __future__ import annotations

import contextlib
import time

import gevent.pool

from loadgen.results import RequestRecord
from loadgen.users.base import LoadContext
from loadgen.users.calls import synthesize
from loadgen.workload import Endpoints, Workload
from tests.certs import make_certificates
from tests.harness import start_service, venv_python
from voiceagent.serving.tls import ClientTls

REPLICAS, REQUESTS, USERS = 3, 150, 6
SYNTHESIZE_OK = 'voiceagent_paced_rpc_requests_total{code="OK",method="Synthesize"}'


def test_the_load_generators_channel_spreads_requests_over_every_replica_under_mutual_tls(tmp_path):
    certs = make_certificates(tmp_path / "certs")
    tls = ClientTls(certs.ca, certs.client_cert, certs.client_key)
    server = ["--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-client-ca", certs.ca]
    args = ["--load-s", "0", "--probe-ceilings", "false", "--chunk-delay-s", "0.002", *server]
    with contextlib.ExitStack() as stack:
        replicas = []
        for _ in range(REPLICAS):
            replica = start_service("tests.runtime.paced_service", venv_python("dev"), args, tls=tls)
            stack.callback(replica.stop)
            replicas.append(replica)
        for replica in replicas:
            replica.wait_serving(60)
        target = "ipv4:" + ",".join(replica.address for replica in replicas)
        # the server name the certificates carry: the target names no single host
        endpoints = Endpoints(
            tts=target,
            grpc_tls_ca=tls.ca,
            grpc_tls_cert=tls.cert,
            grpc_tls_key=tls.key,
            grpc_tls_server_name="localhost",
        )
        workload = Workload(endpoints=endpoints, timeout_s=30)
        records: list[RequestRecord] = []
        context = LoadContext(workload, records.append)
        channel = context.channel(endpoints.tts)

        def one(index: int) -> None:
            record = RequestRecord(target="tts", concurrency=USERS, started_s=time.time(), ok=True)
            synthesize(channel, f"replica spread {index}", workload, record, time.perf_counter())
            records.append(record)

        gevent.pool.Pool(USERS).map(one, range(REQUESTS))
        context.close()

        assert len(records) == REQUESTS and all(record.ok for record in records)
        served = [replica.metrics().get(SYNTHESIZE_OK, 0.0) for replica in replicas]
        assert sum(served) == REQUESTS, served
        share = REQUESTS / REPLICAS
        assert all(abs(count - share) <= 0.2 * share for count in served), f"per replica {served}, even {share:g}"
