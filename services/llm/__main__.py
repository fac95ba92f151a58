from services.llm.config import LlmConfig
from services.llm.servicer import LlmService
from voiceagent.serving.config import load_config
from voiceagent.serving.server import run

if __name__ == "__main__":
    config = load_config(LlmConfig, "LLM")
    if config.frontends > 1:
        from services.llm.backends.vllm_frontends import serve_frontends

        serve_frontends(config)
    else:
        run(LlmService(config), config)
