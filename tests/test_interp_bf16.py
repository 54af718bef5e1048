"""bfloat16 under the Triton CPU interpreter: computed on values and rounded like the hardware
(kernalin_ci/runtime/interp_bf16.py), checked bit for bit against torch on real Triton kernels."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import KERNELS, REPO

from kernalin_ci.runtime.interp_bf16 import _to_bf16_bits

ARITH = str(KERNELS / "interp_arith.py")


@pytest.fixture(scope="module")
def runs():
    """The probe kernels with and without the patch (two fresh interpreter processes, run at once)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    procs = {
        mode: subprocess.Popen(
            [sys.executable, ARITH, mode], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for mode in ("patched", "unpatched")
    }
    out = {}
    for mode, p in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr[-3000:]
        out[mode] = json.loads(stdout.strip().splitlines()[-1])
    return out


def test_patched_bf16_arithmetic_matches_torch_bit_for_bit(runs):
    r = runs["patched"]
    assert r["status"] is None  # the self-test passed after patching
    wrong = [op for op, same in r["bfloat16"]["results"].items() if not same]
    assert wrong == []
    assert r["bfloat16"]["unfaithful_after_arithmetic"] is None


def test_the_unpatched_interpreter_computes_bf16_on_bit_patterns(runs):
    r = runs["unpatched"]
    res = r["bfloat16"]["results"]
    for op in (
        "add",
        "mul",
        "mul_add",
        "fma",
        "cast_from_float32",
        "compare_where",
        "dot",
        "dot_p_to_value_dtype",
        "sum",
        "argmax",
    ):
        assert res[op] is False, op
    assert r["self_test"] and r["self_test"].startswith("constant:")  # the self-test sees it


def test_float16_is_faithful_with_and_without_the_patch(runs):
    for mode in ("patched", "unpatched"):
        assert all(runs[mode]["float16"]["results"].values()), mode


def test_a_bf16_atomic_is_recorded_as_unfaithful(runs):
    b = runs["patched"]["bfloat16"]
    assert "Unsupported data type" in b["atomic"]  # the interpreter cannot run it at all
    assert b["unfaithful_after_atomic"] == "the Triton interpreter has no bfloat16 atomic read-modify-write"
    assert runs["patched"]["float16"]["unfaithful_after_atomic"] is None


def _torch_bits(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_rounding_float32_to_bf16_matches_torch_on_every_kind_of_value():
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 2**32, (200000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    ties = (torch.randint(0, 2**16, (1000,), generator=g, dtype=torch.int32) << 16 | 0x8000).view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 3.4028235e38, -3.4028235e38, 1e-45, 1e-39])
    x = torch.cat([x, ties, special])
    finite = ~torch.isnan(x)
    got = _to_bf16_bits(x.numpy())
    assert np.array_equal(got[finite.numpy()], _torch_bits(x[finite]))
    assert (got[~finite.numpy()] == 0x7FFF).all()  # a computed NaN is the canonical NaN


def test_rounding_float64_to_bf16_is_a_single_rounding():
    # 1 + 2^-8 + 2^-30 is just above a bfloat16 tie: rounding through float32 first (a tie there) goes
    # down to even, a single rounding goes up
    x = np.array([1 + 2.0**-8 + 2.0**-30, -(1 + 2.0**-8 + 2.0**-30), 1 + 2.0**-8, 3.0e38 * 1.2])
    assert [hex(v) for v in _to_bf16_bits(x)] == ["0x3f81", "0xbf81", "0x3f80", "0x7f80"]
    assert [hex(v) for v in _to_bf16_bits(x[:2].astype(np.float32))] == ["0x3f80", "0xbf80"]


def test_rounding_toward_zero_truncates():
    x = np.array([1 + 255 * 2.0**-16, -(1 + 255 * 2.0**-16), 3.5e38], dtype=np.float64)
    assert [hex(v) for v in _to_bf16_bits(x, toward_zero=True)] == ["0x3f80", "0xbf80", "0x7f7f"]


def test_a_case_the_interpreter_cannot_run_is_not_checked_instead_of_a_finding():
    """The bfloat16 cases of a correct kernel that writes with tl.atomic_add: not checked, with the
    interpreter's reason (unpatched, the interpreter's 'Unsupported data type' made each an entry-error)."""
    from conftest import cli

    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        "tests/kernels/rope_atomic.py:entry",
        "--device",
        "cpu",
        "--only",
        "dynamic",
        "--dtype",
        "bfloat16",
        "--json",
        "-",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["findings"] == []
    assert "the Triton interpreter has no bfloat16 atomic read-modify-write" in r.stdout + r.stderr


BF16_KERNELS = [
    ("rope", "checks/rope/correct_bf16_math.py"),
    ("attention.decode", "checks/attention_decode/correct_bf16_dot.py"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("op,path", BF16_KERNELS, ids=[p for _, p in BF16_KERNELS])
@pytest.mark.parametrize("dtype", [None, "bfloat16"], ids=["default-cases", "all-bfloat16"])
def test_the_catalogue_kernels_that_compute_in_bf16_pass_on_the_gpu(op, path, dtype):
    from conftest import cli

    extra = ["--dtype", dtype] if dtype else []
    r = cli("verify", "--op", op, "--entry", f"{path}:entry", "--device", "cuda", *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
