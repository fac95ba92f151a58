"""A metrics endpoint that hangs (a saturated replica that cannot answer its scrape in time) costs the sweep that
level's server counters, recorded with a warning in the report; it never ends the sweep. Real processes: the tiny
TTS service, a sweep process, and an endpoint process that accepts connections and never answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness import REPO
from tests.loadgen.test_sweep import SHORT, sweep

# Accepts every connection and never writes a byte: the scrape times out (and the kernel's backlog never fills).
HANGING_ENDPOINT = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
held = []
while True:
    held.append(server.accept()[0])
"""


@pytest.fixture
def hanging_metrics_url():
    process = subprocess.Popen([sys.executable, "-c", HANGING_ENDPOINT], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        process.kill()
        process.wait()


def test_a_hanging_metrics_endpoint_is_recorded_and_the_sweep_goes_on(tmp_path, services, hanging_metrics_url):
    tts = services["tts"]
    folder, results, records, stdout = sweep(
        tmp_path, ["--tts", tts.address, "--tts-metrics", hanging_metrics_url], "tts", "--concurrency", "1,2",
        *SHORT, "--text-words", "4",
    )  # fmt: skip

    levels = results["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2], "the sweep stopped at the failed scrape"
    for level in levels:
        assert level["requests"] > 0 and level["errors"] == 0, level  # the load itself was measured
        assert level["extra"]["metrics_scrape_failures"] == 1, level["extra"]
        assert level["server"]["steps_per_s"] == 0 and level["server"]["flops_per_s"] == 0  # missing, not invented
    warnings = [w for w in results["warnings"] if "metrics were not scraped" in w]
    assert len(warnings) == 2 and all(hanging_metrics_url in w and "timed out" in w for w in warnings), warnings
    assert "metrics were not scraped" in (folder / "report.md").read_text()
    assert "not scraped" in stdout and records


def test_a_scrape_that_fails_once_costs_only_that_level(tmp_path, services):
    """The endpoint answers, then hangs for one level, then answers again (a proxy process in front of the real
    /metrics that hangs every request between its 3rd and 4th): only level 2 loses its counters."""
    tts = services["tts"]
    proxy = subprocess.Popen(
        [sys.executable, "-c", FLAKY_PROXY, tts.metrics_url], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        port = int(proxy.stdout.readline())
        _, results, _, _ = sweep(
            tmp_path, ["--tts", tts.address, "--tts-metrics", f"http://127.0.0.1:{port}/metrics"], "tts",
            "--concurrency", "1,2,3", *SHORT, "--text-words", "4", "--objective-s", "600",
        )  # fmt: skip
    finally:
        proxy.kill()
        proxy.wait()
    levels = results["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2, 3]
    assert [level["extra"].get("metrics_scrape_failures", 0) for level in levels] == [0, 1, 0]
    assert levels[0]["server"]["steps_per_s"] > 0 and levels[2]["server"]["steps_per_s"] > 0
    assert levels[1]["server"]["steps_per_s"] == 0


# Forwards GET requests to the URL in argv[1]; the 4th request (level 2's closing scrape; GetInfo is not a scrape)
# is held open without an answer.
FLAKY_PROXY = """
import http.server, sys, threading, time, urllib.request
upstream = sys.argv[1]
count = 0
lock = threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        with lock:
            count += 1
            mine = count
        if mine == 4:
            time.sleep(3600)
        body = urllib.request.urlopen(upstream, timeout=10).read()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""
