"""The reference comparison's tolerance: rope allows the float32 rounding of the angle p * inv_freq,
which grows with the position, and nothing like the error of a real rope bug."""

import torch

from kernalin_ci.ops import get_op
from kernalin_ci.ops.base import Case
from kernalin_ci.ops.rope import rotate
from kernalin_ci.verify.reference import check_reference

ROPE = get_op("rope")
PARAMS = {"style": "neox", "base": 10000.0, "rotary_dim": None, "max_position": 65536}
T, H, D = 4, 2, 64


def inputs(position):
    g = torch.Generator().manual_seed(0)
    return {
        "q": torch.randn(T, H, D, generator=g),
        "k": torch.randn(T, H, D, generator=g),
        "positions": torch.full((T,), position, dtype=torch.int64),
    }


def rotated_by(kw, angle_offset):
    """What a kernel produces whose angles are all off by angle_offset radians."""
    i = torch.arange(D // 2, dtype=torch.float64)
    a = kw["positions"].double()[:, None] * 10000.0 ** (-2.0 * i / D) + angle_offset
    cos, sin = torch.cos(a)[:, None, :], torch.sin(a)[:, None, :]
    out = {}
    for n in ("q", "k"):
        x = kw[n].double()
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        out[n] = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).float()
    return out


def findings(kw, outs):
    case = Case("t", {"T": T, "Hq": H, "Hkv": H, "D": D})
    return check_reference(ROPE, case, kw, outs, PARAMS, {})


def test_float32_angle_rounding_at_a_high_position_passes():
    kw = inputs(60000)
    delta = 60000 * 2.0**-24  # half an ulp of the angle at the highest frequency: 3.6e-3 rad, over 2e-3
    assert findings(kw, rotated_by(kw, delta)) == []


def test_the_same_error_at_a_low_position_fails():
    kw = inputs(100)
    f = findings(kw, rotated_by(kw, 60000 * 2.0**-24))
    assert f and f[0].bug_class == "wrong-output"


def test_a_position_off_by_one_at_a_high_position_is_still_caught():
    kw = inputs(60000)
    outs = {n: rotate(kw[n], kw["positions"] + 1, "neox", 10000.0, D).float() for n in ("q", "k")}
    f = findings(kw, outs)
    assert f and "tolerance" in f[0].message
