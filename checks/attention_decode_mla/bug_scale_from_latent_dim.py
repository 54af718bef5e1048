"""Multi-head latent attention decode that takes its softmax scale from the cache row's width

Bug kernel, derived from correct_latent_online.py. The launcher ignores the scale it is given and computes
1/sqrt(head size) from the cache, as a kernel written for ordinary heads does:

    scale = kv_cache.shape[-1] ** -0.5      # 1/sqrt(576); should be the model's 1/sqrt(128 + 64)

Bug class: scale.
Modelled on: https://github.com/onnxruntime/mobius/pull/548 -- DeepSeek MLA with a softmax scale that was not
the model's (YaRN's mscale correction missing): right at position 0, where a one-key softmax ignores the
scale, and wrong by up to 93% after it.

pos0 probe: missed. At kv_len 1 the softmax has one key: the scale does not matter.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode_mla",
    "bug_class": "scale",
    "pos0": "missed",
    "params": {"block_size": 16, "kv_lora_rank": 512, "rope_dim": 64},
    "modelled_on": "https://github.com/onnxruntime/mobius/pull/548",
    "style": "latent-online-softmax",
    "structural": "not-analysed",
}


@triton.jit
def _mla_decode(QN, QP, C, Out, Tables, Lens, scale,
                s_nb, s_nh, s_pb, s_ph, s_cn, s_cp, s_tb, s_tc, s_ob, s_oh,
                RANK: tl.constexpr, ROPE: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    offs_c = tl.arange(0, RANK)
    offs_r = tl.arange(0, ROPE)
    q_nope = tl.load(QN + b * s_nb + h * s_nh + offs_c).to(tl.float32)
    q_pe = tl.load(QP + b * s_pb + h * s_ph + offs_r).to(tl.float32)
    table = Tables + b * s_tb
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([RANK], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        blk = tl.load(table + (offs_n // PAGE) * s_tc, mask=n_mask, other=0).to(tl.int64)
        row = C + blk[:, None] * s_cn + (offs_n % PAGE)[:, None] * s_cp
        c = tl.load(row + offs_c[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        r = tl.load(row + RANK + offs_r[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
        qk = (tl.sum(c * q_nope[None, :], 1) + tl.sum(r * q_pe[None, :], 1)) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * c, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + offs_c, (acc / l_i).to(Out.dtype.element_ty))


def entry(q_nope, q_pe, kv_cache, block_tables, kv_lens, scale):
    B, H, rank = q_nope.shape
    out = torch.empty_like(q_nope)
    scale = kv_cache.shape[-1] ** -0.5
    _mla_decode[(B, H)](
        q_nope, q_pe, kv_cache, out, block_tables, kv_lens, scale,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        *block_tables.stride(), out.stride(0), out.stride(1),
        RANK=rank, ROPE=q_pe.shape[2], PAGE=kv_cache.shape[1], BLOCK_N=16)
    return out
