"""The compose stack for real (`make compose-test`, tools/compose_test.sh builds the images first): the three
services on tiny presets and Prometheus come up under docker-compose v1, turn healthy through the images' own
HEALTHCHECKs, take a short sweep from the loadgen container, Prometheus has every target up and every dashboard
query returns data; `--scale tts=3` spreads a dns:/// round_robin sweep evenly over the replicas and raises the
capacity; `down` leaves nothing behind. The measurements go to reports/compose-test/ (copied to results/cpu/)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.test_live_monitoring import dashboard_expressions
from tests.deploy.tools import DEPLOY, REPO, SERVICES

PROJECT = os.environ.get("COMPOSE_TEST_PROJECT", "voiceagent-test")  # two runs side by side need two names
FILES = ["-f", str(DEPLOY / "compose.yaml"), "-f", str(DEPLOY / "compose.test.yaml")]
PORTS = {"asr": (50051, 9091), "llm": (50052, 9092), "tts": (50053, 9093)}
OUT = REPO / "reports" / PROJECT
SWEEP = ["--concurrency", "1,2", "--duration-s", "4", "--warmup-s", "1", "--timeout-s", "60"]
# TTS speaks 3 words (~6 patches) here: a replica has 0.4 of a core (compose.test.yaml), where the small preset steps
# ~3-4 times a second, so 8 words (~20 patches, 5-6 s) could not finish inside a 4 s level at C=2 (CI, session 26:
# 0 requests; the same with the tree before it under the same quota). The capacity sweeps below speak 8, over 12 s.
WORKLOAD = {"asr": ["--utterance-s", "2"], "llm": ["--prompt-tokens", "16", "--output-tokens", "8"],
            "tts": ["--text-words", "3"]}  # fmt: skip
# The capacity sweeps, at the same concurrency per replica: one replica at C, three at 3C (the batched engine's
# throughput grows with its batch, so replicas are compared at equal load each).
CAPACITY_LEVELS = {1: "1,2,4,8", 3: "3,6,12,24"}
CAPACITY_SWEEP = ["--duration-s", "12", "--warmup-s", "2", "--timeout-s", "120", "--text-words", "8"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Compose:
    """docker-compose (v1) on deploy/compose.yaml + compose.test.yaml under one project name."""

    def __init__(self, reports: Path):
        self.env = {
            **os.environ,
            "ASR_PRESET": "tiny", "LLM_PRESET": "tiny", "TTS_PRESET": "tiny",
            "PROMETHEUS_IMAGE": os.environ.get("PROMETHEUS_IMAGE", "voiceagent-local/prometheus:debian"),
            "PROMETHEUS_PORT": str(free_port()),
            "VOICEAGENT_REPORTS": str(reports),
            "VOICEAGENT_MODELS": str(reports.parent / "models"),
        }  # fmt: skip
        (reports.parent / "models").mkdir(exist_ok=True)
        self.prometheus = f"http://127.0.0.1:{self.env['PROMETHEUS_PORT']}"
        self.reports = reports

    def __call__(self, *args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(["docker-compose", "-p", PROJECT, *FILES, *args], env=self.env, cwd=REPO,
                                capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
        assert not check or result.returncode == 0, f"docker-compose {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result

    def containers(self, service: str) -> list[str]:
        return self("ps", "-q", service).stdout.split()

    def wait_healthy(self, service: str, replicas: int, timeout_s: float = 900) -> float:
        """Until every replica's own HEALTHCHECK (grpc.health.v1) says healthy; returns the seconds it took."""
        start = time.monotonic()
        while True:
            ids = self.containers(service)
            states = [inspect(i, "{{.State.Health.Status}}") for i in ids]
            if len(ids) == replicas and all(state == "healthy" for state in states):
                return time.monotonic() - start
            # A replica saturated by a sweep on its half core can miss health checks (5 s timeout) and read
            # unhealthy for a while; it must turn healthy again once the load stops.
            assert time.monotonic() - start < timeout_s, (
                f"{service} not healthy within {timeout_s} s: {states}\n{self('logs', '--tail', '50', service).stdout}"
            )
            time.sleep(2)

    def sweep(self, target: str, *args: str) -> dict:
        """`python -m loadgen sweep` in the loadgen container, through the services' compose DNS names."""
        port, metrics = PORTS[target]
        before = set(self.reports.iterdir())
        self("--profile", "loadgen", "run", "--rm", "--no-deps", "loadgen", "sweep", "--target", target,
             f"--{target}", f"dns:///{target}:{port}", f"--{target}-metrics", f"http://{target}:{metrics}/metrics",
             "--reports", "/reports", *args)  # fmt: skip
        (run,) = set(self.reports.iterdir()) - before
        return json.loads(next(run.rglob("results.json")).read_text())


def inspect(container: str, template: str) -> str:
    return subprocess.run(["docker", "inspect", "-f", template, container], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def prometheus_query(compose: Compose, expr: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{compose.prometheus}/api/v1/query?{params}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def busiest_processes(count: int = 8) -> list[str]:
    """What the machine was doing: the processes with the most CPU (ps's lifetime %CPU), for the record."""
    ps = subprocess.run(["ps", "-eo", "pcpu,etimes,comm", "--sort=-pcpu", "--no-headers"], capture_output=True,
                        text=True, check=False)  # fmt: skip
    return [" ".join(line.split()) for line in ps.stdout.splitlines()[:count]]


OTHERS_QUIET_CORES = 0.6


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core; /proc/stat's first line, less idle and iowait)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuUse:
    """CPU the replicas' containers used over a sweep, and how often their CPU limit throttled them, from their
    cgroups (v1 cgroupfs as Debian's docker.io sets up, or v2): whether the replicas got their quota."""

    def __init__(self, containers: list[str]):
        self.containers = containers
        self.started = time.monotonic()
        self.start = {container: cgroup_cpu(container) for container in containers}
        self.machine = machine_busy_s()

    def read(self) -> dict:
        wall = time.monotonic() - self.started
        end = {container: cgroup_cpu(container) for container in self.containers}
        machine = (machine_busy_s() - self.machine) / wall
        if any(value is None for value in [*self.start.values(), *end.values()]):
            return {"unavailable": "no readable cgroup for a container", "machine_cores_mean": round(machine, 3)}
        used = {c: end[c]["cpu_s"] - self.start[c]["cpu_s"] for c in self.containers}
        return {
            "wall_s": round(wall, 1),
            # the load generator's container, dockerd, Prometheus and everything outside docker
            "machine_cores_mean": round(machine, 3),
            "other_cores_mean": round(machine - sum(used.values()) / wall, 3),
            "cores_used_mean": {c[:12]: round(used[c] / wall, 3) for c in self.containers},
            "throttled_periods_share": {
                c[:12]: round((end[c]["throttled"] - self.start[c]["throttled"])
                              / max(end[c]["periods"] - self.start[c]["periods"], 1), 3)
                for c in self.containers
            },
        }  # fmt: skip


def cgroup_cpu(container: str) -> dict | None:
    """CPU seconds used and CFS periods (throttled, total) of a container, or None where no cgroup is readable."""
    v1 = Path("/sys/fs/cgroup/cpu/docker") / container
    v2 = Path("/sys/fs/cgroup/system.slice") / f"docker-{container}.scope"
    try:
        if v1.is_dir():
            stat = dict(line.split() for line in (v1 / "cpu.stat").read_text().splitlines())
            cpu_s = int((Path("/sys/fs/cgroup/cpuacct/docker") / container / "cpuacct.usage").read_text()) / 1e9
        else:
            stat = dict(line.split() for line in (v2 / "cpu.stat").read_text().splitlines())
            cpu_s = int(stat["usage_usec"]) / 1e6
        return {"cpu_s": cpu_s, "throttled": int(stat["nr_throttled"]), "periods": int(stat["nr_periods"])}
    except (OSError, KeyError, ValueError):
        return None


def replica_requests(container: str) -> float:
    """Synthesize RPCs a TTS replica finished, from its own /metrics (its address on the compose network)."""
    address = inspect(container, "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
    with urllib.request.urlopen(f"http://{address}:9093/metrics", timeout=10) as response:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in response.read().decode().splitlines()
            if line.startswith("voiceagent_tts_rpc_requests_total{") and 'method="Synthesize"' in line
        )


@pytest.fixture(scope="module")
def compose():
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose missing: run tools/compose_test.sh (it installs Debian's docker.io)")
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "reports").mkdir(parents=True)
    (OUT / "reports").chmod(0o777)  # the loadgen container writes as uid 10001
    stack = Compose(OUT / "reports")
    stack("down", "-v", "--remove-orphans", check=False)
    try:
        started = time.monotonic()
        # COMPOSE_TEST_UP="tts prometheus" with `-k three_tts` measures the replicas alone (a quicker run).
        stack("up", "-d", "--no-build", *os.environ.get("COMPOSE_TEST_UP", " ".join([*SERVICES, "prometheus"])).split())
        stack.up_s = time.monotonic() - started
        yield stack
    finally:
        stack("down", "-v", "--remove-orphans", check=False)


@pytest.fixture(scope="module")
def healthy(compose):
    return {service: compose.wait_healthy(service, 1) for service in SERVICES}


@pytest.fixture(scope="module")
def swept(compose, healthy):
    return {target: compose.sweep(target, *SWEEP, *WORKLOAD[target]) for target in SERVICES}


def test_services_turn_healthy_through_their_images_health_checks(compose, healthy):
    for service in SERVICES:
        (container,) = compose.containers(service)
        assert inspect(container, "{{.State.Health.Status}}") == "healthy"
        log = json.loads(inspect(container, "{{json .State.Health.Log}}"))
        assert "SERVING" in log[-1]["Output"], log[-1]
    print(f"\nup: {compose.up_s:.0f} s; healthy after: {json.dumps({k: round(v) for k, v in healthy.items()})}")


@pytest.mark.parametrize("target", SERVICES)
def test_a_sweep_from_the_loadgen_container_is_served(swept, target):
    levels = swept[target]["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        assert level["requests"] > 0 and level["errors"] == 0, level
        assert level["throughput"] > 0 and level["server"]["steps_per_s"] > 0, level


def wait_scraped(compose: Compose, timeout_s: float = 60) -> None:
    """Until Prometheus holds a sample newer than the sweeps' end from every target (5 s scrape interval)."""
    done = time.time()
    deadline = time.monotonic() + timeout_s
    while True:
        up = prometheus_query(compose, "timestamp(up)")
        if up and all(float(s["value"][1]) > done + 1 for s in up):
            return
        assert time.monotonic() < deadline, f"Prometheus did not scrape every target after the sweeps: {up}"
        time.sleep(1)


def test_prometheus_has_every_target_up(compose, swept):
    wait_scraped(compose)
    up = {s["metric"]["job"]: s["value"][1] for s in prometheus_query(compose, "up")}
    assert up == dict.fromkeys([*SERVICES, "prometheus"], "1"), up


def test_every_dashboard_query_returns_data(compose, swept):
    wait_scraped(compose)
    expressions = dashboard_expressions()
    assert len(expressions) >= 30
    empty = [f"{title}: {expr}" for title, expr in expressions if not prometheus_query(compose, expr)]
    assert not empty, "dashboard expressions without data:\n" + "\n".join(empty)


def capacity(results: dict) -> dict:
    """Audio s/s at the sweep's knee (and the best level), as loadgen's analysis placed the knee."""
    analysis = results["analysis"]
    levels = results["levels"]
    knee = levels[analysis["knee_index"]] if analysis.get("knee_index") is not None else max(
        levels, key=lambda level: level["throughput"])  # fmt: skip
    return {"knee_concurrency": knee["concurrency"], "knee_audio_s_per_s": knee["throughput"],
            "best_audio_s_per_s": max(level["throughput"] for level in levels),
            "levels": {level["concurrency"]: round(level["throughput"], 3) for level in levels},
            "errors": sum(level["errors"] for level in levels)}  # fmt: skip


def mean_capacity(first: dict, second: dict) -> dict:
    """Two capacity() records of the same sweep averaged level by level, over the levels both measured (a sweep
    stops early once a level is past the service: at 0.4 of a core one run reached C=8 and the next stopped before
    it); the knee is where both runs placed it, else the level with the best mean."""
    both = [c for c in first["levels"] if c in second["levels"]]
    levels = {c: round((first["levels"][c] + second["levels"][c]) / 2, 3) for c in both}
    best = max(levels, key=levels.__getitem__)
    same = first["knee_concurrency"] == second["knee_concurrency"] and first["knee_concurrency"] in levels
    knee = first["knee_concurrency"] if same else best
    return {"knee_concurrency": knee, "knee_audio_s_per_s": levels[knee], "best_audio_s_per_s": levels[best],
            "levels": levels, "errors": first["errors"] + second["errors"]}  # fmt: skip


def test_three_tts_replicas_share_a_round_robin_sweep(compose, request):
    """One replica's capacity, then --scale tts=3 (compose DNS answers `tts` with three addresses), then one again:
    the sweep through dns:///tts:50053 reaches every replica within ±20 % of the mean, and the capacity rises."""
    if not os.environ.get("COMPOSE_TEST_UP"):
        request.getfixturevalue("swept")  # after the short sweeps (the whole stack); else on its own
        compose("stop", "asr", "llm")  # done with: their idle engines would take CPU from the measurement
    compose.wait_healthy("tts", 1)
    load_before = os.getloadavg()[0]
    busy_before = busiest_processes()

    def one_replica() -> tuple[dict, dict]:
        (first,) = compose.containers("tts")
        cpu = CpuUse([first])
        return capacity(compose.sweep("tts", "--concurrency", CAPACITY_LEVELS[1], *CAPACITY_SWEEP)), cpu.read()

    # One replica before and after the three (interleaved): on a shared virtual machine the speed a CPU quota buys
    # drifts between minutes (CI: one replica 26.3 audio-s/s at C=8 in one run, 23.1 in the next, same code), and
    # a single baseline draw moved the ratio between 2.4 and 2.9. The baseline is the mean of the two.
    one_before, one_before_cpu = one_replica()
    compose("up", "-d", "--no-build", "--no-recreate", "--scale", "tts=3", "tts")
    compose.wait_healthy("tts", 3)
    replicas = compose.containers("tts")
    before = {container: replica_requests(container) for container in replicas}
    cpu = CpuUse(replicas)
    three = capacity(compose.sweep("tts", "--concurrency", CAPACITY_LEVELS[3], *CAPACITY_SWEEP))
    three_cpu = cpu.read()
    served = {container: replica_requests(container) - before[container] for container in replicas}
    mean = sum(served.values()) / len(served)
    compose("up", "-d", "--no-build", "--no-recreate", "--scale", "tts=1", "tts")
    compose.wait_healthy("tts", 1)
    one_after, one_after_cpu = one_replica()
    one = mean_capacity(one_before, one_after)
    one_cpu = {"before": one_before_cpu, "after": one_after_cpu}
    measured = {
        "command": "make compose-test (tests/compose/test_stack.py::test_three_tts_replicas_share_a_round_robin_sweep)",
        "sweep": ["sweep", "--target", "tts", "--tts", "dns:///tts:50053", *CAPACITY_SWEEP],
        "cpu_cores": os.cpu_count(), "cpus_per_replica": float(os.environ.get("TTS_CPUS", "0.4")),
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "busiest_processes_before": busy_before, "busiest_processes_after": busiest_processes(),
        "one_replica": one, "one_replica_runs": [one_before, one_after], "three_replicas": three,
        "replica_cpu": {"one_replica": one_cpu, "three_replicas": three_cpu},
        "requests_per_replica": served, "spread_vs_mean": {c: round(n / mean - 1, 3) for c, n in served.items()},
        "capacity_ratio_knee": three["knee_audio_s_per_s"] / one["knee_audio_s_per_s"],
        "capacity_ratio_best": three["best_audio_s_per_s"] / one["best_audio_s_per_s"],
        "capacity_ratio_per_replica_level": {
            c: round(three["levels"][3 * c] / one["levels"][c], 3) for c in one["levels"] if 3 * c in three["levels"]
        },
    }  # fmt: skip
    (OUT / "tts_scale.json").write_text(json.dumps(measured, indent=2))
    print("\n" + json.dumps(measured, indent=2))
    assert one["errors"] == 0 and three["errors"] == 0
    assert all(abs(n / mean - 1) <= 0.2 for n in served.values()), f"uneven spread: {served}"
    # Each replica has 0.4 of a core and one torch thread (compose.test.yaml), the one-replica baseline too: three
    # take 1.2 of the machine's 2 cores and leave the load generator the rest, so on a machine with those cores
    # free the capacity must reach 2.5x one replica's. Where other processes kept the cores busy before the sweeps
    # (load average above the core count), the replicas cannot get their quota and the ratio measures that load
    # instead: it is recorded and reported (with the busiest processes), not asserted.
    # What else ran is read from the machine's CPU time less the replicas' own: more than OTHERS_QUIET_CORES
    # (the load generator's and the system's share of the spare 0.8) and the replicas competed for their quota.
    cores = os.cpu_count() or 1
    runs = [one_before_cpu, one_after_cpu, three_cpu]
    others = max(run.get("other_cores_mean", cores) for run in runs)
    quiet = load_before <= cores and others <= OTHERS_QUIET_CORES
    if measured["cpus_per_replica"] * 3 <= cores * 0.75 and quiet:
        assert measured["capacity_ratio_best"] >= 2.5, measured
    elif not quiet:
        print(f"capacity ratio {measured['capacity_ratio_best']:.2f} not asserted: load average {load_before:.1f} "
              f"on {cores} cores before the sweeps, {others:.2f} cores used by others during them")  # fmt: skip


def test_down_leaves_nothing_behind(compose, swept):
    started = time.monotonic()
    compose("down", "-v", "--remove-orphans", timeout_s=120)
    took = time.monotonic() - started
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in ("ps -a", "network ls", "volume ls"):
        left = subprocess.run(["docker", *kind.split(), "-q", "--filter", label], capture_output=True, text=True)
        assert not left.stdout.strip(), f"docker {kind}: {left.stdout}"
    print(f"\ndown: {took:.0f} s")
    assert took < 60, f"down took {took:.0f} s: a service ignored SIGTERM past its drain grace"
