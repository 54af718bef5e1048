"""NeoX-style RoPE that rotates q and k in place, with the inverse frequencies passed as a tensor.

The entry computes inv_freq[i] = base^(-2i/r) once per call in float64 and passes
it as a float32 vector; one program per token loads positions[t] and the vector,
forms a = position * inv_freq[i] in float32, and rotates the pairs (i, i + r/2)
of every head of q and then of k, writing the results back into q and k
themselves. The entry returns (q, k). Full rotary (r = D); base fixed (10000).
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "rope",
    "bug_class": None,
    "pos0": None,
    "params": {"style": "neox"},
    "modelled_on": None,
    "style": "neox, in place, inv_freq vector from the entry, one program per token",
}

BASE = 10000.0


@triton.jit
def _rotate_heads_inplace(x, stride_h, num_heads, cos, sin,
                          HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    ptr1 = x + h * stride_h + i
    ptr2 = ptr1 + HALF
    x1 = tl.load(ptr1, mask=mask).to(tl.float32)
    x2 = tl.load(ptr2, mask=mask).to(tl.float32)
    tl.store(ptr1, (x1 * cos - x2 * sin).to(x.dtype.element_ty), mask=mask)
    tl.store(ptr2, (x2 * cos + x1 * sin).to(x.dtype.element_ty), mask=mask)


@triton.jit
def _rope_neox_inplace_kernel(q, k, positions, inv_freq,
                              stride_qt, stride_qh, stride_kt, stride_kh,
                              num_q_heads, num_kv_heads,
                              HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                              BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.float32)
    i = tl.arange(0, BLOCK_HALF)
    angle = pos * tl.load(inv_freq + i, mask=i < HALF, other=0.0)
    cos = tl.cos(angle)[None, :]
    sin = tl.sin(angle)[None, :]
    _rotate_heads_inplace(q + t * stride_qt, stride_qh, num_q_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads_inplace(k + t * stride_kt, stride_kh, num_kv_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HKV)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0
    half = D // 2
    inv_freq = (BASE ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)).to(torch.float32).to(q.device)
    _rope_neox_inplace_kernel[(T,)](
        q, k, positions, inv_freq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        Hq, Hkv,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q, k
