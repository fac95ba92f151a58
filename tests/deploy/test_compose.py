"""The compose files, alone and merged as `docker compose -f compose.yaml -f compose.gpu.yaml` merges them,
validate against the compose specification's JSON schema (vendored in check-jsonschema), and agree with the
Prometheus config and the images on names and ports."""

from __future__ import annotations

import yaml

from tests.deploy.tools import DEPLOY, SERVICES, load_yaml, run, tool

COMPOSE = DEPLOY / "compose.yaml"
GPU = DEPLOY / "compose.gpu.yaml"
PORTS = DEPLOY / "compose.ports.yaml"
TEST = DEPLOY / "compose.test.yaml"


def check_compose_schema(*paths) -> str:
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", *map(str, paths))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def merge(base, override):
    """Compose's merge of an override file, for mappings (what the GPU file overrides)."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in override.items()}}
    return override


def test_compose_files_validate():
    check_compose_schema(COMPOSE, GPU, PORTS, TEST)


def test_the_services_publish_no_fixed_host_port_so_they_scale():
    """`--scale tts=3` needs three host ports if tts publishes one; compose.ports.yaml publishes them instead."""
    compose, ports = load_yaml(COMPOSE), load_yaml(PORTS)
    for service, port in zip(SERVICES, (50051, 50052, 50053), strict=True):
        assert "ports" not in compose["services"][service]
        assert ports["services"][service]["ports"] == [f"{port}:{port}"]
    assert "ports" not in str(load_yaml(TEST))
    assert "name" not in compose, "docker-compose v1 rejects a top-level name (use -p)"


def test_merged_gpu_stack_validates_and_reserves_a_gpu_per_service(tmp_path):
    merged = merge(load_yaml(COMPOSE), load_yaml(GPU))
    (tmp_path / "merged.yaml").write_text(yaml.safe_dump(merged))
    check_compose_schema(tmp_path / "merged.yaml")
    for service in SERVICES:
        spec = merged["services"][service]
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert spec["build"]["args"]["DEVICE"] == "cuda" and spec["image"].endswith(":cuda")
        assert spec["environment"][f"{service.upper()}_DEVICE"] == "cuda"
        assert spec["build"]["dockerfile"] == "deploy/docker/Dockerfile" and spec["build"]["target"] == service


def test_the_schema_check_rejects_a_misspelt_key(tmp_path):
    broken = load_yaml(COMPOSE)
    broken["services"]["llm"]["imagee"] = broken["services"]["llm"].pop("image")
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(tmp_path / "broken.yaml"))
    assert result.returncode == 1 and "imagee" in result.stdout


def test_prometheus_scrapes_every_replica_of_each_compose_service_on_its_metrics_port():
    """DNS discovery: compose answers a service's name with one address per replica (`--scale tts=3`)."""
    compose = load_yaml(COMPOSE)
    config = load_yaml(DEPLOY / "monitoring" / "prometheus" / "prometheus.yml")
    discovery = {job["job_name"]: job.get("dns_sd_configs") for job in config["scrape_configs"]}
    for service, port in zip(SERVICES, (9091, 9092, 9093), strict=True):
        assert service in compose["services"]
        assert discovery[service] == [{"names": [service], "type": "A", "port": port, "refresh_interval": "5s"}]
    assert {"prometheus", "grafana"} <= set(compose["services"])
    assert all(compose["services"][name]["profiles"] == ["loadgen"] for name in ("locust-master", "locust-worker"))
