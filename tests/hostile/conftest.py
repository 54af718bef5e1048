"""Fixtures the hostile-PR tests share."""

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def open_dir():
    """A folder the sandbox's uid 65534 can read (pytest's tmp_path lies under a root-only folder)."""
    d = Path(tempfile.mkdtemp(prefix="kernalin-hostile-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
