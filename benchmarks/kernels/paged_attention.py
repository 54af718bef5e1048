"""A small correct paged decode-attention kernel (one program per sequence and query head, one cache block per
step) for benchmarks/live_eval.py. `NUM_WARPS` is the launch config the live evaluation varies."""

import torch
import triton
import triton.language as tl

NUM_WARPS = 4


@triton.jit
def _paged_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    tables_ptr,
    lens_ptr,
    scale,
    sq_b,
    sq_h,
    sk_blk,
    sk_slot,
    sk_h,
    st_b,
    so_b,
    so_h,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
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
    for start in range(0, kv_len, BLOCK_SIZE):
        block = tl.load(tables_ptr + b * st_b + start // BLOCK_SIZE).to(tl.int64)
        slot = tl.arange(0, BLOCK_SIZE)
        n_mask = start + slot < kv_len
        off = block * sk_blk + slot[:, None] * sk_slot + g * sk_h + d[None, :]
        mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + off, mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * scale
        s = tl.where(n_mask, s, float("-inf"))
        v = tl.load(v_ptr + off, mask=mask, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, 0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l = l * alpha + tl.sum(p, 0)
        m = m_new
    tl.store(o_ptr + b * so_b + h * so_h + d, (acc / l).to(o_ptr.dtype.element_ty), mask=d_mask)


def decode_paged(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    out = torch.empty_like(q)
    _paged_kernel[(B, Hq)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        kv_lens,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=Hq // Hkv,
        D=D,
        BLOCK_D=triton.next_power_of_2(D),
        BLOCK_SIZE=k_cache.shape[1],
        num_warps=NUM_WARPS,
    )
    return out
