"""NeoX RoPE whose Llama-3 scaled frequency table keeps the unscaled frequencies

Parent: correct_llama3_scaled.py. Injected bug, in llama3_inv_freq(): it returns `inv`, the plain
base^(-2i/r) frequencies, where it should return the scaled ones (the blend of the medium band and
the division of the low band are computed and dropped). Verified with Llama-3.1's config.
Bug class: rope-frequency.
Modelled on huggingface/transformers PR #32330: the Llama 3.1 rope init returned the unscaled
inv_freq instead of the scaled one, so the RoPE frequencies were wrong.
pos-0 probe: missed. At position 0 every angle is 0 whatever the frequencies, and below the
original context the scaled and plain tables differ by little.

The parent's docstring:

The entry builds the inverse frequencies in float32 on the host, as the public serving code does:
theta_i = base^(-2i/r); wavelength 2 pi / theta_i; above original/low_freq_factor divided by the
factor, below original/high_freq_factor kept, between blended with smooth = (original / wavelength -
low) / (high - low). One program per token loads the table, forms angle = position * theta_i in
float32 and rotates the pairs (i, i + r/2) of every head of q and then of k, out of place. Verified with
Llama-3.1's config: base 500000, factor 8, low 1, high 4, original 8192.
"""
import math

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-frequency",
    "pos0": "missed",
    "params": {"base": 500000.0, "scaling": "llama3", "scaling_factor": 8.0, "original_max_position": 8192},
    "modelled_on": "https://github.com/huggingface/transformers/pull/32330",
    "structural": "not-analysed",
    "style": "neox, unscaled frequencies where Llama-3 scaled inverse frequencies built on the host, angles in the kernel",
}


def llama3_inv_freq(params, r):
    base = float(params["base"])
    factor = float(params["scaling_factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    orig = float(params["original_max_position"])
    inv = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < orig / high) & ~(wavelen > orig / low)
    scaled = torch.where(medium, blended, scaled)
    return inv


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
def _rope_scaled_kernel(q, k, q_out, k_out, positions, inv_freq,
                        stride_qt, stride_qh, stride_kt, stride_kh,
                        stride_qot, stride_qoh, stride_kot, stride_koh,
                        num_q_heads, num_kv_heads,
                        HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                        BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    angle = pos * tl.load(inv_freq + i, mask=i < HALF, other=0.0)
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
    assert params.get("rotary_dim") in (None, D), "this kernel rotates the whole head"
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0
    inv_freq = llama3_inv_freq(params, D).to(q.device)
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_scaled_kernel[(T,)](
        q, k, q_out, k_out, positions, inv_freq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, Hkv,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q_out, k_out
