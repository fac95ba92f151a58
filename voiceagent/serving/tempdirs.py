"""Folders of a process's own in the temp folder, for what it (or a library in it) would otherwise leave there.

Each folder holds an `.owner` file its process keeps locked (flock) for its life. The kernel drops that lock when the
process ends, however it ends, SIGKILL included, so a folder whose lock can be taken was left by a process that is
gone: the next `private_folder` of the same prefix removes it (a PID check would not do: a restarted container's
service runs as the same PID, with the same /tmp)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

OWNER = ".owner"
_HELD: dict[Path, int] = {}  # folder -> the descriptor holding its lock, open for the process's life


def private_folder(prefix: str) -> Path:
    """A new folder under the temp folder, or under /tmp when that path is long: a Unix socket's path (what such
    folders often hold: vLLM's IPC sockets) is at most 107 bytes. Folders of this prefix left by processes that are
    gone are removed first."""
    base = tempfile.gettempdir()
    base = "/tmp" if len(base) > 48 and os.path.isdir("/tmp") else base
    sweep(Path(base), prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    handle = os.open(folder / OWNER, os.O_CREAT | os.O_RDWR, 0o600)  # not inherited by children (PEP 446)
    fcntl.flock(handle, fcntl.LOCK_EX)
    _HELD[folder] = handle
    return folder


def sweep(base: Path, prefix: str) -> list[Path]:
    """Remove the folders `prefix`* under `base` whose owner is gone (their `.owner` lock can be taken); folders
    without an `.owner` file are not ours to judge and stay. Returns the folders removed."""
    removed = []
    for folder in base.glob(f"{prefix}*"):
        if folder in _HELD or not (folder / OWNER).is_file():
            continue
        with contextlib.suppress(OSError):
            handle = os.open(folder / OWNER, os.O_RDWR)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its owner lives
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            finally:
                os.close(handle)
    return removed
