"""The one error vocabulary of the three services: what a servicer or backend raises, and the gRPC status it
ends the call with.

- `InvalidRequest(field, message)`: the request is at fault, `field` names where (INVALID_ARGUMENT,
  "field: message"); raised before any expensive work where the check allows it.
- `EngineFailure(status, message)`: the engine refused or failed the request; `status` is the gRPC status
  code's name (an upstream server's 429 is RESOURCE_EXHAUSTED, say).
- `EngineUnavailable(message)`: the engine is gone or not there yet (UNAVAILABLE); the client may retry.
- `QueueFull(message)`: admission refused, every slot and queue place taken (RESOURCE_EXHAUSTED).
- `StreamIdle(message)`: a client stream went quiet past the service's idle timeout (OUT_OF_RANGE).

A servicer ends a call with `await abort(context, error)`.
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """An error a call ends with; `status` is the name of its gRPC status code."""

    status = "INTERNAL"


class InvalidRequest(ServiceError, ValueError):
    """A request the service cannot serve; `field` names the request field at fault."""

    status = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class StreamIdle(ServiceError):
    """A client stream sent nothing for longer than the service waits, while holding what others could use (a
    slot): OUT_OF_RANGE, as Google's Speech-to-Text ends a stream whose audio stopped coming."""

    status = "OUT_OF_RANGE"


class EngineFailure(ServiceError, RuntimeError):
    """The engine behind a backend (a remote server, say) refused or failed a request; `status` is the gRPC
    status code's name the call ends with: UNAVAILABLE, RESOURCE_EXHAUSTED, INVALID_ARGUMENT, ..."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class EngineUnavailable(EngineFailure):
    """The engine is gone (its process died) or failed to start; the message says why. Becomes UNAVAILABLE."""

    def __init__(self, message: str):
        super().__init__("UNAVAILABLE", message)


class QueueFull(EngineFailure):
    """Every slot is taken and the queue is full: the caller gets RESOURCE_EXHAUSTED and may retry later."""

    def __init__(self, message: str):
        super().__init__("RESOURCE_EXHAUSTED", message)


async def abort(context: grpc.aio.ServicerContext, error: ServiceError, suffix: str = "") -> None:
    """End the call with the error's status and its message (plus `suffix`)."""
    await context.abort(grpc.StatusCode[error.status], f"{error}{suffix}")
