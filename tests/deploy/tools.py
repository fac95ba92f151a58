"""The validation tools tests/deploy drives, and the deploy/ files they read.

kubectl (kustomize), kubernetes-validate, hadolint and check-jsonschema come from PyPI into the dev
environment; promtool, prometheus and the CRD schemas from tools/install_deploy_tools.sh (`make setup`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
SERVICES = ("asr", "llm", "tts")
OVERLAYS = ("cpu", "gpu")
# Kustomize components: add-ons any overlay can take.
COMPONENTS = (
    DEPLOY / "monitoring",
    K8S / "components" / "autoscaling",
    K8S / "components" / "locust",
    K8S / "components" / "grpc-gateway",
)
CRD_MODULES = REPO / ".venv" / "deploy-tools" / "node_modules"
KUBERNETES_VERSION = "1.37.0"


def tool(name: str) -> str:
    """A tool of the dev environment (beside this interpreter) or, failing that, of the system."""
    path = Path(sys.executable).parent / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} missing: run `make setup` (tools/install_deploy_tools.sh)")
    return found


def run(*command: str, stdin: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize DIRECTORY` as a list of objects; fails the test with kustomize's own message."""
    result = run(tool("kubectl"), "kustomize", str(directory))
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def with_components(overlay: str, scratch: Path) -> Path:
    """A kustomization as a user writes one: an overlay plus every add-on component, in the app namespace."""
    relative = lambda path: os.path.relpath(path, scratch)  # kustomize refuses absolute paths
    (scratch / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "voiceagent",
                "resources": [relative(K8S / "overlays" / overlay)],
                "components": [relative(component) for component in COMPONENTS],
            }
        )
    )
    return scratch


def validate_custom_resources(objects: list[dict]) -> subprocess.CompletedProcess:
    """Check Prometheus Operator objects against the operator's published CRD schemas (an npm package)."""
    assert (CRD_MODULES / "@kubernetes-models" / "prometheus-operator").is_dir(), (
        "CRD schemas missing: run tools/install_deploy_tools.sh"
    )
    script = Path(__file__).with_name("validate_crds.mjs")
    return run("node", str(script), str(CRD_MODULES), stdin=json.dumps(objects))


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())
