"""A paged decode-attention kernel with the cache in HND order, [num_blocks, num_kv_heads, block_size,
head_dim], strides taken from the tensors (the layout of several serving stacks). Test-only: the worked
example of docs/adapters.md calls it through a permuted view of kernalin-ci's NHD cache."""
import torch
import triton
import triton.language as tl


@triton.jit
def _decode_hnd(out, q, k_cache, v_cache, block_tables, seq_lens, scale,
                s_qb, s_qh, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_bt, s_ob, s_oh,
                GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    d = tl.arange(0, BLOCK_D)
    dm = d < HEAD_DIM
    t = tl.arange(0, BLOCK_SIZE)
    qv = tl.load(q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens + b)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        blk = tl.load(block_tables + b * s_bt + i).to(tl.int64)
        mask = i * BLOCK_SIZE + t < seq_len
        k = tl.load(k_cache + blk * s_kb + kvh * s_kh + t[:, None] * s_kt + d[None, :],
                    mask=mask[:, None] & dm[None, :], other=0.0).to(tl.float32)
        s = tl.where(mask, tl.sum(k * qv[None, :], 1) * scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_cache + blk * s_vb + kvh * s_vh + t[:, None] * s_vt + d[None, :],
                    mask=mask[:, None] & dm[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(out + b * s_ob + h * s_oh + d, (acc / l_i).to(out.dtype.element_ty), mask=dm)


def paged_decode_hnd(q, k_cache, v_cache, block_tables, seq_lens, scale):
    """q [B, Hq, D]; k_cache, v_cache [num_blocks, Hkv, block_size, D] (any strides, last dim 1)."""
    B, Hq, D = q.shape
    _, Hkv, block_size, _ = k_cache.shape
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    out = torch.empty_like(q)
    _decode_hnd[(B, Hq)](out, q, k_cache, v_cache, block_tables, seq_lens, scale,
                         q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3],
                         block_tables.stride(0), out.stride(0), out.stride(1),
                         GROUP=Hq // Hkv, BLOCK_SIZE=block_size, HEAD_DIM=D,
                         BLOCK_D=triton.next_power_of_2(D))
    return out
