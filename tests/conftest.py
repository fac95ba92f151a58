"""Fixtures every suite may use."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def short_tmp():
    """A temp folder with a short path under /tmp: a Unix socket's path holds at most 107 bytes (pytest's tmp_path is
    longer), and private folders go under /tmp when the temp folder's path is long."""
    folder = Path(tempfile.mkdtemp(prefix="short-tmp-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
