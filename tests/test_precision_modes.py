"""Precision the checks hold kernels to: float32 tl.dot on TF32 (recognised from the compiled IR),
and float32 rope held to float32 accuracy with a per-frequency angle allowance."""

import json
from pathlib import Path

import pytest
import torch
from conftest import CHECKS, KERNELS, cli

from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.rope import FLOAT32_TOLERANCE, angle_error, row_slack
from kernalin_ci.verify.precision import tf32_dots

TF32_KERNEL = KERNELS / "tf32_attention.py"


def _lines(path: Path, needle: str) -> list[int]:
    return [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln]


def _ttir(ieee: bool, ptr: str = "*fp32") -> str:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("tf32_attention", TF32_KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = mod._decode_dot.arg_names
    sig = {}
    for n in names:
        if n in ("Q", "K", "V", "Out"):
            sig[n] = ptr
        elif n == "Lens":
            sig[n] = "*i32"
        elif n == "scale":
            sig[n] = "fp32"
        elif n.startswith("s_"):
            sig[n] = "i32"
        else:
            sig[n] = "constexpr"
    consts = {"GROUP": 4, "D": 64, "BLOCK_H": 16, "BLOCK_N": 32, "BLOCK_D": 64, "IEEE": ieee}
    kernel = triton.compile(ASTSource(mod._decode_dot, sig, consts), target=GPUTarget("cuda", 90, 32))
    return kernel.asm["ttir"]


def test_tf32_dots_are_read_from_the_compiled_ir_with_their_lines():
    found = tf32_dots(_ttir(ieee=False))
    assert {Path(loc.path).name for loc in found} == {TF32_KERNEL.name}
    want = [i for i, ln in enumerate(TF32_KERNEL.read_text().splitlines(), 1) if "tl.dot(" in ln and "ieee" not in ln]
    assert len(want) == 2 and sorted(loc.line for loc in found) == want


def test_ieee_dots_are_not_tf32_and_upcast_half_inputs_are():
    assert tf32_dots(_ttir(ieee=True)) == ()
    assert len(tf32_dots(_ttir(ieee=False, ptr="*fp16"))) == 2  # the kernel upcasts: float32 operands


# --------------------------------------------------------------------------- rope


def test_angle_allowance_is_per_frequency_and_grows_with_the_position():
    pos = torch.tensor([0, 1, 1000, 65535])
    err = angle_error(pos, 10000.0, 64)
    assert bool((err[0] == 0).all()) and bool((err[1:, 0] > err[1:, -1] * 1000).all())
    assert float(err[3, 0]) < 0.05 and float(err[1, 0]) < 1e-6  # a few float32 roundings of the angle
    x = torch.randn(4, 2, 64, dtype=torch.float64)
    slack = row_slack(x, pos, "neox", 10000.0, 64)
    assert slack.shape == (8,) and float(slack[:2].max()) == 0.0
    # a cos/sin table in float16 is off by ~1.4e-4 per row: well above what is allowed up to position 100
    small = row_slack(x[:1].expand(3, 2, 64), torch.tensor([7, 31, 100]), "neox", 10000.0, 64)
    assert float(small.max()) + FLOAT32_TOLERANCE < 3e-5


def _case(name):
    op = get_op("rope")
    p = resolve_params("rope", op.params, {"style": "gptj"})
    return json.dumps(next(c for c in op.cases(p, "cpu", "float32") if c.name == name).to_json())


def _verify(entry, *extra):
    r = cli(
        "verify",
        "--op",
        "rope",
        "--entry",
        entry,
        "--device",
        "cpu",
        "--quiet",
        "--only",
        "dynamic",
        "--json",
        "-",
        *extra,
    )
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_float16_cos_sin_table_on_float32_activations_is_a_precision_finding():
    rc, res = _verify(
        f"{CHECKS}/rope/bug_precision_fp16_table.py:entry", "--param", "style=gptj", "--case", _case("positions")
    )
    assert rc == 1 and {f["bug_class"] for f in res["findings"]} == {"precision"}, res["findings"]


@pytest.mark.parametrize("name,style", [("correct_gptj_table", "gptj"), ("correct_neox", "neox")])
def test_correct_float32_rope_stays_clean_at_float32_accuracy(name, style):
    rc, res = _verify(f"{CHECKS}/rope/{name}.py:entry", "--param", f"style={style}", "--case", _case("positions"))
    assert rc == 0, res["findings"]


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_tf32_entry_is_judged_at_tf32_tolerance_with_a_notice_on_the_gpu():
    """kernalin-ci verify on cuda: the default-precision kernel passes with the TF32 notice naming its dot's line;
    the ieee kernel passes without one."""
    line = _lines(TF32_KERNEL, "tl.dot(q, tl.trans(k)) * scale")[0]
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{TF32_KERNEL}:entry",
        "--device",
        "cuda",
        "--only",
        "dynamic",
        "--dtype",
        "float32",
        "--quiet",
        "--json",
        "-",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    notes = [n["message"] for n in res["notices"] if n["check"] == "tf32"]
    assert notes and "float32 judged at TF32 tolerance" in notes[0] and f"tf32_attention.py:{line}" in notes[0]
    r = cli(
        "verify",
        "--op",
        "attention.decode",
        "--entry",
        f"{TF32_KERNEL}:entry_ieee",
        "--device",
        "cuda",
        "--only",
        "dynamic",
        "--dtype",
        "float32",
        "--quiet",
        "--json",
        "-",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [n for n in json.loads(r.stdout)["notices"] if n["check"] == "tf32"]
