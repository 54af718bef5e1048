"""RoPE with Llama-3.1's frequency table computed in the kernel (wavelengths under original / 4 kept, over
original divided by the factor, a blend between), gptj pairs, in place, one program per token. At the
capture's position 24593 one scaled angle is minus the plain table's (mod 2 pi): a sign judged against the
plain table would be a false `rope-sign` there."""
import math

import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {"op": "rope", "bug_class": None, "pos0": None, "modelled_on": None,
             "params": {"style": "gptj", "scaling": "llama3", "scaling_factor": 8.0, "original_max_position": 8192,
                        "max_position": 131072},
             "style": "gptj, in place, Llama-3.1 bands in the kernel"}


@triton.jit
def _rope_llama3(X, P, s_xt, s_xh, H, log2_base, factor, original, low, high, D: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(P + t).to(tl.float32)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)
    theta = tl.exp2(-(2.0 * i.to(tl.float32) / D) * log2_base)
    wavelen = 6.283185307179586 / theta
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * theta / factor + smooth * theta
    theta = tl.where(wavelen > original / low, theta / factor, tl.where(wavelen < original / high, theta, blended))
    a = pos * theta
    c = tl.cos(a)[None, :]
    s = tl.sin(a)[None, :]
    ptr = X + t * s_xt + h * s_xh + 2 * i[None, :]
    m = (h < H) & (i[None, :] < D // 2)
    x1 = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + 1, mask=m, other=0.0).to(tl.float32)
    tl.store(ptr, (x1 * c - x2 * s).to(X.dtype.element_ty), mask=m)
    tl.store(ptr + 1, (x2 * c + x1 * s).to(X.dtype.element_ty), mask=m)


def entry(q, k, positions):
    p = current_params()
    T, Hq, D = q.shape
    assert (p.get("rotary_dim") or D) == D, "full rotary"
    for x in (q, k):
        _rope_llama3[(T,)](x, positions, x.stride(0), x.stride(1), x.shape[1], math.log2(p["base"]),
                           p["scaling_factor"], float(p["original_max_position"]), p["low_freq_factor"],
                           p["high_freq_factor"], D=D, BLOCK_HALF=triton.next_power_of_2(D // 2),
                           BLOCK_H=triton.next_power_of_2(x.shape[1]))
    return q, k
