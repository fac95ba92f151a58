"""The event loop's CPU for one batch wait of the ready policy (engine/batching.py `_gather_ready`): N streams joined,
one fed a chunk, FED more fed one by one during the wait (max batch = N, wait = one 320 ms chunk). From the repo root:
`PYTHONPATH=. .venv/asr/bin/python results/cpu/asr_readiness_2026-12-06/gather_cost.py 1024 256`; "before" is the
same run at the parent commit (git stash)."""

import asyncio
import sys
import time

import numpy as np

from services.asr.backend import StreamSettings
from services.asr.backends.in_process import load_in_process
from services.asr.config import AsrConfig


async def main(streams_n: int, fed_n: int) -> None:
    config = AsrConfig(
        preset="tiny", max_streams=streams_n, max_batch_streams=streams_n, batch_wait_fraction=1.0, join_window_ms=0
    )
    backend = load_in_process(config)
    streams = [backend.join(StreamSettings(f"s{i}", 320), lambda update: None) for i in range(streams_n)]
    chunk = np.zeros(backend.chunk_mel(streams[0]) * 160 + 400, np.float32)
    backend.feed(streams[0], chunk, time.perf_counter())

    async def feed() -> None:
        for stream in streams[1 : 1 + fed_n]:
            await asyncio.sleep(0.3 / fed_n)
            backend.feed(stream, chunk, time.perf_counter())

    task = asyncio.create_task(feed())
    cpu = time.process_time()
    gathered = await backend._gather_ready(320)
    await task
    cpu = time.process_time() - cpu
    print(
        f"{streams_n} streams, {fed_n} messages during a 320 ms batch wait: event-loop CPU {cpu * 1000:.1f} ms "
        f"({cpu * 1e6 / fed_n:.0f} us per message), gathered {len(gathered)}"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
