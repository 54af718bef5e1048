"""NeoX RoPE computed in the activation dtype: a cos/sin cache in that dtype, bf16 x bf16 products.

The way serving stacks commonly do it: the entry keeps one cos_sin_cache per (rotary dim,
dtype, device), rows [cos(p * inv_freq) | sin(p * inv_freq)] for every position p <
max_position, formed in float32 and stored in the activation dtype (built once, like a
RotaryEmbedding module's buffer). One program per token loads its cache row at positions[t]
and rotates every head of q and then of k with no upcast: x1 * cos - x2 * sin and
x2 * cos + x1 * sin are bfloat16 (or float16) multiplies and adds, each rounded, and the
result is stored as computed. Out of place; full rotary (r = D); base 10000.
"""
import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": None,
    "pos0": None,
    "params": {"style": "neox"},
    "modelled_on": None,
    "style": "neox, cos/sin cache in the activation dtype, arithmetic in that dtype (no upcast)",
}

BASE = 10000.0
_CACHES = {}


def cos_sin_cache(rotary_dim, max_position, dtype, device):
    key = (rotary_dim, max_position, dtype, str(device))
    if key not in _CACHES:
        inv_freq = 1.0 / BASE ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        _CACHES[key] = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype).to(device)
    return _CACHES[key]


@triton.jit
def _rotate_heads(src, dst, stride_src_h, stride_dst_h, num_heads, cos, sin,
                  HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    x1 = tl.load(src + h * stride_src_h + i, mask=mask)
    x2 = tl.load(src + h * stride_src_h + i + HALF, mask=mask)
    tl.store(dst + h * stride_dst_h + i, x1 * cos - x2 * sin, mask=mask)
    tl.store(dst + h * stride_dst_h + i + HALF, x2 * cos + x1 * sin, mask=mask)


@triton.jit
def _rope_cache_kernel(q, k, q_out, k_out, positions, cache,
                       stride_qt, stride_qh, stride_kt, stride_kh,
                       stride_qot, stride_qoh, stride_kot, stride_koh, stride_cache,
                       num_q_heads, num_kv_heads,
                       HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t)
    i = tl.arange(0, BLOCK_HALF)
    row = cache + pos * stride_cache
    cos = tl.load(row + i, mask=i < HALF)[None, :]
    sin = tl.load(row + HALF + i, mask=i < HALF)[None, :]
    _rotate_heads(q + t * stride_qt, q_out + t * stride_qot, stride_qh, stride_qoh, num_q_heads,
                  cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads(k + t * stride_kt, k_out + t * stride_kot, stride_kh, stride_koh, num_kv_heads,
                  cos, sin, HALF, BLOCK_HALF, BLOCK_HKV)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0 and k.dtype == q.dtype
    cache = cos_sin_cache(D, current_params()["max_position"], q.dtype, q.device)
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_cache_kernel[(T,)](
        q, k, q_out, k_out, positions, cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cache.stride(0),
        Hq, Hkv,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q_out, k_out
