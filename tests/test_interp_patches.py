"""The Triton interpreter patches (kernalin_ci/runtime/interp_patches.py): int32-typed comparison results (a
scalar test and-ed with a block mask fails unpatched and computes what the GPU computes patched),
libdevice.pow, aliased language builtins, FP8 conversions and `and` / `or` between blocks."""

import json
import os
import subprocess
import sys

import pytest
from conftest import KERNELS, REPO


def _run(script: str, mode: str) -> dict:
    """The last line of a test kernel script (tests/kernels/interp_*.py) run under the interpreter, as JSON."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run(
        [sys.executable, str(KERNELS / script), mode],
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
    assert _run("interp_scalar_mask.py", "patched") == {"y": want}
    assert "mask has unsupported dtype" in _run("interp_scalar_mask.py", "unpatched").get("error", "")


def test_boolean_operators_on_blocks_are_elementwise_patched_and_not_unpatched():
    """`hi < w and w <= lo` on blocks is the elementwise conjunction, as compiled (xformers' Llama-3.1 band);
    unpatched the interpreter takes a block as true and gives `w <= lo` alone (and `w < hi` for the `or`)."""
    got = {mode: _run("interp_bool_ops.py", mode)["flags"] for mode in ("patched", "unpatched")}
    # w = 0..7, band (2, 5]: mid at 3, 4, 5; out (w < 2 or w > 5) at 0, 1, 6, 7; the scalar test true (4)
    assert got["patched"] == [6, 6, 4, 5, 5, 5, 6, 6], got
    assert got["unpatched"] == [7, 7, 5, 5, 5, 5, 4, 4], got


def test_libdevice_pow_and_aliased_builtins_run_patched_and_fail_unpatched():
    """libdevice.pow runs as its definition (x^y, negative bases with whole exponents, 0^0 = 1) and a
    builtin held under another name (`tl_exp2 = tl.exp2`) runs as the builtin (issue 30: xformers' and
    LMDeploy's kernels); unpatched the interpreter cannot run either."""
    got = _run("interp_pow_alias.py", "patched")
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got["pow"], [2.0**0.5, -8.0, 0.1, 1.0])), got
    assert got["exp2"] == [1.0, 2.0, 0.5, 8.0], got
    raw = _run("interp_pow_alias.py", "unpatched")
    assert str(raw["pow"]).startswith("error") and str(raw["exp2"]).startswith("error"), raw


def _satfinite(x: list[float], dtype) -> list[int]:
    """The GPU's cvt.rn.satfinite: round to nearest even, a finite value past the largest normal saturates."""
    import torch

    top = torch.finfo(dtype).max
    return torch.tensor(x, dtype=torch.float64).clamp(-top, top).to(dtype).view(torch.uint8).tolist()


def test_fp8_conversion_rounds_and_saturates_patched_and_not_unpatched():
    """fp32 -> float8e4nv / float8e5 -> fp32 in a Triton kernel: patched, the stored bytes are the
    round-to-nearest-even, saturating conversion (torch's, on the clamped value) and every byte reads back
    as torch reads it (e4m3's 0x7F is NaN, e5m2's 0x7C inf); unpatched, the interpreter halves the top of a
    binade (124.9 -> 64 in e4m3), so the same comparison fails."""
    import torch

    formats = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    patched = _run("interp_fp8_cast.py", "patched")
    for name, dtype in formats.items():
        got = patched[name]
        assert got["stored"] == _satfinite(got["x"], dtype), name
        want_read = [str(v) for v in torch.tensor(got["stored"], dtype=torch.uint8).view(dtype).float().tolist()]
        assert got["read"] == want_read, name
        every = [str(v) for v in torch.arange(256, dtype=torch.uint8).view(dtype).float().tolist()]
        assert got["every_byte"] == every, name
    assert patched["e4m3"]["stored"][0] == 0x70  # 124.9 -> 128
    assert patched["e5m2"]["stored"][6] == 0x7B  # 4 x the largest normal saturates to it, not inf
    unpatched = _run("interp_fp8_cast.py", "unpatched")
    for name, dtype in formats.items():
        assert unpatched[name]["stored"] != _satfinite(unpatched[name]["x"], dtype), name
    assert unpatched["e4m3"]["stored"][0] == 0x68  # 64: the carry or-ed into an odd exponent


def test_a_launch_patches_the_language_once_whatever_device_functions_it_calls():
    """The interpreter repatches the whole language at every device function call (3 programs x 2 calls:
    6 more walks of `triton.language`, 40% of an interpreted attention kernel's time); inside the launch the
    launch's patch is in force, so the calls' patches are skipped, and the result (an aliased builtin in a
    device function included) is the same."""
    got = _run("interp_nested_calls.py", "patched")
    assert got["patches"] == 1, got
    assert got["y"] == pytest.approx([2.0 ** (2 * i / 4) for i in range(12)], rel=1e-6), got
