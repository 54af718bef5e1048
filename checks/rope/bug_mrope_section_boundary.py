"""NeoX M-RoPE whose section boundary is off by one: the first frequency of a section takes the previous row

Parent: correct_mrope.py. Injected bug, in _mrope_kernel: the row of frequency i is counted with
`i > S0` and `i > S0 + S1` where it should be `>=`: frequencies 16 and 40 (the first of the height
and of the width section) take their angle from the temporal and the height row.
Bug class: rope-position.
Modelled on ModelTC/LightLLM PR #849 ("fix mrope kernel error"), a fix to a Triton M-RoPE kernel's
choice of position rows; the off-by-one comparison here is our injection of that kind of error, not
that PR's diff.
pos-0 probe: missed. At position 0 every row is 0; and for a text token every row holds the same
position, so any row gives the same angle.

The parent's docstring:

positions is [3, T] (temporal, height, width). With sections (s0, s1, s2) from the op params
(mrope_section; verified with Qwen2-VL's [16, 24, 24], base 1e6, D 128), frequency i takes row 0
for i < s0, row 1 for s0 <= i < s0 + s1, row 2 after. One program per token gathers the position of
every frequency, forms angle = position * exp2(-(2i/r) log2(base)) in float32 and rotates the
pairs (i, i + r/2) of every head of q and then of k, out of place.
"""
import math

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-position",
    "pos0": "missed",
    "params": {"base": 1000000.0, "mrope_section": [16, 24, 24]},
    "modelled_on": "https://github.com/ModelTC/LightLLM/pull/849",
    "structural": "not-analysed",
    "style": "section boundary off by one: neox M-RoPE, the position row of each frequency chosen by its section, angles in the kernel",
}


@triton.jit
def _rotate_heads(src, dst, stride_src_h, stride_dst_h, num_heads, cos, sin,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    x1 = tl.load(src + h * stride_src_h + i, mask=mask).to(tl.float32)
    x2 = tl.load(src + h * stride_src_h + i + HALF, mask=mask).to(tl.float32)
    tl.store(dst + h * stride_dst_h + i, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + h * stride_dst_h + i + HALF, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _mrope_kernel(q, k, q_out, k_out, positions, stride_pos_row, log2_base,
                  stride_qt, stride_qh, stride_kt, stride_kh,
                  stride_qot, stride_qoh, stride_kot, stride_koh,
                  num_q_heads, num_kv_heads,
                  S0: tl.constexpr, S1: tl.constexpr,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)
    row = (i > S0).to(tl.int32) + (i > S0 + S1).to(tl.int32)
    pos = tl.load(positions + row * stride_pos_row + t, mask=i < HALF, other=0).to(tl.float32)
    inv_freq = tl.exp2(-(2.0 * i.to(tl.float32) / (2 * HALF)) * log2_base)
    angle = pos * inv_freq
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    _rotate_heads(q + t * stride_qt, q_out + t * stride_qot, stride_qh, stride_qoh, num_q_heads,
                  cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads(k + t * stride_kt, k_out + t * stride_kot, stride_kh, stride_koh, num_kv_heads,
                  cos, sin, HALF, BLOCK_HALF, BLOCK_HKV)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    params = current_params()
    s0, s1, s2 = params["mrope_section"]
    half = s0 + s1 + s2
    assert 2 * half == D and positions.shape == (3, T) and positions.stride(1) == 1
    assert q.stride(2) == 1 and k.stride(2) == 1
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    _mrope_kernel[(T,)](
        q, k, q_out, k_out, positions, positions.stride(0), math.log2(float(params["base"])),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, Hkv,
        S0=s0, S1=s1, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q_out, k_out
