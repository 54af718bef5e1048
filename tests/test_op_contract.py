"""The Op contract (kernalin_ci/ops/base.py): every op answers it, callers ask it directly.

--case validation through the real CLI, the custom op's root per instance (real files), the
structural analysis an op names, the capture calls in preference order, and the benchmark's row
labels from the shape's inputs."""

import json

import pytest
from conftest import KERNELS, cli

from kernalin_ci.ops import NAMES, get_op
from kernalin_ci.ops.base import Op, resolve_params

ATT = str(KERNELS / "torch_attention.py")
STRUCTURAL = ("attention.decode", "attention.decode_paged", "rope", "kv_append", "decode_step")


def resolved(name, raw=None):
    return resolve_params(name, get_op(name).params, raw or {})


def test_every_op_is_an_op_and_each_call_gives_a_new_instance():
    for name in NAMES:
        op = get_op(name)
        assert isinstance(op, Op) and op.name == name
        assert get_op(name) is not op


@pytest.mark.parametrize(
    "op, dims, message",
    [
        (
            "attention.decode",
            {"Hq": 3, "Hkv": 2, "D": 8, "kv_lens": [1], "scale": 0.3},
            "--case: Hq must be a positive multiple of Hkv",
        ),
        (
            "attention.decode",
            {"Hq": 4, "Hkv": 2, "D": 8, "kv_lens": [4, 0], "scale": 0.3},
            "--case: kv_lens must be a non-empty list of lengths >= 1",
        ),
        (
            "attention.decode_paged",
            {"Hq": 4, "Hkv": 2, "kv_lens": [4], "scale": 0.3},
            "--case: D must be a positive integer",
        ),
        ("rope", {"T": 3, "Hq": 4, "D": 64}, "--case: Hkv must be a positive integer"),
        (
            "kv_append",
            {"T": 3, "Hkv": 2, "D": 64, "num_blocks": 4, "padding": 5},
            "--case: padding must be an integer from 0 to T (or give slots)",
        ),
    ],
)
def test_a_case_outside_the_ops_shape_rules_is_a_usage_error(op, dims, message):
    case = json.dumps({"name": "by-hand", "dims": dims})
    r = cli("verify", "--op", op, "--entry", f"{ATT}:entry", "--device", "cpu", "--quiet", "--case", case)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"kernalin-ci verify: error: {message}"]


def test_every_generated_case_passes_its_ops_shape_rules():
    """A finding's reproduce command hands its case back through --case: it must be accepted."""
    for name in STRUCTURAL:
        op = get_op(name)
        p = resolved(name)
        for device in ("cpu", "cuda"):
            for case in op.cases(p, device, None) + [op.probe(p, None)]:
                assert op.validate_case(case) is None, (name, case)


def test_the_custom_op_resolves_its_callables_against_its_own_root(tmp_path):
    import torch

    for sign, sub in ((1.0, "a"), (-1.0, "b")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "spec.py").write_text(
            f"def reference(x):\n    return {sign} * x\n\n"
            "def inputs(seed, case):\n    import torch\n    return {'x': torch.full((2, 3), float(seed))}\n"
        )
    p = resolved("custom", {"reference": "spec.py:reference", "inputs": "spec.py:inputs"})
    a, b = get_op("custom", root=str(tmp_path / "a")), get_op("custom", root=str(tmp_path / "b"))
    case = a.cases(p, "cpu", None)[1]
    kw = a.inputs(case, p, "cpu")
    assert torch.equal(kw["x"], torch.full((2, 3), float(case.seed)))
    assert torch.equal(a.reference(kw, p).tensors["out"], kw["x"].double())
    assert torch.equal(b.reference(kw, p).tensors["out"], -kw["x"].double())
    assert a.root == str(tmp_path / "a") and get_op("custom").root is None


def test_each_op_names_its_structural_analysis():
    from kernalin_ci.verify.structural import analysis_of, verify_structural

    for name in STRUCTURAL:
        analysis = analysis_of(get_op(name))
        assert analysis is not None and callable(analysis.model) and callable(analysis.analyze)
    assert analysis_of(get_op("kv_append")).store_bounds is False  # it judges the write set itself
    assert analysis_of(get_op("custom")) is None
    findings, notices, status = verify_structural("custom", f"{ATT}:entry", resolved("custom"))
    assert findings == [] and notices == []
    assert (status.status, status.cause) == ("not-analysed", "no structural checks for op custom")


def test_capture_calls_come_in_preference_order():
    for name in STRUCTURAL:
        op = get_op(name)
        cases = op.capture_cases(resolved(name))
        assert [c.dims["D"] for c in cases] == [48, 64], name  # a head dim with a tail first, then a power of two
        assert all(c.dtype == ("float32" if name in ("rope", "decode_step") else "float16") for c in cases)
        assert [c.dims["D"] for c in op.capture_cases(resolved(name, {"head_dim": 80}))] == [80]
    assert get_op("custom").capture_cases(resolved("custom")) == []


def test_bench_disagreement_names_the_row_for_every_op():
    from kernalin_ci.bench.shapes import bench_cases
    from kernalin_ci.bench.timing import disagreement

    op = get_op("rope")
    p = resolved("rope")
    case = bench_cases("rope", p, "cpu", {})[0]
    kw = op.inputs(case, p, "cpu", poison=False)
    ref = {"q": kw["q"].clone(), "k": kw["k"].clone()}
    got = {"q": kw["q"].clone(), "k": kw["k"].clone()}
    got["k"][2, 1] *= -1.0  # token 2, head 1
    why = disagreement(op, case, kw, ref, got, exact=False)
    assert why is not None and f"k[t=2, h=1] (position {int(kw['positions'][2])})" in why
