"""Paged decode attention with an autotuned tile (benchmarks/tune_vs_autotune.py), after the example
repository's paged kernel (examples/decode-kernels/kernels/paged_attention.py).

A tile reads its cache block once, from the block-table entry of its first token: right while
BLOCK_N divides the page (block_size 16), wrong for BLOCK_N 32 or 64, which are also the configs
that time fastest. Triton's autotuner times them and never checks them.

tests/test_tune.py runs this file on the CPU too, its CONFIGS line narrowed to two configs.
"""

import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BLOCK_N": n}, num_warps=w) for n in (16, 32, 64) for w in (2, 4)]


@triton.autotune(configs=CONFIGS, key=["D"])
@triton.jit
def _paged_tiles(
    Q,
    K,
    V,
    Out,
    Tables,
    Lens,
    sm_scale,
    s_qb,
    s_qh,
    s_kn,
    s_kp,
    s_kh,
    s_tb,
    s_ob,
    s_oh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        blk = tl.load(Tables + b * s_tb + start // PAGE).to(tl.int64)
        slot = offs_n % PAGE
        off = blk * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :]
        mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + off, mask=mask, other=0.0).to(tl.float32)
        s = tl.where(n_mask, tl.sum(k * q[None, :], 1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(V + off, mask=mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + offs_d, (acc / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _paged_tiles[(B, Hq)](
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
        GROUP=Hq // k_cache.shape[2],
        D=D,
        PAGE=k_cache.shape[1],
        BLOCK_D=triton.next_power_of_2(D),
    )
    return out
