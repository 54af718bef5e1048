"""The type checker, as CI runs it: mypy, strict on kernalin_ci/ops and the worker boundary (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ops_and_the_worker_boundary_pass_the_strict_type_check():
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout + r.stderr
