"""Bug fixture (from rope_correct_gptj_join.py): the join/split pairs are taken as two halves."""
import math

import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {"op": "rope", "bug_class": "rope-pairing", "pos0": None, "params": {"style": "gptj"}, "modelled_on": None,
             "style": "gptj, in place, reshape/split/join interleave"}


@triton.jit
def _rope_gptj(X, P, s_xt, s_xh, H, log2_base, D: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(P + t).to(tl.float32)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, D // 2)
    theta = tl.exp2(-(2.0 * i.to(tl.float32) / D) * log2_base)
    a = pos * theta
    c = tl.cos(a)[None, :]
    s = tl.sin(a)[None, :]
    d = tl.arange(0, D)[None, :]
    ptr = X + t * s_xt + h * s_xh + d
    m = (h < H) & (d < D)
    x = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    x1, x2 = tl.split(tl.permute(tl.reshape(x, [BLOCK_H, 2, D // 2]), (0, 2, 1)))
    y = tl.reshape(tl.join(x1 * c - x2 * s, x2 * c + x1 * s), [BLOCK_H, D])
    tl.store(ptr, y.to(X.dtype.element_ty), mask=m)


def entry(q, k, positions):
    p = current_params()
    T, Hq, D = q.shape
    assert (p.get("rotary_dim") or D) == D and D & (D - 1) == 0, "full rotary, power-of-two head dim"
    for x in (q, k):
        _rope_gptj[(T,)](x, positions, x.stride(0), x.stride(1), x.shape[1], math.log2(p.get("base", 10000.0)),
                         D=D, BLOCK_H=triton.next_power_of_2(x.shape[1]))
    return q, k
