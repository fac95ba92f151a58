"""The LLM swapped for another OpenAI-compatible server: the compose override and the kustomize component
validate, change the LLM service alone, and give it settings its own config loader accepts (the openai
backend). tests/llm/test_openai_backend.py runs the service with the override's settings against `vllm serve`."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from kubernetes_validate import validate

from tests.deploy.test_compose import COMPOSE, GPU, check_compose_schema, merge
from tests.deploy.test_settings import LOAD, resolve
from tests.deploy.tools import DEPLOY, K8S, KUBERNETES_VERSION, OVERLAYS, kustomize, load_yaml, run
from tests.harness import venv_python

OVERRIDE = DEPLOY / "compose.llm-openai.yaml"
COMPONENT = K8S / "components" / "llm-openai"


def llm_config(environ: dict[str, str]) -> dict:
    """The LLM service's config built by its own loader (in its environment) from `environ`."""
    result = run(venv_python("llm"), "-c", LOAD, "llm", json.dumps(environ), timeout_s=120)
    assert result.returncode == 0, f"the LLM service rejects its settings:\n{result.stderr[-2000:]}"
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded["unknown"], f"the LLM service has no settings {loaded['unknown']}"
    return loaded["config"]


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_the_compose_override_changes_only_the_llm_and_configures_the_openai_backend(tmp_path, gpu):
    base = merge(load_yaml(COMPOSE), load_yaml(GPU)) if gpu else load_yaml(COMPOSE)
    check_compose_schema(OVERRIDE)
    merged = merge(base, load_yaml(OVERRIDE))
    (tmp_path / "merged.yaml").write_text(yaml.safe_dump(merged))
    check_compose_schema(tmp_path / "merged.yaml")
    assert {name: spec for name, spec in merged["services"].items() if name != "llm"} == {
        name: spec for name, spec in base["services"].items() if name != "llm"
    }
    llm = merged["services"]["llm"]
    assert llm["image"] == base["services"]["llm"]["image"] and "ports" not in llm
    (secret,) = llm["secrets"]
    assert merged["secrets"][secret]["file"] == "${VOICEAGENT_LLM_API_KEY_FILE:-/dev/null}"
    environ = {name: resolve(value) for name, value in llm["environment"].items()}
    config = llm_config(environ)
    assert config["backend"] == "openai" and config["upstream_url"] == "http://host.docker.internal:8000/v1"
    assert config["upstream_api_key_file"] == f"/run/secrets/{secret}"
    assert config["probe_ceilings"] is False, "a remote engine's device is not probed on this machine"


def with_component(overlay: str, scratch) -> list[dict]:
    relative = lambda path: os.path.relpath(path, scratch)  # kustomize refuses absolute paths
    (scratch / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [relative(K8S / "overlays" / overlay)],
                "components": [relative(COMPONENT)],
            }
        )
    )
    return kustomize(scratch)


def keyed(objects: list[dict]) -> dict[tuple[str, str], dict]:
    """Objects by kind and name, the generated ConfigMaps' hash suffixes dropped (their content differs)."""
    keys = {}
    for obj in objects:
        name = obj["metadata"]["name"]
        keys[(obj["kind"], name.rsplit("-", 1)[0] if obj["kind"] == "ConfigMap" else name)] = obj
    return keys


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kustomize_component_changes_only_the_llm_and_configures_the_openai_backend(tmp_path, overlay):
    swapped, original = keyed(with_component(overlay, tmp_path)), keyed(kustomize(K8S / "overlays" / overlay))
    for obj in swapped.values():
        validate(obj, KUBERNETES_VERSION, strict=True)
    changed = {key for key in original if swapped[key] != original[key]}
    assert set(swapped) == set(original)
    assert changed == {("ConfigMap", "llm-settings"), ("Deployment", "llm")}, changed
    settings = swapped[("ConfigMap", "llm-settings")]["data"]
    assert {k: v for k, v in original[("ConfigMap", "llm-settings")]["data"].items()}.items() <= settings.items()
    config = llm_config(settings)
    assert config["backend"] == "openai" and config["upstream_url"].startswith("http://")
    assert config["host"] == "0.0.0.0" and config["port"] == 50052
    pod = swapped[("Deployment", "llm")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # The API key is a file from the Secret (checkov CKV_K8S_35), never an environment variable.
    assert not any("secretKeyRef" in str(var) for var in container.get("env", [])), container["env"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "llm-upstream"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "llm-upstream"]
    assert mount["readOnly"] and volume["secret"]["secretName"] == "llm-upstream"
    assert not volume["secret"].get("optional"), "a missing Secret must stop the pod, not start it keyless"
    (item,) = volume["secret"]["items"]
    assert config["upstream_api_key_file"] == f"{mount['mountPath']}/{item['path']}" and item["key"] == "api-key"
    assert "nvidia.com/gpu" not in container["resources"]["limits"], "no engine here: no GPU"
    assert container["readinessProbe"]["grpc"]["port"] == 50052
