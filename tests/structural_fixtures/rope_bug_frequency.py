"""Bug fixture (from rope_correct_neox.py): frequencies over the head dim, not rotary_dim."""
import math

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {"op": "rope", "bug_class": "rope-frequency", "pos0": None, "params": {"style": "neox", "rotary_dim": 32}, "modelled_on": None,
             "style": "neox, per (token, head), halves loaded separately"}


@triton.jit
def _rope(X, Y, P, s_xt, s_xh, s_yt, s_yh, log2_base, HALF: tl.constexpr, ROT: tl.constexpr,
          D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(P + t).to(tl.float32)
    i = tl.arange(0, BLOCK)
    m = i < HALF
    theta = tl.exp2(-(2.0 * i.to(tl.float32) / D) * log2_base)
    a = pos * theta
    c = tl.cos(a)
    s = tl.sin(a)
    src = X + t * s_xt + h * s_xh
    dst = Y + t * s_yt + h * s_yh
    x1 = tl.load(src + i, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + i + HALF, mask=m, other=0.0).to(tl.float32)
    tl.store(dst + i, (x1 * c - x2 * s).to(Y.dtype.element_ty), mask=m)
    tl.store(dst + i + HALF, (x2 * c + x1 * s).to(Y.dtype.element_ty), mask=m)
    j = tl.arange(0, BLOCK_D)
    pm = (j >= ROT) & (j < D)
    tl.store(dst + j, tl.load(src + j, mask=pm, other=0.0), mask=pm)


def entry(q, k, positions):
    p = current_params()
    T, Hq, D = q.shape
    rot = p.get("rotary_dim") or D
    outs = []
    for x in (q, k):
        y = torch.empty_like(x)
        _rope[(T, x.shape[1])](x, y, positions, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                               math.log2(p.get("base", 10000.0)), HALF=rot // 2, ROT=rot, D=D,
                               BLOCK=triton.next_power_of_2(rot // 2), BLOCK_D=triton.next_power_of_2(D))
        outs.append(y)
    return outs[0], outs[1]
