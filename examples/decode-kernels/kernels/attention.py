"""Decode attention over a contiguous KV cache: one program per (sequence, query head)."""
import torch
import triton
import triton.language as tl
from common import block_d, online_softmax_step


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lens_ptr, scale,
                   sq_b, sq_h, sk_b, sk_h, sk_s, so_b, so_h,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(lens_ptr + b)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    q = tl.load(q_ptr + b * sq_b + h * sq_h + d, mask=d_mask, other=0.0).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < kv_len
        off = b * sk_b + g * sk_h + n[:, None] * sk_s + d[None, :]
        mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + off, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * scale
        s = tl.where(n_mask, s, float("-inf"))
        v = tl.load(v_ptr + off, mask=mask, other=0.0).to(tl.float32)
        m, l, acc = online_softmax_step(m, l, acc, s, v)
    tl.store(o_ptr + b * so_b + h * so_h + d, (acc / l).to(o_ptr.dtype.element_ty), mask=d_mask)


def decode(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _decode_kernel[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=Hq // Hkv, D=D, BLOCK_D=block_d(D), BLOCK_N=16)
    return out
