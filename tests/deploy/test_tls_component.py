"""The tls component: every service gets the Secret's files as its TLS settings and probes that ask
grpc.health.v1 over mutual TLS through the image's health check; what renders passes kubernetes-validate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import validate

from tests.deploy.test_kubernetes import PORTS, by_kind
from tests.deploy.tools import K8S, KUBERNETES_VERSION, OVERLAYS, SERVICES, kustomize
from voiceagent.serving.config import ServingConfig

TLS = K8S / "components" / "tls"


def with_tls(overlay: str, scratch: Path, *others: str) -> list[dict]:
    """`overlay` with the tls component (after the components named in `others`), as a user's kustomization."""
    relative = lambda path: os.path.relpath(path, scratch)  # noqa: E731 — kustomize refuses absolute paths
    components = [*(relative(K8S / "components" / other) for other in others), relative(TLS)]
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "namespace": "voiceagent", "resources": [relative(K8S / "overlays" / overlay)],
                     "components": components}  # fmt: skip
    (scratch / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return kustomize(scratch)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tls_component_mounts_the_secret_names_it_in_settings_and_probes_over_tls(overlay, tmp_path):
    objects = with_tls(overlay, tmp_path, "llm-openai")  # one that sets the llm's env itself too
    for obj in objects:
        validate(obj, KUBERNETES_VERSION, strict=True)
    deployments, configmaps = by_kind(objects, "Deployment"), by_kind(objects, "ConfigMap")
    for service in SERVICES:
        pod = deployments[service]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        secrets = {volume["secret"]["secretName"] for volume in pod["volumes"] if "secret" in volume}
        assert secrets == ({"voiceagent-tls", "llm-upstream"} if service == "llm" else {"voiceagent-tls"})
        refs = [source["configMapRef"]["name"] for source in container["envFrom"]]
        assert f"{service}-tls-settings" in refs and all(ref in configmaps for ref in refs), refs
        settings = configmaps[f"{service}-tls-settings"]["data"]
        prefix = f"{service.upper()}_"
        fields = {key.removeprefix(prefix).lower() for key in settings if key.startswith(prefix)}
        assert fields == {"tls_cert", "tls_key", "tls_client_ca"} <= set(ServingConfig.__dataclass_fields__)
        assert settings["HEALTH_TLS_SERVER_NAME"] == service
        mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert all(os.path.dirname(path) in mounted for path in settings.values() if path.startswith("/"))
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert "grpc" not in container[probe] and command[-1] == f"127.0.0.1:{PORTS[service]}", (service, probe)
    llm = deployments["llm"]["spec"]["template"]["spec"]["containers"][0]
    # llm-openai's API key file survived the patch, beside the TLS files.
    assert "/etc/voiceagent/llm-upstream" in {mount["mountPath"] for mount in llm["volumeMounts"]}
