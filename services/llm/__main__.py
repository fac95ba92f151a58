import os
import shutil

from services.llm.config import LlmConfig
from services.llm.servicer import LlmService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run
from voiceagent.serving.tempdirs import private_folder, use_as_temp

if __name__ == "__main__":
    config = load_config(LlmConfig, "LLM")
    # vLLM binds its ZMQ IPC sockets (engine core <-> front ends) under VLLM_RPC_BASE_PATH, by default the temp
    # folder, and leaves them there when it stops (7 files per start on the CPU). A folder of the service's own, removed
    # when it exits (normally, on SIGTERM or with an error), keeps nothing behind.
    # (private_folder: under /tmp when TMPDIR is long, since a Unix socket's path holds at most 107 bytes)
    # It is also the temp folder of the service and its engine core: a killed engine core leaves its distributed
    # FileStore file (vllm_dist_*) there, and the next start sweeps a SIGKILLed service's folder.
    private = private_folder("va-llm-")
    try:
        os.environ.setdefault("VLLM_RPC_BASE_PATH", str(private))
        use_as_temp(private)
        if config.frontends > 1:
            from services.llm.backends.vllm_frontends import serve_frontends

            serve_frontends(config)
        else:
            run(LlmService(config), config)
    finally:
        shutil.rmtree(private, ignore_errors=True)
