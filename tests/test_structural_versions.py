"""The structural checks on the oldest supported Triton (3.6, the H200 image's) as well as this venv's.

Runs benchmarks/structural_bench.py with the interpreter of a Triton 3.6 virtual environment when one is
present (`.venv-triton36/`, see docs/structural.md), and asserts the same catch matrix as with the current
Triton: every bug fixture caught with its class, no finding on a correct fixture. Skipped without it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY36 = ROOT / ".venv-triton36" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not PY36.exists(), reason="no Triton 3.6 environment at .venv-triton36/")
def test_fixture_matrix_on_triton_36(tmp_path):
    out = tmp_path / "matrix.json"
    files = sorted(str(p) for p in (ROOT / "tests" / "structural_fixtures").glob("*.py"))
    r = subprocess.run(
        [str(PY36), str(ROOT / "benchmarks" / "structural_bench.py"), "--json", str(out), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["triton"].startswith("3.6")
    verdicts = {row["file"]: row["verdict"] for row in data["rows"]}
    assert len(verdicts) == len(files)
    bad = {f: v for f, v in verdicts.items() if v not in ("caught", "clean")}
    assert bad == {}
