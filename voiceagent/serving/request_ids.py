"""The id a call is known by, in every service: the client's own, echoed back in each response, or a new one."""

from __future__ import annotations

import uuid

from voiceagent.serving.errors import InvalidRequest

MAX_REQUEST_ID_CHARS = 128  # a UUID is 36; an id rides along with every response message


def request_id(given: str, field: str) -> str:
    """`given`, or a fresh id when it is empty; InvalidRequest naming `field` when it is too long to echo or has
    characters that do not print."""
    if len(given) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            field, f"{len(given)} characters, more than {MAX_REQUEST_ID_CHARS}: it is echoed in every response"
        )
    if not given.isprintable():  # control characters (a newline) would reach logs and file names as they are
        raise InvalidRequest(field, f"{given!r} has characters that do not print (control characters, say)")
    return given or uuid.uuid4().hex
