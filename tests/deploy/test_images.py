"""The images' Dockerfile (one stage per image on a shared runtime stage) passes hadolint and copies only what
exists; service images run non-root, generate their protos, speak grpc.health.v1 in HEALTHCHECK and listen where
compose and Kubernetes expect them."""

from __future__ import annotations

import glob
import re

import pytest

from tests.deploy.tools import DEPLOY, REPO, SERVICES, run, tool

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
IMAGES = (*SERVICES, "loadgen")
PORTS = {"asr": (50051, 9091), "llm": (50052, 9092), "tts": (50053, 9093)}


def instructions(dockerfile) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def stage(name: str, dockerfile=DOCKERFILE) -> list[tuple[str, str]]:
    """The instructions of one named stage (its FROM ... AS name up to the next FROM)."""
    steps = instructions(dockerfile)
    start = next(i for i, (op, args) in enumerate(steps) if op == "FROM" and args.endswith(f" AS {name}"))
    end = next((i for i in range(start + 1, len(steps)) if steps[i][0] == "FROM"), len(steps))
    return steps[start:end]


def test_there_is_an_image_per_service_and_one_for_the_load_generator_all_on_the_runtime_stage():
    """One stage per image, each FROM runtime (torch + the serving requirements, built once for all of them)."""
    assert len(list((DEPLOY / "docker").rglob("Dockerfile"))) == 1, "the images share one Dockerfile"
    images = {args.split(" AS ")[1]: args.split(" AS ")[0] for op, args in instructions(DOCKERFILE) if op == "FROM"}
    assert {name: images.get(name) for name in IMAGES} == {name: "runtime" for name in IMAGES}
    assert any("requirements/runtime.txt" in args for _, args in stage("runtime"))


def test_cuda_images_carry_the_c_compiler_triton_builds_its_launcher_with():
    """Triton compiles its CUDA launcher (driver.c) at run time: a CUDA image without a C compiler cannot start vLLM's
    compiled engine ("Failed to find C compiler") nor compile the TTS step. CPU images need none."""
    installs = [args for op, args in stage("runtime") if op == "RUN" and "apt-get install" in args]
    assert any(
        args.startswith('if [ "$DEVICE" = "cuda" ]; then') and re.search(r"\sgcc=\S+", args) and "libc6-dev=" in args
        for args in installs
    ), installs


# The compose test's own images: the local stand-in for python:3.11-slim and Prometheus from Debian.
LOCAL_IMAGES = [DEPLOY / "base-image" / "Dockerfile", DEPLOY / "monitoring" / "prometheus" / "Dockerfile"]


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, *LOCAL_IMAGES], ids=lambda path: path.parent.name)
def test_hadolint_passes(dockerfile):
    result = run(tool("hadolint"), str(dockerfile))
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_copied_files_exist_and_are_not_ignored(dockerfile=DOCKERFILE):
    ignore = dockerfile.with_name("Dockerfile.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    for instruction, arguments in instructions(dockerfile):
        if instruction != "COPY" or arguments.startswith("--from"):
            continue
        *sources, _ = arguments.split()
        # A glob source (post_install.s[h]) is optional; every plain one must exist.
        matched = [source for source in sources if glob.glob(str(REPO / source))]
        missing = [source for source in sources if source not in matched and not glob.has_magic(source)]
        assert not missing, f"{dockerfile}: COPY {arguments}: {missing} do not exist"
        for source in matched:
            assert any(source.startswith(prefix) for prefix in allowed), f"{source} is excluded by .dockerignore"
    # RUN --mount=type=bind sources (the wheelhouse) are read from the context too.
    for source in re.findall(r"--mount=type=bind,source=([^, ]+)", dockerfile.read_text()):
        assert (REPO / source).is_dir(), f"{dockerfile}: mounted {source} does not exist"
        assert any(source.startswith(prefix) for prefix in allowed), f"{source} is excluded by .dockerignore"


def test_every_pip_install_can_come_from_the_wheelhouse(dockerfile=DOCKERFILE):
    """Each stage that runs pip mounts deploy/docker/wheelhouse and turns offline when it holds wheels."""
    for instruction, arguments in instructions(dockerfile):
        if instruction == "RUN" and "pip install" in arguments:
            assert arguments.startswith("--mount=type=bind,source=deploy/docker/wheelhouse,target=/wheelhouse")
            assert "PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse" in arguments
    assert "syntax=" not in dockerfile.read_text(), "a syntax line pulls a frontend image from Docker Hub"


@pytest.mark.parametrize("service", SERVICES)
def test_service_image_runs_non_root_with_a_grpc_health_check(service):
    steps = stage(service)
    text = "\n".join(f"{i} {a}" for i, a in steps)
    grpc_port, metrics_port = PORTS[service]
    prefix = service.upper()
    assert [a for i, a in steps if i == "USER"] == ["10001"]
    assert "COPY --from=protos /src/voiceagent/v1/ voiceagent/v1/" in text, "protos must be generated in the build"
    assert any("grpc_tools.protoc" in args for op, args in stage("protos") if op == "RUN")
    assert re.search(rf"HEALTHCHECK .*grpc_health_check\.py 127\.0\.0\.1:\${{{prefix}_PORT}}", text)
    assert f"{prefix}_HOST=0.0.0.0" in text
    assert f"{prefix}_PORT={grpc_port}" in text and f"{prefix}_METRICS_PORT={metrics_port}" in text
    assert [a for i, a in steps if i == "ENTRYPOINT"] == [f'["python", "-m", "services.{service}"]']
    assert not re.search(r"\.(safetensors|nemo|bin|pt|ckpt)\b", text), "weights are mounted, never baked in"


def test_hadolint_rejects_an_unpinned_root_image(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:latest\nRUN apt-get install curl\n")
    result = run(tool("hadolint"), str(dockerfile))
    assert result.returncode == 1 and "DL3007" in result.stdout and "DL3008" in result.stdout, result.stdout


def test_the_runtime_torch_is_the_one_every_environment_pins():
    def torch_pin(path) -> str:
        return next(line.split("#")[0].strip() for line in path.read_text().splitlines() if line.startswith("torch=="))

    runtime = torch_pin(REPO / "requirements" / "runtime.txt")
    for path in (
        REPO / "requirements" / "dev.txt",
        *(REPO / "services" / s / "requirements.txt" for s in ("asr", "tts")),
    ):
        assert torch_pin(path) == runtime, path
