"""Folders of a process's own in the temp folder, for what it (or a library in it) would otherwise leave there."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def private_folder(prefix: str) -> Path:
    """A new folder under the temp folder, or under /tmp when that path is long: a Unix socket's path (what such
    folders often hold: vLLM's IPC sockets) is at most 107 bytes."""
    base = tempfile.gettempdir()
    base = "/tmp" if len(base) > 48 and os.path.isdir("/tmp") else base
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
