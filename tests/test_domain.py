"""The shape domain (docs/verification.md, "Shape domain"): declared or discovered shapes, "unsupported,
not checked" with the kernel's own error, coverage, and the structural status. Real Triton kernels under
the interpreter in real worker processes; small cases so each test takes seconds."""

from __future__ import annotations

import json

import pytest
from conftest import KERNELS, cli

from kernalin_ci import config as config_mod
from kernalin_ci import domain as dm
from kernalin_ci.errors import UsageError
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case, resolve_params

POW2 = str(KERNELS / "triton_pow2_attention.py")
TORCH_ATT = str(KERNELS / "torch_attention.py")
OP = "attention.decode"


def small(name, D, lens, dtype="float32", hq=8, hkv=2, seed=1, **extra):
    return Case(name, {"Hq": hq, "Hkv": hkv, "D": D, "kv_lens": lens, "scale": D**-0.5, **extra}, dtype, seed)


def run(entry, cases, domain=None, main_dtype="float32"):
    """The real dynamic worker over `cases`, as verify() drives it; returns (findings, ran, not checked)."""
    from kernalin_ci.jobs import DynamicJob
    from kernalin_ci.verify import _not_checked
    from kernalin_ci.verify.judge import CaseReader
    from kernalin_ci.verify.supervisor import Progress, run_cases

    op = get_op(OP)
    params = resolve_params(OP, op.params, {})
    dom = domain or dm.Domain()
    job = DynamicJob(op=OP, entry=entry, root=None, params=params, poison=True, domain=dom, main_dtype=main_dtype)
    reader = CaseReader(op, params, dom, main_dtype, "cpu", poison=True, root=None)
    res = run_cases(job, cases, "cpu", 300.0, Progress(False, len(cases), OP), lambda c: "", reader)
    return res.findings, res.ran, _not_checked(op, params, cases, res.not_checked)


def test_power_of_two_kernel_at_D80_is_unsupported_not_a_finding():
    op = get_op(OP)
    params = resolve_params(OP, op.params, {})
    planned = [small("tiles", 64, [1, 15, 16, 17, 33]), small("odd", 80, [3, 40], seed=2)]
    cases = planned + dm.shape_cases(op, params, dm.Domain(), planned, "float32")
    assert [c.name for c in cases[2:]] == ["shape-D96", "shape-D128", "shape-D256"]  # the usual D not planned
    findings, ran, refused = run(f"{POW2}:entry", cases)
    assert findings == []
    by_shape = {n.shape: n for n in refused}
    assert set(by_shape) == {"D=80 Hq=8 Hkv=2 float32", "D=96 Hq=8 Hkv=2 float32"}
    for n in refused:
        assert n.reason == "unsupported" and "arange's range must be a power of 2" in n.error
    # the planned case at D=80 still ran, at the nearest head dim the kernel takes; a shape case keeps its D
    assert (by_shape["D=80 Hq=8 Hkv=2 float32"].cases, by_shape["D=80 Hq=8 Hkv=2 float32"].instead) == (
        ["odd"],
        "D=64 Hq=8 Hkv=2 float32",
    )
    assert (by_shape["D=96 Hq=8 Hkv=2 float32"].cases, by_shape["D=96 Hq=8 Hkv=2 float32"].instead) == (
        ["shape-D96"],
        None,
    )
    cov = dm.coverage(op, ran, params)
    assert cov.head_dims == [64, 128, 256] and cov.dtypes == ["float32"] and cov.kv_lens == [1, 40]


def test_a_refused_dtype_runs_the_case_in_a_dtype_the_kernel_takes():
    cases = [small("main", 64, [5, 20]), small("sweep-bf16", 64, [5, 20], dtype="bfloat16", seed=3)]
    findings, ran, refused = run(f"{POW2}:entry_fp16_only", cases)
    assert findings == []
    main = next(n for n in refused if n.cases == ["main"])
    assert main.instead == "D=64 Hq=8 Hkv=2 float16"
    assert "only float16 is supported, got torch.float32" in main.error
    sweep = next(n for n in refused if n.cases == ["sweep-bf16"])  # a sweep case keeps its dtype: not run
    assert sweep.instead is None and "torch.bfloat16" in sweep.error
    assert [(c.name, c.dtype) for c in ran] == [("main", "float16")]


def test_an_error_at_a_declared_shape_is_a_finding():
    dom = dm.Domain(head_dim=(64,), num_q_heads=(8,), num_kv_heads=(2,), dtype=("float32",))
    findings, ran, refused = run(f"{POW2}:entry_fp16_only", [small("main", 64, [5, 20])], dom)
    assert refused == []  # declared: never "unsupported"
    assert [(f.bug_class, f.check) for f in findings] == [("entry-error", "call")]
    assert "only float16 is supported" in findings[0].message


def test_an_error_at_a_shape_the_kernel_takes_is_a_finding(tmp_path):
    src = tmp_path / "long_fails.py"
    src.write_text(
        f"import sys\nsys.path.insert(0, {str(KERNELS)!r})\n"
        "from triton_pow2_attention import entry as good\n\n\n"
        "def entry(q, k_cache, v_cache, kv_lens, scale):\n"
        "    if int(kv_lens.max()) > 100:\n"
        "        raise RuntimeError('sequence too long for the scratch buffer')\n"
        "    return good(q, k_cache, v_cache, kv_lens, scale)\n"
    )
    findings, ran, refused = run(f"{src}:entry", [small("long", 64, [5, 300])])
    assert refused == []  # the probe at this shape ran: the kernel takes D=64, the error is this case's
    assert [f.bug_class for f in findings] == ["entry-error"]
    assert "sequence too long" in findings[0].message


def test_a_real_bug_is_still_found_at_the_shapes_the_kernel_takes():
    cases = [small("large-scores", 80, [2, 16, 100], qk_std=6.5)]  # D=80 refused: runs at D=64 instead
    findings, ran, refused = run(f"{POW2}:entry_no_max", cases)
    assert refused[0].instead == "D=64 Hq=8 Hkv=2 float32"
    assert findings and findings[0].bug_class in ("softmax-no-max", "non-finite")
    assert findings[0].case["dims"]["D"] == 64  # the finding names the shape it was seen at


def test_a_declared_domain_moves_every_case_inside_it():
    op = get_op(OP)
    dom, params = dm.resolve(op, {}, {"head_dim": 128, "dtype": ["float16"]})
    params = resolve_params(OP, op.params, params)
    plan = dm.plan(op, params, dom, op.cases(params, "cpu", "float16"), "float16")
    assert {c.dims["D"] for c in plan} == {128} and {c.dtype for c in plan} == {"float16"}
    assert not any(c.name.startswith("shape-") for c in plan)  # every declared value is already in the plan
    two, p2 = dm.resolve(op, {}, {"head_dim": [80, 128], "num_q_heads": 32, "num_kv_heads": 8})
    p2 = resolve_params(OP, op.params, p2)
    plan2 = dm.plan(op, p2, two, op.cases(p2, "cpu", None), "float32")
    assert {c.dims["D"] for c in plan2} == {80, 128}
    assert {(c.dims["Hq"], c.dims["Hkv"]) for c in plan2} == {(32, 8)}
    for c in plan2:  # the softmax scale follows the head dim
        assert round(c.dims["scale"] / c.dims["D"] ** -0.5, 9) in (0.7, 1.0)


def test_a_declared_head_dim_runs_only_at_that_head_dim():
    op = get_op(OP)
    dom, params = dm.resolve(op, {}, {"head_dim": [128]})
    params = resolve_params(OP, op.params, params)
    plan = dm.plan(op, params, dom, op.cases(params, "cpu", "float32"), "float32")
    assert {c.dims["D"] for c in plan} == {128} and not any(c.name.startswith("shape-") for c in plan)
    some = [c for c in plan if c.name in ("gqa-8", "gqa-6", "large-scores")]
    findings, ran, refused = run(f"{POW2}:entry", some, dom)
    assert findings == [] and refused == []
    assert dm.coverage(op, ran, params).head_dims == [128]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--domain", "head_dim=0"], "--domain head_dim: 0 is not a positive integer"),
        (["--domain", "colour=red"], "--domain colour: unknown key for op attention.decode"),
        (["--domain", "dtype=float64"], "--domain dtype: 'float64' is not one of float32, float16, bfloat16"),
        (["--domain", "head_dim"], "--domain 'head_dim': expected KEY=VALUE"),
        (["--domain", "num_q_heads=12", "--domain", "num_kv_heads=8"], "12 is not a multiple of any num_kv_heads"),
        (["--domain", "head_dim=128", "--param", "head_dim=64"], "param head_dim=64 is outside the declared domain"),
    ],
)
def test_bad_domain_on_the_command_line_is_exit_2(args, message):
    r = cli("verify", "--op", OP, "--entry", f"{POW2}:entry", "--device", "cpu", "--only", "dynamic", *args)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "domain, where",
    [
        ("    domain:\n      head_dim: [64, 0]\n", "k.yml:6: kernels[0].domain.head_dim: 0 is not a positive integer"),
        ("    domain:\n      dtype: fp8\n", "k.yml:6: kernels[0].domain.dtype: 'fp8' is not one of"),
        ("    domain:\n      rotary: 64\n", "k.yml:6: kernels[0].domain.rotary: unknown key for op attention.decode"),
        ("    domain: [64]\n", "k.yml:5: kernels[0].domain: expected a mapping"),
        (
            "    params: {head_dim: 64}\n    domain:\n      head_dim: 128\n",
            "k.yml:7: kernels[0].domain.head_dim: param head_dim=64 is outside the declared domain (128)",
        ),
    ],
)
def test_bad_domain_in_the_config_names_file_line_and_key(domain, where):
    text = f"kernels:\n  - name: a\n    op: {OP}\n    entry: a.py:entry\n" + domain
    with pytest.raises(UsageError) as e:
        config_mod.parse(text, "k.yml")
    assert str(e.value).startswith(where), str(e.value)


def test_config_domain_and_fail_on_not_analysed():
    cfg = config_mod.parse(
        f"kernels:\n  - name: a\n    op: {OP}\n    entry: a.py:entry\n"
        "    domain: {head_dim: [64, 128], dtype: float16}\n"
        "gate:\n  fail_on: [finding, not-analysed]\n",
        "k.yml",
    )
    assert cfg.kernels[0].domain == {"head_dim": [64, 128], "dtype": "float16"}
    assert cfg.gate.fail_on == ("finding", "not-analysed")


def verify_json(*args):
    r = cli("verify", *args, "--device", "cpu", "--quiet", "--json", "-")
    assert r.returncode in (0, 1), r.stderr
    return r, json.loads(r.stdout)


def test_structural_capture_moves_to_a_head_dim_that_compiles():
    r, out = verify_json("--op", OP, "--entry", f"{POW2}:entry", "--only", "structural")
    st = out["structural"]
    assert (st["status"], st["cause"], st["shape"]) == ("analysed", None, "D=64 float16 Hq=6 Hkv=2"), st
    r, out = verify_json(
        "--op",
        OP,
        "--entry",
        f"{POW2}:entry",
        "--only",
        "structural",
        "--domain",
        "head_dim=128",
        "--domain",
        "dtype=float32",
    )
    assert out["structural"]["shape"] == "D=128 float32 Hq=6 Hkv=2"
    assert "structural: analysed at D=128 float32" in r.stderr


def test_a_kernel_whose_structure_is_not_analysed_can_fail_the_gate():
    from kernalin_ci.config import Config, Gate, Kernel
    from kernalin_ci.findings import VerifyResult
    from kernalin_ci.gate.run import conclude, judge
    from kernalin_ci.report.model import KernelReport, Report

    r, out = verify_json("--op", OP, "--entry", f"{TORCH_ATT}:entry", "--only", "structural")
    assert out["verdict"] == "pass" and out["structural"]["status"] == "not-analysed"
    assert "the entry launched no Triton kernel" in out["structural"]["cause"]
    assert "structural: not analysed (" in r.stderr
    kr = KernelReport("a", OP, "a.py:entry", "changed", verification=VerifyResult.from_json(out))
    kernels = [Kernel("a", OP, "a.py:entry")]
    assert judge(kr, Config("k.yml", kernels), "cpu") == []  # the default: shown, not gating
    strict = Config("k.yml", kernels, Gate(fail_on=("finding", "not-analysed")))
    kr.failed_by = judge(kr, strict, "cpu")
    assert kr.failed_by == ["not-analysed"]
    report = Report("success", "", {}, {}, "cpu", {}, kernels=[kr])
    assert conclude(report) == ("failure", "failed: a (not-analysed)")
    kr.failed_by = []
    assert conclude(report)[1] == "1 kernel verified; structure not analysed: a"


def test_a_structural_gap_fails_the_gate_that_requires_the_analysis():
    """`not-analysed` in fail_on requires the analysis in whole: a kernel analysed with a property it could
    not verify (a gap) fails it too; by default the gap is shown, not gating (issue 30, item 3)."""
    from kernalin_ci.config import Config, Gate, Kernel
    from kernalin_ci.findings import StructuralStatus, VerifyResult
    from kernalin_ci.gate.run import conclude, judge
    from kernalin_ci.report.model import KernelReport, Report

    v = VerifyResult(OP, "a.py:entry", structural=StructuralStatus("analysed", proved=["memory bounds"]))
    kr = KernelReport("a", OP, "a.py:entry", "changed", verification=v)
    kernels = [Kernel("a", OP, "a.py:entry")]
    strict = Config("k.yml", kernels, Gate(fail_on=("finding", "not-analysed")))
    assert judge(kr, strict, "cpu") == []  # analysed in whole
    v.structural.gaps = ["softmax scale: the scores are not recognised as a product of q and k"]
    assert judge(kr, Config("k.yml", kernels), "cpu") == []
    kr.failed_by = judge(kr, strict, "cpu")
    assert kr.failed_by == ["not-analysed"]
    report = Report("success", "", {}, {}, "cpu", {}, kernels=[kr])
    assert conclude(report) == ("failure", "failed: a (not-analysed)")
    kr.failed_by = []
    assert conclude(report)[1] == "1 kernel verified; structure partly analysed (properties not verified): a"


@pytest.mark.slow
def test_verify_end_to_end_reports_coverage_and_what_was_not_checked():
    """The whole plan on the CPU (about half a minute): D=80 and 96 refused and shown, no finding."""
    r, out = verify_json("--op", OP, "--entry", f"{POW2}:entry", "--dtype", "float32")
    assert r.returncode == 0 and out["verdict"] == "pass", out["findings"]
    assert out["coverage"]["head_dims"] == [64, 128, 256] and out["coverage"]["dtypes"] == ["float32"]
    assert out["coverage"]["kv_lens"] == [1, 2048]
    shapes = {n["shape"]: n for n in out["not_checked"]}
    assert set(shapes) == {"D=80 Hq=8 Hkv=2 float32", "D=96 Hq=8 Hkv=2 float32"}
    assert all("arange's range must be a power of 2" in n["error"] for n in shapes.values())
    assert out["structural"]["status"] == "analysed"
    assert "not checked: D=80 Hq=8 Hkv=2 float32: unsupported, not checked: " in r.stderr


@pytest.mark.gpu
def test_on_the_gpu_a_power_of_two_kernel_is_checked_where_it_compiles():
    """On a GPU the refusal is a compile error at launch; the rest is the same as under the interpreter."""
    r = cli("verify", "--op", OP, "--entry", f"{POW2}:entry", "--device", "cuda", "--quiet", "--json", "-")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "pass" and out["coverage"]["head_dims"] == [64, 128, 256]
    # the small head-dim cases take the dtypes in turn (one new specialisation per dtype worker)
    assert {n["shape"] for n in out["not_checked"]} == {"D=80 Hq=8 Hkv=2 float16", "D=96 Hq=8 Hkv=2 bfloat16"}
    r = cli("verify", "--op", OP, "--entry", f"{POW2}:entry_fp16_only", "--device", "cuda", "--quiet", "--json", "-")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["verdict"] == "pass", out["findings"]
    assert out["coverage"]["dtypes"] == ["float16"]
    assert all(n["reason"] == "unsupported" for n in out["not_checked"])
    r = cli("verify", "--op", OP, "--entry", f"{POW2}:entry_no_max", "--device", "cuda", "--quiet", "--json", "-")
    found = {f["bug_class"] for f in json.loads(r.stdout)["findings"]}
    assert r.returncode == 1 and {"softmax-no-max", "non-finite"} & found
