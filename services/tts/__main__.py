"""`python -m services.tts`: parse the config, serve until SIGTERM."""

from services.tts.config import TtsConfig
from services.tts.servicer import TtsService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":  # guarded: worker processes are spawned and re-import this module
    config = load_config(TtsConfig, "TTS")
    if config.frontends > 1:
        from services.tts.backends.batched_frontends import serve_frontends

        serve_frontends(config)
    else:
        run(TtsService(config), config)
