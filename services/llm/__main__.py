from services.llm.config import LlmConfig
from services.llm.servicer import LlmService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":
    config = load_config(LlmConfig, "LLM")
    run(LlmService(config), config)
