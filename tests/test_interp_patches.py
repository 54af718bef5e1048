"""The Triton interpreter's int32-typed comparison results (kernalin_ci/runtime/interp_patches.py:int1_comparisons):
a scalar test and-ed with a block mask fails unpatched and computes what the GPU computes patched."""

import json
import os
import subprocess
import sys

from conftest import KERNELS, REPO


def _run(mode: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run(
        [sys.executable, str(KERNELS / "interp_scalar_mask.py"), mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_scalar_comparison_in_a_mask_runs_patched_and_fails_unpatched():
    want = [float(v) for v in range(5)] + [-1.0] * 3 + [float(v) for v in range(8, 13)] + [-1.0] * 3 + [-1.0] * 8
    assert _run("patched") == {"y": want}
    assert "mask has unsupported dtype" in _run("unpatched").get("error", "")
