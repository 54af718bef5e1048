"""The linters, as CI runs them and as .pre-commit-config.yaml runs them before a commit: `ruff check`
and `ruff format --check` over the repository (configured in pyproject.toml, [tool.ruff]). mypy is
tests/test_typecheck.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Rules whose findings are all mechanical and auto-fixable, left for one pass over the merged tree
# (`ruff check --fix .`) so that parallel branches do not collide on import blocks.
# COORDINATOR: after that pass, set DEFERRED = ().
DEFERRED = ()
# `ruff format` is configured but the tree is not formatted yet (the same reason).
# COORDINATOR: after `ruff format .`, set FORMATTED = True.
FORMATTED = True


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    deferred = ["--ignore", ",".join(DEFERRED)] if DEFERRED else []
    r = ruff("check", "--no-cache", "--output-format", "concise", *deferred, ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_check_passes():
    if not FORMATTED:
        pytest.skip("the tree is not formatted yet: `ruff format .` once, then FORMATTED = True in tests/test_lint.py")
    r = ruff("format", "--check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_pre_commit_runs_what_ci_runs():
    """The pre-commit hooks are the same three commands: ruff check, ruff format, mypy (configured in
    pyproject.toml, so the hooks and CI read one configuration)."""
    cfg = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    entries = [h["entry"].split()[:2] for repo in cfg["repos"] for h in repo["hooks"]]
    assert entries == [["ruff", "check"], ["ruff", "format"], ["mypy"]], entries
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "[tool.ruff.lint]" in pyproject and "[tool.ruff.format]" in pyproject and "[tool.mypy]" in pyproject
