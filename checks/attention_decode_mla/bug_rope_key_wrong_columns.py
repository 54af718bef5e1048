"""Multi-head latent attention decode that reads the RoPE key from the latent's first columns

Bug kernel, derived from correct_latent_online.py. The decoupled RoPE key of a cache row sits behind the
latent, at columns kv_lora_rank .. kv_lora_rank + rope_dim - 1; the kernel reads it at the row's start:

    r = tl.load(row + offs_r[None, :], ...)     # should be: row + RANK + offs_r[None, :]

so q_pe meets the first rope_dim latent values instead of the rotated key.

Bug class: mla-rope.
Modelled on: https://github.com/junfanz1/MiniGPT-and-DeepSeek-MLA-Multi-Head-Latent-Attention/issues/1 -- an MLA
implementation split the compressed row into latent and RoPE key with the wrong widths, so the RoPE part was
taken from the wrong columns.

pos0 probe: missed. At kv_len 1 the softmax has one key: any score gives weight 1 to the one latent.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode_mla",
    "bug_class": "mla-rope",
    "pos0": "missed",
    "params": {"block_size": 16, "kv_lora_rank": 512, "rope_dim": 64},
    "modelled_on": "https://github.com/junfanz1/MiniGPT-and-DeepSeek-MLA-Multi-Head-Latent-Attention/issues/1",
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
        r = tl.load(row + offs_r[None, :], mask=n_mask[:, None], other=0.0).to(tl.float32)
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
    _mla_decode[(B, H)](
        q_nope, q_pe, kv_cache, out, block_tables, kv_lens, scale,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        *block_tables.stride(), out.stride(0), out.stride(1),
        RANK=rank, ROPE=q_pe.shape[2], PAGE=kv_cache.shape[1], BLOCK_N=16)
    return out
