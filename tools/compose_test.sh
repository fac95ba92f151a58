#!/usr/bin/env bash
# `make compose-test`: build the images for real and run the compose stack (deploy/README.md, "make compose-test").
#   1. a container engine: Debian's docker.io and docker-compose (v1), installed with apt and dockerd started
#      when missing (as on a fresh CI machine; says so);
#   2. a base image made here, as no image registry is reachable: debootstrap's Debian bookworm, imported, then
#      deploy/base-image/Dockerfile (Python 3.11, this machine's CA bundle) -> $BASE_IMAGE;
#   3. a wheelhouse filled once with `pip wheel` from this machine's pip configuration (its CPU torch wheel) ->
#      deploy/docker/wheelhouse/, so the builds install offline and never resolve CUDA torch;
#   4. the four images (asr, llm, tts on CPU; loadgen) with PYTHON_IMAGE=$BASE_IMAGE, and Prometheus from
#      Debian's package: the runtime stage they share (torch + serving requirements) first, then the others one
#      after another (Debian's dockerd 20.10 can crash when builds of one context run at once, see images());
#      docker's layer cache makes a second run rebuild only what changed;
#   5. tests/compose (pytest): the stack up, health, a sweep from the loadgen container, Prometheus targets and
#      dashboard queries, three TTS replicas behind dns:/// round_robin, down.
# Every step is timed; `COMPOSE_TEST_STEPS="engine base wheels images"` runs a subset (tools/test.sh runs all).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_IMAGE=${BASE_IMAGE:-voiceagent-local/python:3.11-bookworm}
DEBIAN_IMAGE=${DEBIAN_IMAGE:-voiceagent-local/debian:bookworm}
WHEELHOUSE=deploy/docker/wheelhouse
STEPS=${COMPOSE_TEST_STEPS:-engine base wheels images test}
export DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1
DOCKER=/usr/bin/docker  # Debian's 20.10 CLI (a newer one elsewhere on PATH may want buildx)
declare -a timings=()

timed() {  # timed NAME COMMAND...: run one step and record how long it took
    local name=$1 start
    shift
    start=$(date +%s)
    echo "--- compose-test: $name"
    "$@"
    timings+=("$(printf '%-8s %5d s' "$name" $(( $(date +%s) - start )))")
}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

engine() {
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! command -v debootstrap >/dev/null; then
        echo "compose-test: no container engine here: installing Debian's docker.io, docker-compose, debootstrap"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose debootstrap
    fi
    start_dockerd
    $DOCKER info --format 'engine: docker {{.ServerVersion}}, {{.Driver}}, cgroup {{.CgroupDriver}}'
    docker-compose version --short
}

DOCKERD_LOG=/tmp/compose-test-dockerd.log

start_dockerd() {  # start dockerd when none answers; its log is appended to, so an earlier crash stays readable
    $DOCKER info >/dev/null 2>&1 && return
    echo "compose-test: starting dockerd (log: $DOCKERD_LOG)"
    as_root sh -c "echo '--- compose-test: dockerd started $(date -u +%FT%TZ)' >>$DOCKERD_LOG; nohup dockerd >>$DOCKERD_LOG 2>&1 &"
    for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && return; sleep 1; done
    echo "compose-test: dockerd did not answer within 60 s; the end of its log:" >&2
    tail -20 "$DOCKERD_LOG" >&2
    return 1
}

daemon_died() {  # after a failed build: true (and says what the daemon printed) when dockerd no longer answers
    $DOCKER info >/dev/null 2>&1 && return 1
    echo "compose-test: dockerd no longer answers; what it printed as it ended ($DOCKERD_LOG):" >&2
    local last
    last=$(awk '/^--- compose-test: dockerd started/ { section = "" } { section = section $0 "\n" } END { printf "%s", section }' \
        "$DOCKERD_LOG" 2>/dev/null)  # the log since the last start
    grep -m1 -B2 -A12 -E '^(panic|fatal error)' <<<"$last" >&2 || tail -20 <<<"$last" >&2
    return 0
}

base() {
    if ! $DOCKER image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1; then
        local root mirror
        root=$(mktemp -d)
        # The Debian mirror apt already uses (deb822 or one-line sources).
        mirror=$(grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
                 2>/dev/null | head -1 | tr -d ' ' || true)
        echo "compose-test: debootstrap bookworm from ${mirror:-http://deb.debian.org/debian}"
        as_root debootstrap --variant=minbase bookworm "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
        as_root tar -C "$root" -c . | $DOCKER import - "$DEBIAN_IMAGE"
        as_root rm -rf "$root"
    fi
    local context
    context=$(mktemp -d)
    cp "$(pip_cert)" "$context/ca-certificates.crt"
    cp deploy/base-image/Dockerfile "$context/"
    $DOCKER build -q --network host --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" -t "$BASE_IMAGE" "$context"
    rm -rf "$context"
}

pip_cert() {  # the CA bundle this machine's pip trusts (its TLS proxy's CA, where there is one)
    local cert
    cert=$(.venv/dev/bin/python -m pip config list 2>/dev/null | sed -n "s/^global.cert='\(.*\)'$/\1/p" | head -1)
    echo "${cert:-/etc/ssl/certs/ca-certificates.crt}"
}

wheels() {
    # Filled once per set of requirements (their hash in a stamp); pip's own configuration names the local
    # wheel folder with the CPU torch build. The CUDA images are not built from here (DEVICE=cuda wants PyPI).
    local stamp=$WHEELHOUSE/.stamp hash
    hash=$(cat requirements/*.txt services/*/requirements.txt services/*/post_install.sh | sha256sum | cut -c1-16)
    if [ "$(cat "$stamp" 2>/dev/null)" = "$hash" ]; then
        echo "wheelhouse up to date: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
        return
    fi
    for requirements in requirements/dev.txt services/{asr,llm,tts}/requirements.txt; do
        pip_wheel -r "$requirements"
    done
    # services/tts/post_install.sh installs these without their dependencies.
    pip_wheel --no-deps voxcpm==2.0.3 torchaudio==2.11.1
    echo "$hash" >"$stamp"
    echo "wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1)"
}

pip_wheel() {  # pip wheel into the wheelhouse; its output only when it fails
    local log
    log=$(mktemp)
    # --find-links on the wheelhouse itself: a wheel an earlier requirements file brought (torch, numpy, grpcio...)
    # is taken from there, not fetched again; pip's own cache serves what `make setup` downloaded.
    if ! .venv/dev/bin/python -m pip wheel -q --wheel-dir "$WHEELHOUSE" --find-links "$WHEELHOUSE" "$@" >"$log" 2>&1; then
        grep -v "is ignored" "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

build() {  # build NAME DOCKERFILE TAG [ARGS...]
    local name=$1 dockerfile=$2 tag=$3 start
    shift 3
    start=$(date +%s)
    mkdir -p reports/compose-build
    # BuildKit's step-by-step log (each step's time, CACHED where the layer cache served it) for a failure or a look.
    # A daemon that died under a build (a crash, not the build's own failure) is started again and the build
    # retried once, after saying what the daemon printed; a failing build fails.
    local try
    for try in 1 2; do
        $DOCKER build --progress plain --network host --build-arg PYTHON_IMAGE="$BASE_IMAGE" -f "$dockerfile" \
            -t "$tag" "$@" . >"reports/compose-build/$name.log" 2>&1 && break
        tail -30 "reports/compose-build/$name.log"
        if [ "$try" = 1 ] && daemon_died; then
            echo "compose-test: $name: starting dockerd again and building $name once more" >&2
            start_dockerd || return 1
            continue
        fi
        return 1
    done
    printf '  %-10s %-28s %5d s  %s\n' "$name" "$tag" $(( $(date +%s) - start )) \
        "$($DOCKER image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1 / 1e9}')"
}

images() {
    # The runtime stage every image shares (torch and the serving requirements) first, so the others find it in
    # the layer cache and only add their own packages; one build at a time: Debian's dockerd 20.10 (BuildKit
    # 0.8) crashed here with SIGSEGV in BuildKit's content-hash cache (contenthash.(*CacheRecord).Unmarshal,
    # moby/buildkit#1913 and #2861) while five builds of this one context ran at once, failing CI. Cold, one
    # after another costs a few minutes more than at once; warm, seconds either way.
    build runtime deploy/docker/Dockerfile voiceagent-local/runtime:cpu --target runtime --build-arg DEVICE=cpu
    local service
    for service in asr llm tts; do
        build "$service" deploy/docker/Dockerfile "voiceagent/$service:cpu" --target "$service" --build-arg DEVICE=cpu
    done
    build loadgen deploy/docker/Dockerfile voiceagent/loadgen:0.1.0 --target loadgen
    build prometheus deploy/monitoring/prometheus/Dockerfile voiceagent-local/prometheus:debian \
        --build-arg DEBIAN_IMAGE="$BASE_IMAGE"
}

tests() {
    .venv/dev/bin/python -m pytest tests/compose -q -rfEs --durations=10 "$@"
}

for step in $STEPS; do
    case $step in
        engine) timed engine engine ;;
        base) timed base base ;;
        wheels) timed wheels wheels ;;
        images) timed images images ;;
        test) timed test tests "$@" ;;
        *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
echo "--- compose-test: steps"
printf '%s\n' "${timings[@]}"
