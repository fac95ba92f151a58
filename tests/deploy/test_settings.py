"""Every setting the deployments give a service is one of that service's settings with a valid value: each
service's own config loader (in its own environment) builds its config from the compose and Kubernetes
environments, so a renamed setting or a missing preset fails here, not at 3 a.m. in a pod."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.test_compose import COMPOSE, GPU, merge
from tests.deploy.tools import K8S, OVERLAYS, SERVICES, kustomize, load_yaml, run
from tests.harness import venv_python

LOAD = """
import dataclasses, json, sys
from voiceagent.serving.config import ServingConfig, env_name, load_config
module = __import__(f"services.{sys.argv[1]}.config", fromlist=["config"])
(cls,) = {v for v in vars(module).values()
          if isinstance(v, type) and issubclass(v, ServingConfig) and v.__module__ == module.__name__}
environ = json.loads(sys.argv[2])
known = {env_name(sys.argv[1], f.name) for f in dataclasses.fields(cls)}
unknown = sorted(name for name in environ if name not in known)
config = load_config(cls, sys.argv[1].upper(), [], environ)
print(json.dumps({"unknown": unknown, "config": dataclasses.asdict(config)}, default=str))
"""


def resolve(value) -> str:
    """Compose interpolation as compose does it with an empty environment: ${NAME:-default} -> default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def deployments() -> dict[str, dict[str, dict[str, str]]]:
    """deployment name -> service -> the environment it sets for that service."""
    compose, gpu = load_yaml(COMPOSE), merge(load_yaml(COMPOSE), load_yaml(GPU))
    result = {
        "compose": {s: {k: resolve(v) for k, v in compose["services"][s]["environment"].items()} for s in SERVICES},
        "compose+gpu": {s: {k: resolve(v) for k, v in gpu["services"][s]["environment"].items()} for s in SERVICES},
    }
    for overlay in OVERLAYS:
        objects = kustomize(K8S / "overlays" / overlay)
        configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
        result[f"k8s/{overlay}"] = {
            o["metadata"]["name"]: configmaps[o["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]
                                              ["configMapRef"]["name"]]
            for o in objects
            if o["kind"] == "Deployment"
        }  # fmt: skip
    return result


@pytest.fixture(scope="module")
def environments():
    return deployments()


@pytest.mark.parametrize("service", SERVICES)
def test_each_deployment_configures_the_service_validly(environments, service):
    for name, services in environments.items():
        environ = services[service]
        result = run(venv_python(service), "-c", LOAD, service, json.dumps(environ), timeout_s=120)
        assert result.returncode == 0, f"{name}: {service} rejects its settings:\n{result.stderr[-2000:]}"
        loaded = json.loads(result.stdout.strip().splitlines()[-1])
        assert not loaded["unknown"], f"{name}: {service} has no settings {loaded['unknown']}"
        config = loaded["config"]
        assert config["device"] == ("cuda" if "gpu" in name else "cpu"), name
        if name.startswith("k8s"):  # in compose the image sets the host
            assert config["host"] == "0.0.0.0", name
