"""One ASR stream offered 1,900 s of audio at once (200 messages of 9.5 s, PCM16) against the tiny preset: the
service's memory and how fast it takes the audio (services/asr/servicer.py `Backlog`, --max-stream-backlog-s 10).

    .venv/dev/bin/python results/cpu/asr_backlog_2026-12-06/flood.py   (from the repository root, PYTHONPATH=.)
"""

from __future__ import annotations

import subprocess
import threading
import time

import grpc
import numpy as np

from voiceagent.serving.launcher import running_service, sample_sum, scrape_samples, venv_python
from voiceagent.v1 import asr_pb2, asr_pb2_grpc

ARGS = ["--preset", "tiny", "--max-streams", "2", "--probe-ceilings", "false", "--threads", "1"]


def rss_mb(pid: int) -> dict[str, int]:
    """Resident memory of the service's Python processes: the gRPC process and its engine process."""
    rows = [line.split(None, 3) for line in subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,cmd="], capture_output=True,
                                                           text=True).stdout.splitlines()]  # fmt: skip
    tree = {pid}
    for _ in range(4):
        tree |= {int(row[0]) for row in rows if int(row[1]) in tree}
    found = {}
    for row in rows:
        if int(row[0]) in tree and "python" in row[3]:
            found["engine" if "multiprocessing" in row[3] else "grpc"] = int(row[2]) // 1024
    return found


def main() -> None:
    with running_service("services.asr", venv_python("asr"), ARGS) as asr:
        print("before:", rss_mb(asr.pid), flush=True)
        piece = (np.random.default_rng(2).standard_normal(int(9.5 * 16000)) * 3000).astype("<i2").tobytes()
        config = asr_pb2.RecognitionConfig(sample_rate_hz=16000, encoding=1, chunk_ms=320, interim_results=True)

        def requests():
            yield asr_pb2.StreamingRecognizeRequest(config=config)
            for _ in range(200):
                yield asr_pb2.StreamingRecognizeRequest(audio=piece)

        processed: list[float] = [0.0]
        with grpc.insecure_channel(asr.address) as channel:
            call = asr_pb2_grpc.SpeechRecognizerStub(channel).StreamingRecognize(requests(), timeout=600)

            def read() -> None:
                try:
                    for response in call:
                        processed.append(response.audio_processed_s)
                except grpc.RpcError:
                    pass

            threading.Thread(target=read, daemon=True).start()
            started = time.monotonic()
            for at in (2, 5, 10):
                time.sleep(max(0.0, started + at - time.monotonic()))
                samples = scrape_samples(asr.metrics_url)
                held = sample_sum(samples, "voiceagent_asr_stream_backpressure_seconds_total", 0.0)
                print(f"after {at} s: RSS MB {rss_mb(asr.pid)}, processed {processed[-1]:.1f} s of audio, the stream "
                      f"held back {held:.1f} s", flush=True)  # fmt: skip
            call.cancel()


if __name__ == "__main__":
    main()
