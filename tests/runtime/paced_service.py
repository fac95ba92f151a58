"""A minimal service for testing the shared runtime (not a product service).

It speaks the TTS contract with a trivial engine: `Synthesize` streams `len(text)` chunks of silence,
`--chunk-delay-s` apart, so a test can hold a stream open across a SIGTERM. `--load-s` delays SERVING.
"""

from __future__ import annotations

import asyncio
import dataclasses

from voiceagent.serving.ceilings import DeviceCeilings
from voiceagent.serving.config import ServingConfig, load_config, require
from voiceagent.serving.info import ModelFacts, info_response
from voiceagent.serving.server import run
from voiceagent.v1 import common_pb2, tts_pb2, tts_pb2_grpc


@dataclasses.dataclass(frozen=True)
class PacedConfig(ServingConfig):
    load_s: float = dataclasses.field(default=1.0, metadata={"help": "seconds the fake engine takes to load"})
    chunk_delay_s: float = dataclasses.field(default=0.1, metadata={"help": "seconds between chunks"})

    def validate(self) -> None:
        super().validate()
        require(self.chunk_delay_s >= 0, "chunk_delay_s", f"must be >= 0, got {self.chunk_delay_s}")


class PacedService(tts_pb2_grpc.SpeechSynthesizerServicer):
    name = "paced"
    service_names = ("voiceagent.v1.SpeechSynthesizer",)
    methods = ("Synthesize", "StreamingSynthesize", "GetInfo")
    dtype = "float32"

    def __init__(self, config: PacedConfig):
        self.config = config
        self.ceilings: DeviceCeilings | None = None

    def add_to_server(self, server) -> None:
        tts_pb2_grpc.add_SpeechSynthesizerServicer_to_server(self, server)

    async def start(self, ceilings: DeviceCeilings) -> None:
        self.ceilings = ceilings
        await asyncio.sleep(self.config.load_s)

    async def stop(self) -> None:
        print("paced: engine closed", flush=True)

    async def Synthesize(self, request, context):
        for index in range(len(request.text)):
            await asyncio.sleep(self.config.chunk_delay_s)
            yield tts_pb2.AudioChunk(
                audio=b"\0\0" * 160,
                encoding=common_pb2.AUDIO_ENCODING_PCM16,
                sample_rate_hz=16000,
                chunk_index=index,
                is_last=index == len(request.text) - 1,
            )

    async def GetInfo(self, request, context):
        facts = ModelFacts("paced", "0", "none", "", True, 0, 0, "float32", self.config.device)
        return info_response(self.name, facts, self.ceilings, {"max_streams": 1})


if __name__ == "__main__":
    config = load_config(PacedConfig, "PACED")
    run(PacedService(config), config)
