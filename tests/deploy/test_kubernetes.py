"""Every overlay renders with `kubectl kustomize`, and what it renders passes kubernetes-validate (strict,
built-in kinds) or the Prometheus Operator's published CRD schemas (ServiceMonitor)."""

from __future__ import annotations

import copy

import pytest
from kubernetes_validate import validate
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

from tests.deploy.tools import (
    K8S,
    KUBERNETES_VERSION,
    OVERLAYS,
    SERVICES,
    kustomize,
    validate_custom_resources,
    with_components,
)

PORTS = {"asr": 50051, "llm": 50052, "tts": 50053}


RENDERINGS = [*OVERLAYS, *(f"{overlay}+components" for overlay in OVERLAYS)]


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, list[dict]]:
    """Every overlay alone and with every add-on component, rendered once for the module."""
    rendered = {overlay: kustomize(K8S / "overlays" / overlay) for overlay in OVERLAYS}
    for overlay in OVERLAYS:
        scratch = tmp_path_factory.mktemp(overlay)
        rendered[f"{overlay}+components"] = kustomize(with_components(overlay, scratch))
    return rendered


@pytest.fixture(params=RENDERINGS)
def rendered(request, renders) -> tuple[str, list[dict]]:
    return request.param, renders[request.param]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_object_validates(rendered):
    name, objects = rendered
    custom, errors = [], []
    for obj in objects:
        try:
            validate(obj, KUBERNETES_VERSION, strict=True)
        except SchemaNotFoundError:
            custom.append(obj)
        except Exception as error:  # noqa: BLE001 — collect every failure, not just the first
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error}")
    assert not errors, "\n".join(errors)
    assert {o["kind"] for o in custom} <= {"ServiceMonitor", "PodMonitor"}, "a kind no schema covers"
    if custom:
        result = validate_custom_resources(custom)
        assert result.returncode == 0, result.stdout + result.stderr
    assert ("ServiceMonitor" in {o["kind"] for o in custom}) == name.endswith("+components")


def test_services_have_grpc_probes_resources_and_a_locked_down_context(rendered):
    _, objects = rendered
    deployments = by_kind(objects, "Deployment")
    for service in SERVICES:
        pod = deployments[service]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"]["port"] == PORTS[service], (service, probe)
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        settings = container["envFrom"][0]["configMapRef"]["name"]
        assert settings in by_kind(objects, "ConfigMap"), f"{service}: settings ConfigMap {settings} not rendered"
        ports = {p["name"]: p["port"] for p in by_kind(objects, "Service")[service]["spec"]["ports"]}
        assert ports["grpc"] == PORTS[service]


def test_gpu_overlay_requests_gpus_and_switches_presets(rendered):
    name, objects = rendered
    gpu = name.startswith("gpu")
    configmaps = by_kind(objects, "ConfigMap")
    for service, deployment in by_kind(objects, "Deployment").items():
        if service not in SERVICES:
            continue
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert ("nvidia.com/gpu" in container["resources"]["limits"]) == gpu
        assert container["image"].endswith(":cuda" if gpu else ":cpu")
        tolerations = [t["key"] for t in pod.get("tolerations", [])]
        assert ("nvidia.com/gpu" in tolerations) == gpu
        settings = configmaps[container["envFrom"][0]["configMapRef"]["name"]]["data"]
        assert settings[f"{service.upper()}_DEVICE"] == ("cuda" if gpu else "cpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_add_monitoring_autoscaling_and_distributed_locust(renders, overlay):
    objects = renders[f"{overlay}+components"]
    assert set(by_kind(objects, "HorizontalPodAutoscaler")) == set(SERVICES)
    dashboard = by_kind(objects, "ConfigMap")["voiceagent-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "voiceagent.json" in dashboard["data"]
    deployments = by_kind(objects, "Deployment")
    assert {"locust-master", "locust-worker"} <= set(deployments)
    assert all(o["metadata"].get("namespace") == "voiceagent" for o in objects if o["kind"] != "Namespace")


def test_the_validators_reject_mistakes(renders):
    """Both checks bite: a misspelt field (strict schema) and a wrongly typed ServiceMonitor port (CRD schema)."""
    objects = renders["cpu+components"]
    deployment = copy.deepcopy(by_kind(objects, "Deployment")["llm"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbee"] = {}
    with pytest.raises(ValidationError, match="readinessProbee"):
        validate(deployment, KUBERNETES_VERSION, strict=True)
    monitor = copy.deepcopy(by_kind(objects, "ServiceMonitor")["voiceagent"])
    monitor["spec"]["endpoints"][0]["port"] = 9092
    result = validate_custom_resources([monitor])
    assert result.returncode == 1 and "port must be string" in result.stdout, result.stdout
