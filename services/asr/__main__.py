from services.asr.config import AsrConfig
from services.asr.servicer import AsrService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":
    config = load_config(AsrConfig, "ASR")
    run(AsrService(config), config)
