"""Load across replicas and locked-down pods in what the overlays render: headless Services for client-side
round_robin, the Envoy gateway (the L7 alternative) pointed at them, NetworkPolicies, PodDisruptionBudgets,
security contexts and termination grace above the services' drain grace."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.test_kubernetes import PORTS, by_kind, renders  # noqa: F401 — the module's rendering fixture
from tests.deploy.tools import K8S, OVERLAYS, SERVICES
from voiceagent.serving.config import ServingConfig

METRICS_PORTS = {"asr": 9091, "llm": 9092, "tts": 9093}
RENDERINGS = [*OVERLAYS, *(f"{overlay}+components" for overlay in OVERLAYS)]


@pytest.mark.parametrize("name", RENDERINGS)
def test_service_pods_are_locked_down(renders, name):  # noqa: F811
    objects = renders[name]
    deployments, configmaps = by_kind(objects, "Deployment"), by_kind(objects, "ConfigMap")
    for service in SERVICES:
        pod = deployments[service]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        (container,) = pod["containers"]
        context = container["securityContext"]
        assert context["capabilities"]["drop"] == ["ALL"] and context["readOnlyRootFilesystem"] is True
        mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
        empty_dirs = {volume["name"] for volume in pod["volumes"] if "emptyDir" in volume}
        assert "/tmp" in mounted and empty_dirs, f"{service}: no writable tmp/cache volumes"
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        settings = configmaps[container["envFrom"][0]["configMapRef"]["name"]]["data"]
        drain_s = float(settings.get(f"{service.upper()}_GRACE_S", ServingConfig.grace_s))
        assert pod["terminationGracePeriodSeconds"] > drain_s + 5, f"{service}: SIGKILL before the drain ends"


@pytest.mark.parametrize("name", RENDERINGS)
def test_grpc_services_are_headless_and_every_service_has_a_disruption_budget(renders, name):  # noqa: F811
    objects = renders[name]
    services, budgets = by_kind(objects, "Service"), by_kind(objects, "PodDisruptionBudget")
    for service in SERVICES:
        assert services[service]["spec"]["clusterIP"] == "None", f"{service}: DNS must return every pod"
        ports = {port["name"]: port["port"] for port in services[service]["spec"]["ports"]}
        assert ports == {"grpc": PORTS[service], "metrics": METRICS_PORTS[service]}
        assert budgets[service]["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": service}
        assert budgets[service]["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("name", RENDERINGS)
def test_network_policies_let_the_namespace_reach_grpc_and_only_prometheus_reach_metrics(renders, name):  # noqa: F811
    policies = by_kind(renders[name], "NetworkPolicy")
    for service in SERVICES:
        policy = policies[service]["spec"]
        assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": service}
        assert policy["policyTypes"] == ["Ingress"]
        rules = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
        assert set(rules) == {PORTS[service], METRICS_PORTS[service]}  # nothing else is open
        assert rules[PORTS[service]] == [{"podSelector": {}}]  # any pod of this namespace, none from outside
        (scraper,) = rules[METRICS_PORTS[service]]
        assert scraper["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_the_gateway_balances_each_service_over_its_headless_service(renders):  # noqa: F811
    objects = renders["cpu+components"]
    config = yaml.safe_load((K8S / "components" / "grpc-gateway" / "envoy.yaml").read_text())
    listeners = {listener["name"]: listener for listener in config["static_resources"]["listeners"]}
    clusters = {cluster["name"]: cluster for cluster in config["static_resources"]["clusters"]}
    gateway = by_kind(objects, "Service")["voiceagent-gateway"]
    gateway_ports = {port["name"]: port["port"] for port in gateway["spec"]["ports"]}
    for service in SERVICES:
        assert listeners[service]["address"]["socket_address"]["port_value"] == PORTS[service] == gateway_ports[service]
        manager = listeners[service]["filter_chains"][0]["filters"][0]["typed_config"]
        assert manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["cluster"] == service
        cluster = clusters[service]
        assert cluster["type"] == "STRICT_DNS" and "grpc_health_check" in cluster["health_checks"][0]
        options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        assert "http2_protocol_options" in options["explicit_http_config"]
        (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert (address["address"], address["port_value"]) == (service, PORTS[service])  # the headless Service
    assert any(name.startswith("voiceagent-gateway-") for name in by_kind(objects, "ConfigMap"))  # envoy.yaml
