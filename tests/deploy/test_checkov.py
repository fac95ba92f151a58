"""checkov over deploy/: every overlay rendered alone, with every component and with tls, and every
Dockerfile, has zero
failed checks apart from the skips deploy/checkov.yaml lists with their reasons; and checkov does bite."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_llm_openai import with_component
from tests.deploy.test_tls_component import with_tls
from tests.deploy.tools import DEPLOY, K8S, OVERLAYS, REPO, kustomize, with_components

# Its python, not the bin/checkov script: a venv's scripts name the path it was built at in their #! line.
CHECKOV = REPO / ".venv" / "checkov" / "bin" / "python"
CONFIG = DEPLOY / "checkov.yaml"
# What a careless Deployment looks like: root, privileged, no probes, no limits.
CARELESS = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "careless", "namespace": "voiceagent"},
    "spec": {
        "selector": {"matchLabels": {"app": "careless"}},
        "template": {
            "metadata": {"labels": {"app": "careless"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.37", "securityContext": {"privileged": True}}]},
        },
    },
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, list[dict]]:
    """checkov's failed checks, by the folder (rendered/, careless/, docker/) of the file they are in."""
    assert CHECKOV.exists(), f"{CHECKOV} missing: run `make setup` (tools/install_deploy_tools.sh)"
    scratch = tmp_path_factory.mktemp("checkov")
    rendered, careless = scratch / "rendered", scratch / "careless"
    rendered.mkdir()
    careless.mkdir()
    for overlay in OVERLAYS:
        (rendered / f"{overlay}.yaml").write_text(yaml.safe_dump_all(kustomize(K8S / "overlays" / overlay)))
        components = kustomize(with_components(overlay, tmp_path_factory.mktemp(overlay)))
        (rendered / f"{overlay}+components.yaml").write_text(yaml.safe_dump_all(components))
        tls = with_tls(overlay, tmp_path_factory.mktemp(f"{overlay}-tls"))
        (rendered / f"{overlay}+tls.yaml").write_text(yaml.safe_dump_all(tls))
        openai = with_component(overlay, tmp_path_factory.mktemp(f"{overlay}-llm-openai"))
        (rendered / f"{overlay}+llm-openai.yaml").write_text(yaml.safe_dump_all(openai))
    (careless / "careless.yaml").write_text(yaml.safe_dump(CARELESS))
    images = (DEPLOY / "docker", DEPLOY / "monitoring" / "prometheus")  # the compose test's Prometheus image too
    folders = [arg for folder in (rendered, careless, *images) for arg in ("-d", str(folder))]
    command = [str(CHECKOV), "-m", "checkov.main", "--config-file", str(CONFIG), "--framework", "kubernetes",
               "dockerfile", *folders, "--output", "json", "--quiet"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode in (0, 1), result.stdout[-2000:] + result.stderr[-2000:]
    failed: dict[str, list[dict]] = {"rendered": [], "careless": [], "docker": []}
    for report in json_documents(result.stdout):
        for check in report.get("results", {}).get("failed_checks", []):
            path = Path(check["file_abs_path"] if "file_abs_path" in check else check["file_path"])
            folder = next(part for part in ("rendered", "careless", "docker", "prometheus") if part in path.parts)
            folder = "docker" if folder == "prometheus" else folder
            failed[folder].append(check)
    return failed


def json_documents(text: str) -> list[dict]:
    """checkov prints one JSON document per framework, or a list of them: every report, flattened."""
    decoder, reports, position = json.JSONDecoder(), [], 0
    while position < len(text.rstrip()):
        document, position = decoder.raw_decode(
            text, text.index(next(c for c in text[position:] if c in "[{"), position)
        )
        reports += document if isinstance(document, list) else [document]
    return reports


def describe(checks: list[dict]) -> str:
    return "\n".join(f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})" for c in checks)


def test_the_rendered_manifests_pass_every_check_not_skipped(results):
    assert not results["rendered"], describe(results["rendered"])


def test_the_dockerfiles_pass_every_check_not_skipped(results):
    assert not results["docker"], describe(results["docker"])


def test_checkov_bites_on_a_careless_deployment(results):
    failed = {check["check_id"] for check in results["careless"]}
    # privileged, no liveness/readiness probe, no resource limits, may run as root
    assert {"CKV_K8S_16", "CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_13", "CKV_K8S_23"} <= failed, sorted(failed)


def test_every_skip_has_its_reason():
    lines = CONFIG.read_text().splitlines()
    skips = [index for index, line in enumerate(lines) if line.strip().startswith("- CKV")]
    assert skips, "no skips listed"
    for index in skips:
        assert lines[index - 1].strip().startswith("#"), f"{lines[index].strip()}: no reason above it"
