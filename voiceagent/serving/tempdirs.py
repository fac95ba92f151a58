"""Folders of a process's own in the temp folder, for what it (or a library in it) would otherwise leave there.

Each folder holds an `.owner` file its process keeps locked (flock) for its life. The kernel drops that lock when the
process ends, however it ends, SIGKILL included, so a folder whose lock can be taken was left by a process that is
gone: the next `private_folder` of the same prefix removes it (a PID check would not do: a restarted container's
service runs as the same PID, with the same /tmp).

`use_as_temp` makes such a folder the temp folder of the process and its children, for what libraries leave in it
and cannot be told otherwise (vLLM's distributed FileStore file, left by a killed engine core); caches meant to
outlive the process stay in the shared temp folder (`shared_temp`)."""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import re
import shutil
import tempfile
from pathlib import Path

OWNER = ".owner"
SHARED_TEMP = "VOICEAGENT_SHARED_TMP"  # the temp folder before `use_as_temp`, inherited by children
_HELD: dict[Path, int] = {}  # folder -> the descriptor holding its lock, open for the process's life


def private_folder(prefix: str, base: str | None = None) -> Path:
    """A new folder under `base` (by default the shared temp folder), or under /tmp when that path is long: a Unix
    socket's path (what such folders often hold: vLLM's IPC sockets) is at most 107 bytes. Folders of this prefix
    left by processes that are gone are removed first."""
    base = base or shared_temp()
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


def shared_temp() -> str:
    """The temp folder shared by the machine's processes: the one this process started with, before `use_as_temp`."""
    return os.environ.get(SHARED_TEMP) or tempfile.gettempdir()


def temp_env(folder: Path) -> dict[str, str]:
    """The environment that makes `folder` a process's temp folder, with torch's compile cache (by default under the
    temp folder) pinned to the shared one, so compiled kernels are still reused by the next start."""
    shared = shared_temp()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    sanitized = re.sub(r'[\\/:*?"<>|]', "_", user)  # as torch's default_cache_dir(): <temp>/torchinductor_<user>
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(shared, f"torchinductor_{sanitized}")
    return {SHARED_TEMP: shared, "TORCHINDUCTOR_CACHE_DIR": inductor, "TMPDIR": str(folder)}


def use_as_temp(folder: Path) -> None:
    """Make `folder` the temp folder of this process and of the children it starts from now on (`temp_env`)."""
    os.environ.update(temp_env(folder))
    tempfile.tempdir = str(folder)
