"""Rebuild the git-ignored bundles that the lent GPU's calls carry, here on the developers' machine (pip download
works here, nothing can be downloaded there). A fresh checkout has none of them; this makes them again:

    .venv/dev/bin/python -m results.h200.bundles whl          # .whl: NeMo 3.0 + VoxCPM 2.0.3 + grpcio & co. + py-spy
    .venv/dev/bin/python -m results.h200.bundles lg           # .lg: Locust & co., what `vllm serve` adds to the bundle
    .venv/dev/bin/python -m results.h200.bundles vllm         # .vllm_h200: vLLM 0.26.0 in parts (llm.sh pack)
    .venv/dev/bin/python -m results.h200.bundles base REV     # .base: `git archive REV` + this tree's gRPC stubs
    .venv/dev/bin/python -m results.h200.bundles check .whl   # every Requires-Dist met by the bundle or the image?

Versions come from the virtualenvs `make setup` builds and the tests run in (.venv/asr, .venv/tts, .venv/dev,
.venv/llm), so the device gets what was tested here, built for the device's Python 3.12 (cp312 manylinux). The
names are those the earlier bundles held (results/h200/README.md; ../shared/ENGINE_NOTES.md "lent H200"): only
what the image lacks of each engine's import graph, installed there with --no-deps into /tmp/site. `.whl` serves
the ASR stages too (`WHL=.whl`; earlier sessions carried the same wheels as `.asrwhl`).

`check` reads each wheel's METADATA and lists the requirements (Python 3.12 on Linux, no extras) that neither the
bundle nor the image's package list (the device library's KINDS.md, "Python packages already there") meets: a
lead, not a verdict (NeMo declares far more than its ASR import graph needs; `.lg` rides with the vLLM bundle,
which holds fastapi, starlette and pydantic).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
PLATFORMS = [
    "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64",
    "--platform", "any",
]  # fmt: skip
# What the engines import that the image lacks (the image has torch, torchaudio, transformers, numpy, scipy,
# lightning-utilities, ...: IMAGE below). lightning 2.4.0 replaces the image's newer lightning, which breaks
# nv-one-logger's Trainer subclass at import.
NEMO = """nemo-toolkit lightning hydra-core omegaconf antlr4-python3-runtime lhotse librosa soundfile cffi pycparser
audioread soxr pooch decorator kaldialign braceexpand webdataset datasets dill multiprocess cytoolz intervaltree
strenum overrides toml googleapis-common-protos nv-one-logger-core nv-one-logger-training-telemetry
nv-one-logger-pytorch-lightning-integration pydantic pydantic-core annotated-types typing-inspection platformdirs"""
VOXCPM = "voxcpm"
SERVING = "grpcio grpcio-health-checking grpcio-reflection protobuf pytest-asyncio setproctitle"
PROFILER = "py-spy==0.4.1"  # not in any venv here: the version the ASR splits ran with
LOCUST = """locust gevent geventhttpclient greenlet flask flask-cors flask-login werkzeug itsdangerous blinker pyzmq
zope-event zope-interface brotli configargparse python-engineio python-socketio bidict simple-websocket wsproto"""
VLLM_SERVE = """uvicorn prometheus-fastapi-instrumentator partial-json-parser watchfiles
model-hosting-container-standards jmespath supervisor opentelemetry-api"""
SDIST_ONLY = {"antlr4-python3-runtime"}  # no wheel on PyPI: built here (pure Python)
# The device image's packages, names only (KINDS.md's list, in a file of its own).
IMAGE = {
    canonicalize_name(line)
    for line in (Path(__file__).with_name("image_packages.txt")).read_text().splitlines()
    if line and not line.startswith("#")
}
ENVIRONMENT = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip


def tested_versions(*venvs: str) -> dict[str, str]:
    """Package -> version as installed in this checkout's virtualenvs (the first venv that has it wins)."""
    versions: dict[str, str] = {}
    for venv in venvs:
        python = ROOT / ".venv" / venv / "bin" / "python"
        if not python.exists():
            sys.exit(f"{python} is missing: run `make setup` first (the versions come from the tested venvs)")
        frozen = subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
        for line in frozen.splitlines():
            if "==" in line:
                name, version = line.split("==", 1)
                versions.setdefault(canonicalize_name(name), version.strip())
    return versions


def pins(names: str, versions: dict[str, str]) -> list[str]:
    out = []
    for name in names.split():
        if "==" in name:
            out.append(name)
            continue
        version = versions.get(canonicalize_name(name))
        if version is None:
            sys.exit(f"{name}: not installed in the venvs this bundle is pinned from")
        out.append(f"{name}=={version}")
    return out


def download(requirements: list[str], dest: Path) -> None:
    """cp312 manylinux wheels of `requirements` (no dependencies) into a fresh `dest`; sdist-only ones built here."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    wheels = [r for r in requirements if canonicalize_name(Requirement(r).name) not in SDIST_ONLY]
    built = [r for r in requirements if r not in wheels]
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", *PLATFORMS, "-d", dest, *wheels], check=True)
    if built:
        subprocess.run([*pip, "wheel", "--no-deps", "-w", dest, *built], check=True)
    size = sum(path.stat().st_size for path in dest.glob("*.whl")) / 2**20
    print(f"{dest.relative_to(ROOT)}: {len(list(dest.glob('*.whl')))} wheels, {size:.1f} MiB (carry limit 64 MiB)")


def unmet(bundle: Path) -> list[str]:
    """Requirements of the bundle's wheels met neither by the bundle (name and version) nor by the image (name)."""
    have = {}
    for wheel in bundle.glob("*.whl"):
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
        have[name] = version
    missing = []
    for wheel in sorted(bundle.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            text = archive.read(metadata).decode()
        for line in re.findall(r"^Requires-Dist: (.+)$", text, flags=re.M):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(ENVIRONMENT):
                continue
            name = canonicalize_name(requirement.name)
            if name in have and (not requirement.specifier or requirement.specifier.contains(have[name], True)):
                continue
            if name in IMAGE and name not in have:
                continue
            found = f"bundle has {have[name]}" if name in have else "not in the bundle or the image"
            missing.append(f"{wheel.name.split('-')[0]}: {requirement} ({found})")
    return missing


def base(rev: str, dest: Path) -> None:
    """What a build of `rev` runs (services/, voiceagent/; asr_compare starts its services from there), with this
    tree's generated stubs (voiceagent/v1 is generated, not committed)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir()
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "services", "voiceagent"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    stubs = dest / "voiceagent" / "v1"
    stubs.mkdir(parents=True, exist_ok=True)
    for stub in (ROOT / "voiceagent" / "v1").glob("*.py*"):
        shutil.copy2(stub, stubs / stub.name)
    print(f"{dest.relative_to(ROOT)}: {rev} with the stubs")


def vllm(dest: Path) -> None:
    """vLLM 0.26.0's wheel (~330 MB) packed into parts by llm.sh (new parts: new checksums in vllm026.sha256)."""
    with tempfile.TemporaryDirectory() as stage:
        subprocess.run(
            [sys.executable, "-m", "pip", "-q", "download", "--no-deps", "--only-binary=:all:", *PLATFORMS,
             "-d", stage, "vllm==0.26.0"],
            check=True,
        )  # fmt: skip
        (wheel,) = Path(stage).glob("vllm-*.whl")
        subprocess.run(["bash", ROOT / "results/h200/llm.sh", "pack", wheel, dest], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", choices=["whl", "lg", "vllm", "base", "check"])
    parser.add_argument("arg", nargs="?", help="base: the revision (default HEAD); check: the folder")
    parser.add_argument("--dest", help="the folder to (re)make (default: .whl, .lg, .vllm_h200, .base)")
    args = parser.parse_args()
    default = {"whl": ".whl", "lg": ".lg", "vllm": ".vllm_h200", "base": ".base"}
    dest = ROOT / (args.dest or default.get(args.bundle, ""))
    if args.bundle == "whl":
        versions = tested_versions("asr", "tts")
        download(pins(f"{NEMO} {VOXCPM} {SERVING}", versions) + [PROFILER], dest)
    elif args.bundle == "lg":
        download(pins(f"{LOCUST} {VLLM_SERVE}", tested_versions("dev", "llm")), dest)
    elif args.bundle == "vllm":
        vllm(dest)
    elif args.bundle == "base":
        base(args.arg or "HEAD", dest)
    if args.bundle in ("whl", "lg", "check"):
        folder = ROOT / args.arg if args.bundle == "check" else dest
        missing = unmet(folder)
        print(f"{len(missing)} requirement(s) met neither by {folder.name} nor by the image:", *missing, sep="\n  ")


if __name__ == "__main__":
    main()
