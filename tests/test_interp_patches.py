"""The Triton interpreter patches (kernalin_ci/runtime/interp_patches.py): int32-typed comparison results (a
scalar test and-ed with a block mask fails unpatched and computes what the GPU computes patched),
libdevice.pow and aliased language builtins."""

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


def _run_pow_alias(mode: str) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run(
        [sys.executable, str(KERNELS / "interp_pow_alias.py"), mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_libdevice_pow_and_aliased_builtins_run_patched_and_fail_unpatched():
    """libdevice.pow runs as its definition (x^y, negative bases with whole exponents, 0^0 = 1) and a
    builtin held under another name (`tl_exp2 = tl.exp2`) runs as the builtin (issue 30: xformers' and
    LMDeploy's kernels); unpatched the interpreter cannot run either."""
    got = _run_pow_alias("patched")
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got["pow"], [2.0**0.5, -8.0, 0.1, 1.0])), got
    assert got["exp2"] == [1.0, 2.0, 0.5, 8.0], got
    raw = _run_pow_alias("unpatched")
    assert str(raw["pow"]).startswith("error") and str(raw["exp2"]).startswith("error"), raw
