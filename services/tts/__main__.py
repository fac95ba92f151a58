"""`python -m services.tts`: parse the config, serve until SIGTERM."""

from services.tts.config import TTSConfig
from services.tts.servicer import TTSService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":  # guarded: worker processes are spawned and re-import this module
    config = load_config(TTSConfig, "TTS")
    run(TTSService(config), config)
