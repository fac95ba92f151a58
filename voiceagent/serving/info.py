"""The info RPC every service answers: engine, model shape, weight bytes and the measured device ceilings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from voiceagent import __version__
from voiceagent.serving.ceilings import DeviceCeilings
from voiceagent.v1 import common_pb2


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a backend serves, in the terms the load generator predicts with."""

    backend: str
    engine_version: str
    preset: str
    source: str
    synthetic_weights: bool
    parameter_count: int
    weight_bytes: int
    dtype: str
    device: str
    shape: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def to_proto(self) -> common_pb2.ModelInfo:
        return common_pb2.ModelInfo(
            backend=self.backend,
            engine_version=self.engine_version,
            preset=self.preset,
            source=self.source,
            synthetic_weights=self.synthetic_weights,
            parameter_count=self.parameter_count,
            weight_bytes=self.weight_bytes,
            dtype=self.dtype,
            device=self.device,
            shape={name: float(value) for name, value in self.shape.items()},
        )


def info_response(
    service: str, model: ModelFacts, ceilings: DeviceCeilings, limits: Mapping[str, float] | None = None
) -> common_pb2.InfoResponse:
    return common_pb2.InfoResponse(
        service=service,
        service_version=__version__,
        model=model.to_proto(),
        ceilings=ceilings.to_proto(),
        limits={name: float(value) for name, value in (limits or {}).items()},
    )
