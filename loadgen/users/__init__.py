"""Locust users, one per target; `USERS[target]` is the class a sweep spawns `concurrency` of."""

from loadgen.users.base import LoadContext
from loadgen.users.grpc_users import AsrUser, LlmUser, TtsUser, VoiceTurnUser
from loadgen.users.openai_user import OpenAIUser

USERS = {"asr": AsrUser, "llm": LlmUser, "tts": TtsUser, "voice": VoiceTurnUser, "openai": OpenAIUser}

__all__ = ["USERS", "LoadContext", "AsrUser", "LlmUser", "TtsUser", "VoiceTurnUser", "OpenAIUser"]
