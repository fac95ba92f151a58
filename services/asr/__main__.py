from services.asr.config import AsrConfig
from services.asr.servicer import AsrService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":
    config = load_config(AsrConfig, "ASR")
    if config.frontends > 1:
        from services.asr.backends.engine_frontends import serve_frontends

        serve_frontends(config)
    else:
        run(AsrService(config), config)
