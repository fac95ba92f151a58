"""What the LLM's prompt bound rests on, measured: the Qwen3 tokenizer's longest token in bytes (the
max_prompt_bytes default is max_model_len x that), and whether tokenising a large prompt in a worker
thread leaves the interpreter lock to others (a thread ticking every 1 ms meanwhile).

    PYTHONPATH=. .venv/llm/bin/python results/cpu/llm_prompt_bound.py
"""

import threading
import time

from transformers import AutoTokenizer

from services.llm.backends.vllm import longest_token_bytes
from services.llm.config import bundled_tokenizer_dir

tokenizer = AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
started = time.perf_counter()
print(f"longest token: {longest_token_bytes(tokenizer)} bytes (computed in {time.perf_counter() - started:.2f} s)")
for megabytes in (0.5, 1.0):
    text = "hello world, this is a prompt. " * int(megabytes * (1 << 20) / 31)
    ticks, stop = [0], threading.Event()

    def tick(ticks=ticks, stop=stop):
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    worker = threading.Thread(target=tokenizer.encode, args=(text,), kwargs={"add_special_tokens": False})
    worker.start()
    worker.join()
    took = time.perf_counter() - started
    stop.set()
    ticker.join()
    print(
        f"{len(text.encode()) / (1 << 20):.2f} MiB prompt: tokenised in {took:.2f} s in a thread; "
        f"the ticker ran {ticks[0]} times (~{took * 1000 / 1.1:.0f} if never blocked, 1.1 ms per tick here)"
    )
