"""A real Prometheus server (Debian's, on loopback) scrapes the three running services (tiny presets). After the
services have served real RPCs — including through distributed Locust with the image's locustfile — every PromQL
expression of the Grafana dashboard, every recording rule and every prometheus-adapter query behind the HPAs
returns data, and the image's health check says SERVING."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import grpc
import numpy as np
import pytest
import yaml

from tests.deploy.tools import DEPLOY, K8S, REPO, SERVICES, load_yaml, tool
from tests.harness import sample_sum, scrape_samples, start_service, venv_python
from voiceagent.v1 import asr_pb2, asr_pb2_grpc, common_pb2, llm_pb2, llm_pb2_grpc, tts_pb2, tts_pb2_grpc

# Tiny presets; the LLM skips torch.compile warm-up, which halves its start-up (what is tested here is the
# deployment's monitoring, not decode speed).
SERVICE_ARGS = {"asr": ["--preset", "tiny"], "llm": ["--preset", "tiny", "--enforce-eager", "true"],
                "tts": ["--preset", "tiny"]}  # fmt: skip
RATE_WINDOW = "1m"  # stands in for Grafana's $__rate_interval: spans all of the test's traffic
DASHBOARD = DEPLOY / "monitoring" / "grafana" / "dashboards" / "voiceagent.json"
ADAPTER_VALUES = K8S / "components" / "autoscaling" / "prometheus-adapter-values.yaml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def services():
    """The three services on their tiny presets, started together (they load in parallel), SERVING."""
    with contextlib.ExitStack() as stack:
        started = {}
        for service in SERVICES:
            started[service] = start_service(f"services.{service}", venv_python(service), SERVICE_ARGS[service])
            stack.callback(started[service].terminate)
        # Runs first on exit: all three drain at once rather than one after another.
        stack.callback(lambda: [p.proc.send_signal(signal.SIGTERM) for p in started.values() if p.proc.poll() is None])
        for process in started.values():
            wait_serving(process, timeout_s=240)
        yield started


def wait_serving(process, timeout_s: float) -> None:
    """The harness' wait, tolerating a health check that times out while three engines load on two cores."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return process.wait_serving(max(1.0, deadline - time.monotonic()))
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > deadline:
                raise


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[dict]:
        params = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, condition, what: str, timeout_s: float = 30) -> None:
        """Static targets reach the scrape loop after service discovery's first update (about 5 s)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"Prometheus: {what} not within {timeout_s} s"
            time.sleep(0.5)

    def finite_values(self, expr: str) -> list[float]:
        return [float(s["value"][1]) for s in self.query(expr) if math.isfinite(float(s["value"][1]))]


@pytest.fixture(scope="module")
def prometheus(services, tmp_path_factory):
    """Prometheus scraping each service's metrics endpoint every second, with deploy/'s rules loaded. Targets
    carry the namespace and pod labels Kubernetes service discovery would give them (prometheus-adapter needs
    them)."""
    folder = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "monitoring" / "prometheus" / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": service,
                "static_configs": [
                    {
                        "targets": [urllib.parse.urlsplit(process.metrics_url).netloc],
                        "labels": {"namespace": "voiceagent", "pod": f"{service}-0"},
                    }
                ],
            }
            for service, process in services.items()
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [tool("prometheus"), f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address={address}", "--log.level=warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}/-/ready", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "Prometheus did not become ready"
                time.sleep(0.2)
        server = Prometheus(f"http://{address}")
        server.wait_for(lambda: {s["metric"]["job"]: s["value"][1] for s in server.query("up")}
                        == dict.fromkeys(services, "1"), "every target up")  # fmt: skip
        yield server
    finally:
        proc.terminate()
        proc.wait(10)


def speech_like_pcm16(seconds: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
    return (wave * 32767).astype("<i2").tobytes()


def drive_asr(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = asr_pb2_grpc.SpeechRecognizerStub(channel)
        config = asr_pb2.RecognitionConfig(
            sample_rate_hz=16000, encoding=common_pb2.AUDIO_ENCODING_PCM16, chunk_ms=160, interim_results=True
        )
        audio = speech_like_pcm16(2.0)
        for _ in range(2):
            pieces = [audio[i : i + 6400] for i in range(0, len(audio), 6400)]  # 200 ms each
            requests = [asr_pb2.StreamingRecognizeRequest(config=config)]
            requests += [asr_pb2.StreamingRecognizeRequest(audio=piece) for piece in pieces]
            responses = list(stub.StreamingRecognize(iter(requests), timeout=60))
            assert responses[-1].is_final
        stub.Recognize(asr_pb2.RecognizeRequest(config=config, audio=audio), timeout=60)
        stub.GetInfo(common_pb2.InfoRequest(), timeout=10)


def drive_llm(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = llm_pb2_grpc.TextGeneratorStub(channel)
        for prompt in ("Hello, how are you?", "Tell me a short story.", "What time is it?"):
            request = llm_pb2.GenerateRequest(text=prompt, sampling=llm_pb2.SamplingParams(max_tokens=8, temperature=0))
            responses = list(stub.Generate(request, timeout=60))
            assert responses[-1].HasField("completion")
        stub.GetInfo(common_pb2.InfoRequest(), timeout=10)


def drive_tts(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = tts_pb2_grpc.SpeechSynthesizerStub(channel)
        for text in ("Hello there.", "The weather is nice today."):
            chunks = list(stub.Synthesize(tts_pb2.SynthesizeRequest(text=text), timeout=120))
            assert chunks and chunks[-1].is_last
        stub.GetInfo(common_pb2.InfoRequest(), timeout=10)


def http(url: str, form: dict | None = None) -> bytes:
    data = urllib.parse.urlencode(form, doseq=True).encode() if form is not None else None
    with urllib.request.urlopen(url, data=data, timeout=10) as response:
        return response.read()


def distributed_locust(llm_address: str) -> dict[str, dict[str, str]]:
    """The cluster's Locust, as deployed (k8s/components/locust): a master with the class picker and a worker,
    both reading locust.conf, with the image's locustfile; a swarm started and read through the master's web
    API, as a person (or a script) does through `kubectl port-forward svc/locust-master 8089`."""
    locustfile = str(DEPLOY / "docker" / "loadgen" / "locustfile.py")
    conf = str(K8S / "components" / "locust" / "locust.conf")
    master_port, web_port = free_port(), free_port()
    common = [sys.executable, "-m", "locust", "--config", conf, "-f", locustfile, "--llm", llm_address]
    processes = [
        subprocess.Popen(
            [*common, "--master", "--class-picker", "--master-bind-host", "127.0.0.1",
             "--master-bind-port", str(master_port), "--web-host", "127.0.0.1", "--web-port", str(web_port)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [*common, "--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    web = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                if json.loads(http(f"{web}/worker-count"))["worker_count"] == 1:
                    break
            assert time.monotonic() < deadline, "the Locust worker did not connect to the master"
            assert all(p.poll() is None for p in processes), "a Locust process exited"
            time.sleep(0.5)
        swarm = {"user_count": 2, "spawn_rate": 2, "user_classes": "LlmUser", "prompt_tokens": "8",
                 "output_tokens": "4"}  # fmt: skip
        assert json.loads(http(f"{web}/swarm", swarm))["success"]
        time.sleep(5)
        http(f"{web}/stop", {})
        stats = http(f"{web}/stats/requests/csv").decode()
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    return {row["Name"]: row for row in csv.DictReader(stats.splitlines())}


@pytest.fixture(scope="module")
def served(services, prometheus):
    """Real traffic on every service, then a wait until Prometheus has scraped all of it."""
    drive_asr(services["asr"].address)
    drive_llm(services["llm"].address)
    drive_tts(services["tts"].address)
    locust_stats = distributed_locust(services["llm"].address)
    for service, process in services.items():  # until Prometheus has scraped the last request's work
        steps = engine_steps(process.metrics_url, service)
        prometheus.wait_for(
            lambda s=service, n=steps: prometheus.finite_values(f"voiceagent_{s}_engine_steps_total") == [n],
            f"{service} engine steps = {steps}",
        )
    return locust_stats


def engine_steps(metrics_url: str, service: str) -> float:
    return sample_sum(scrape_samples(metrics_url), f"voiceagent_{service}_engine_steps_total")


def dashboard_expressions() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [
        (f"{panel['title']} [{target['refId']}]", target["expr"].replace("$__rate_interval", RATE_WINDOW))
        for panel in panels
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def test_prometheus_scrapes_every_service(prometheus, served):
    up = {s["metric"]["job"]: s["value"][1] for s in prometheus.query("up")}
    assert up == {service: "1" for service in SERVICES}


def test_every_dashboard_expression_returns_data(prometheus, served):
    expressions = dashboard_expressions()
    assert len(expressions) >= 30
    empty = [f"{title}: {expr}" for title, expr in expressions if not prometheus.finite_values(expr)]
    assert not empty, "dashboard expressions without data:\n" + "\n".join(empty)


def test_live_utilisation_is_measured_against_the_ceilings(prometheus, served):
    """The recording rules' ratios are above zero (the work counters moved) and below the ceiling."""
    for service in SERVICES:
        for what in ("bandwidth", "flops"):
            ratio = f"instance:voiceagent_{service}_model_{what}_utilisation:ratio_rate1m"
            # The rule may last have run just before the scrape that saw the traffic: give it an evaluation.
            prometheus.wait_for(lambda r=ratio: any(v > 0 for v in prometheus.finite_values(r)), f"{ratio} > 0", 10)
            assert all(0 < value < 1.05 for value in prometheus.finite_values(ratio)), ratio


def adapter_metrics(prometheus: Prometheus) -> dict[str, tuple[str, dict]]:
    """What prometheus-adapter would serve: custom metric name -> (series name, rule), from the live series."""
    metrics = {}
    for rule in load_yaml(ADAPTER_VALUES)["rules"]["custom"]:
        params = urllib.parse.urlencode({"match[]": rule["seriesQuery"]})
        with urllib.request.urlopen(f"{prometheus.url}/api/v1/series?{params}", timeout=10) as response:
            names = {series["__name__"] for series in json.load(response)["data"]}
        pattern, replacement = rule["name"]["matches"], re.sub(r"\$\{(\d+)\}", r"\\\1", rule["name"]["as"])
        for name in names:
            metrics[re.sub(pattern, replacement, name)] = (name, rule)
    return metrics


def test_prometheus_adapter_rules_serve_each_hpa_metric(prometheus, served):
    """Each HPA's metric is one the adapter's rules expose; its query, rendered for one pod, has a value."""
    metrics = adapter_metrics(prometheus)
    hpas = [doc for doc in yaml.safe_load_all((K8S / "components" / "autoscaling" / "hpa.yaml").read_text()) if doc]
    assert {hpa["metadata"]["name"] for hpa in hpas} == set(SERVICES)
    for hpa in hpas:
        service = hpa["metadata"]["name"]
        metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
        assert metric in metrics, f"{service}: the adapter rules expose no {metric} (they expose {sorted(metrics)})"
        series, rule = metrics[metric]
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", f'namespace="voiceagent",pod=~"{service}-0"')
            .replace("<<.GroupBy>>", "pod")
        )
        assert prometheus.finite_values(query), f"{service}: {query} returned nothing"


def test_distributed_locust_drove_the_llm(served):
    generate = served["Generate"]
    assert int(generate["Request Count"]) > 0 and int(generate["Failure Count"]) == 0, generate
    # Only the master was told the output length (in the swarm form): the worker ran the master's workload.
    assert float(generate["Average Content Size"]) == 4, generate


@pytest.mark.parametrize("service", SERVICES)
def test_image_health_check_speaks_grpc_health(services, service):
    script = str(DEPLOY / "docker" / "grpc_health_check.py")
    ok = subprocess.run([venv_python(service), script, services[service].address], capture_output=True, text=True)
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stdout + ok.stderr
    closed = subprocess.run([venv_python(service), script, f"127.0.0.1:{free_port()}"], capture_output=True, text=True)
    assert closed.returncode == 1 and "UNAVAILABLE" in closed.stderr
