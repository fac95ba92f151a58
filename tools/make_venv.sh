#!/usr/bin/env bash
# make_venv.sh NAME REQUIREMENTS: build .venv/NAME from a requirements file, idempotently.
# A stamp holding the hash of the inputs makes a second run a no-op; changed inputs rebuild the venv.
# An executable post_install.sh beside the requirements file runs afterwards with the venv's python
# (post_install-cuda.sh for requirements-cuda.txt).
set -euo pipefail
name=$1 requirements=$2
python=${PYTHON:-python3.11}
venv=.venv/$name
variant=$(basename "$requirements" .txt)
hook=$(dirname "$requirements")/post_install${variant#requirements}.sh
hooks=$([ -f "$hook" ] && echo "$hook" || true)
inputs=$(cat "$requirements" requirements/serving.txt $hooks | sha256sum | cut -d' ' -f1)
if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$inputs" ]; then
    echo "venv $name: up to date"
    exit 0
fi
start=$(date +%s)
echo "venv $name: building from $requirements ..."
rm -rf "$venv"
"$python" -m venv "$venv"
log=$(mktemp)
# The machine's local wheel mirrors print one warning per package they lack; keep the log readable.
if ! "$venv/bin/python" -m pip install -q -r "$requirements" >"$log" 2>&1; then
    grep -v "is ignored" "$log"
    echo "venv $name: pip install failed" >&2
    exit 1
fi
grep -v "is ignored" "$log" || true
rm -f "$log"
if [ -x "$hook" ]; then "$hook" "$venv/bin/python"; fi
echo "$inputs" > "$venv/.stamp"
echo "venv $name: built in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
