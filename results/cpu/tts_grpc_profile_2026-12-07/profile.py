"""Sample the TTS service's gRPC process with py-spy while bench-tts's clients load it (see README.md here)."""

import subprocess
import threading
import time

from services.tts import benchmark as bench
from voiceagent.serving.launcher import running_service, venv_python

PYSPY = [".venv/dev/bin/py-spy", "record", "-d", "8", "-r", "200", "-f", "raw", "--nonblocking", "--idle", "--threads"]

with running_service("services.tts", venv_python("tts"), bench.service_args("tiny", "batched", 1, 1, 32)) as service:
    pid = service.proc.pid
    bench.service_level(service.address, 4, 1)  # warm-up
    out = {}
    load = threading.Thread(target=lambda: out.setdefault("level", bench.service_level(service.address, 32, 8, 0.3)))
    load.start()
    time.sleep(3)
    cpu, started = bench.grpc_cpu_s(pid), time.time()
    subprocess.run([*PYSPY, "-p", str(pid), "-o", "/tmp/tts_grpc2.txt"], check=False, capture_output=True)
    print("grpc cpu cores during sampling", (bench.grpc_cpu_s(pid) - cpu) / (time.time() - started))
    load.join()
    print("level wall", out["level"].wall_s, "chunks", len(out["level"].chunks))
