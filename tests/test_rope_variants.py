"""RoPE variants (docs/ops.md, rope): scaled frequency tables (linear, Llama-3, YaRN) and M-RoPE sections,
their float64 definitions checked against hand-computed values at the places where they matter (the band
edges, the ramp, the section boundaries), and their params' validation (exit 2, one line)."""

import math
import subprocess
import sys

import pytest
import torch

from kernalin_ci.errors import UsageError
from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import resolve_params
from kernalin_ci.ops.rope import plain_theta, scaled_theta, spec_of

LLAMA31 = {"base": 500000.0, "scaling": "llama3", "scaling_factor": 8.0, "original_max_position": 8192}
QWEN_YARN = {"base": 1000000.0, "scaling": "yarn", "scaling_factor": 4.0, "original_max_position": 32768}


def params(**raw):
    return resolve_params("rope", get_op("rope").params, raw)


def test_llama3_bands():
    """Llama-3.1 (r 128): wavelengths under 2048 kept, over 8192 divided by 8, the blend between."""
    theta, mag = scaled_theta(params(**LLAMA31), 128)
    plain = plain_theta(500000.0, 128)
    assert mag == 1.0
    for i in range(64):
        w = 2 * math.pi / float(plain[i])
        if w < 2048:
            want = float(plain[i])
        elif w > 8192:
            want = float(plain[i]) / 8
        else:
            s = (8192 / w - 1) / (4 - 1)
            want = (1 - s) * float(plain[i]) / 8 + s * float(plain[i])
        assert float(theta[i]) == pytest.approx(want, rel=1e-12), i
    kept = [i for i in range(64) if 2 * math.pi / float(plain[i]) < 2048]
    divided = [i for i in range(64) if 2 * math.pi / float(plain[i]) > 8192]
    assert kept == list(range(kept[-1] + 1)) and divided == list(range(divided[0], 64))
    assert divided[0] - kept[-1] > 1  # a medium band exists between the two edges


def test_yarn_ramp_and_magnitude():
    """YaRN (Qwen2.5's factor 4, original 32768, base 1e6, r 128): correction range 23..40, frequencies
    below index 23 kept, from 40 on divided by 4, linear between; magnitude 0.1 ln 4 + 1."""
    p = params(**QWEN_YARN)
    theta, mag = scaled_theta(p, 128)
    plain = plain_theta(1e6, 128)
    assert mag == pytest.approx(0.1 * math.log(4) + 1)
    ratio = (theta / plain).tolist()
    assert all(r == pytest.approx(1.0) for r in ratio[:24])
    assert all(r == pytest.approx(0.25) for r in ratio[40:])
    for i in range(24, 40):
        ramp = (i - 23) / 17
        assert ratio[i] == pytest.approx(1 - ramp + ramp / 4), i
    assert scaled_theta(params(**QWEN_YARN, attention_factor=1.0), 128)[1] == 1.0


def test_linear_and_none():
    assert torch.equal(scaled_theta(params(base=10000.0), 64)[0], plain_theta(10000.0, 64))
    theta = scaled_theta(params(scaling="linear", scaling_factor=4.0), 64)[0]
    assert torch.allclose(theta * 4, plain_theta(10000.0, 64))


def test_mrope_sections_take_their_rows():
    """Qwen2-VL [16, 24, 24]: frequencies 0..15 from row 0, 16..39 from row 1, 40..63 from row 2."""
    spec = spec_of(params(base=1e6, mrope_section=[16, 24, 24]), 128)
    assert spec.r == 128
    pos = torch.tensor([[5], [700], [9000]])
    a = spec.angles(pos)[0]
    theta = plain_theta(1e6, 128)
    for i, row in ((0, 5), (15, 5), (16, 700), (39, 700), (40, 9000), (63, 9000)):
        assert float(a[i]) == pytest.approx(row * float(theta[i])), i
    x = torch.randn(1, 2, 128, dtype=torch.float64)
    same = spec.rotate(x, torch.tensor([[77], [77], [77]]))
    plain = spec_of(params(base=1e6), 128).rotate(x, torch.tensor([77]))
    assert torch.allclose(same, plain)  # a text token: every row equal, plain RoPE


def test_reference_passes_itself_and_the_fingerprints_differ():
    """The reference's own outputs pass the properties (YaRN's magnitude included) on every case."""
    op = get_op("rope")
    for raw in (QWEN_YARN, LLAMA31, {"base": 1e6, "mrope_section": [16, 24, 24]}):
        p = params(**raw)
        for case in op.cases(p, "cpu", "float32"):
            kw = op.inputs(case, p, "cpu")
            ref = op.reference(kw, p).tensors
            assert op.properties(case, kw, ref, p) == [], (raw, case.name)
            fps = op.fingerprints(kw, p, case)
            assert any(cls == "rope-frequency" for cls, _ in fps) or "mrope_section" in raw


def _named(raw: dict, wrong) -> list[str]:
    """The classes check_reference gives an output rotated by `wrong` (a RopeSpec) at the first scaled or
    multi-section case."""
    from kernalin_ci.verify.reference import check_reference

    op, p = get_op("rope"), params(**raw)
    case = next(c for c in op.cases(p, "cpu", "float32") if c.name in ("beyond-original", "mrope-sections"))
    kw = op.inputs(case, p, "cpu")
    outs = {n: wrong.rotate(kw[n], kw["positions"]).to(torch.float32) for n in ("q", "k")}
    return [f.bug_class for f in check_reference(op, case, kw, outs, p, {})]


def test_a_section_boundary_off_by_one_and_a_llama3_band_edge_mixed_up_are_named():
    """vLLM's M-RoPE with its height/width boundary one frequency late (sections [16, 25, 23]) is `rope-position`;
    Llama-3.1's table with its low-frequency edge from the high factor (xformers' band-edge mutant) is
    `rope-frequency`: both were `wrong-output` before their fingerprints."""
    mrope = {"base": 1e6, "mrope_section": [16, 24, 24]}
    assert _named(mrope, spec_of(params(**mrope), 128).replace(sections=(16, 25, 23))) == ["rope-position"] * 2
    p = params(**LLAMA31)
    plain = plain_theta(500000.0, 128)
    collapsed = torch.where(2 * math.pi / plain > 8192 / 4, plain / 8, plain)
    assert _named(LLAMA31, spec_of(p, 128).replace(theta=collapsed)) == ["rope-frequency"] * 2


@pytest.mark.parametrize(
    "raw, line",
    [
        ({"scaling": "llama3"}, "op rope: param scaling=llama3 needs scaling_factor"),
        ({"scaling": "yarn", "scaling_factor": "4"}, "op rope: param scaling=yarn needs original_max_position"),
        ({"scaling": "ntk"}, "op rope: param scaling='ntk' must be one of none, linear, llama3, yarn"),
        ({"scaling": "linear", "scaling_factor": "0.5"}, "op rope: param scaling_factor=0.5: must be >= 1"),
        (
            {"mrope_section": "[16, 24]", "rotary_dim": "128"},
            "op rope: param mrope_section [16, 24] must sum to rotary_dim / 2 = 64",
        ),
        (
            {"mrope_section": "[0, 4]"},
            "op rope: param mrope_section=[0, 4]: must be a non-empty list of positive integers",
        ),
        (
            {"scaling": "llama3", "scaling_factor": "8", "original_max_position": "8192", "low_freq_factor": "4"},
            "op rope: param high_freq_factor must be greater than low_freq_factor (llama3)",
        ),
    ],
)
def test_bad_params_are_usage_errors(raw, line):
    with pytest.raises(UsageError) as e:
        params(**raw)
    assert str(e.value) == line


def test_bad_param_on_the_command_line_exits_2():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernalin_ci",
            "verify",
            "--op",
            "rope",
            "--entry",
            "x.py:entry",
            "--param",
            "scaling=yarn",
            "--param",
            "scaling_factor=4",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "kernalin-ci verify: error: op rope: param scaling=yarn needs original_max_position"
    ], r.stderr
