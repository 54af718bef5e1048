"""Paged decode attention that sends its padded lanes to block 0, slot 0 and drops the length mask on the K/V loads

Bug kernel, derived from correct_online_paged.py. Lanes past kv_len get block 0
from the masked table load (other=0) and slot 0, a place that always exists, so
the author judged the loads in bounds and dropped their length mask, relying on
the -inf score for those lanes:

    blk = tl.load(table + col * s_tc, mask=n_mask, other=0).to(tl.int64)
    slot = tl.where(n_mask, offs_n % PAGE, 0)
    kv_mask = (offs_n >= 0)[:, None] & d_mask[None, :]
        # should be: kv_mask = n_mask[:, None] & d_mask[None, :]   (j < kv_len)

Block 0 belongs to nobody in particular: when it is a free block holding NaN
(the op contract lets unowned blocks hold anything), p = 0 times the NaN value
of block 0 is NaN and every row whose last tile is partial is lost. Random block
tables almost always hand block 0 to a sequence, whose slot 0 is finite, so only
a case with block 0 free and poisoned sees it.

Bug class: unmasked-load.
Modelled on: https://github.com/huggingface/transformers/pull/46765 -- in
transformers' continuous batching, padding tokens read (and wrote) their KV at a
shared dummy index of the cache; once NaN sat there it poisoned the softmax of
the real tokens computed in the same block.

pos0 probe: missed. The probe's cache is zero outside kv_len and its table is
0, 1, 2, ...: the padded lanes read block 0, slot 0, the probe's own finite key.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode_paged",
    "bug_class": "unmasked-load",
    "pos0": "missed",
    "params": {"block_size": 16},
    "modelled_on": "https://github.com/huggingface/transformers/pull/46765",
    "style": "paged-online-softmax-exp2",
}


@triton.jit
def _paged_online(Q, K, V, Out, Tables, Lens, sm_scale,
                  s_qb, s_qh, s_qd, s_kn, s_kp, s_kh, s_kd, s_vn, s_vp, s_vh, s_vd, s_tb, s_tc, s_ob, s_oh, s_od,
                  HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (HQ // HKV)
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    table = Tables + b * s_tb
    n_pages = (kv_len + PAGE - 1) // PAGE

    qk_scale = sm_scale * 1.4426950408889634
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        col = offs_n // PAGE
        blk = tl.load(table + col * s_tc, mask=n_mask, other=0).to(tl.int64)
        slot = tl.where(n_mask, offs_n % PAGE, 0)
        kv_mask = (offs_n >= 0)[:, None] & d_mask[None, :]
        k = tl.load(K + blk[:, None] * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.where(n_mask, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk * qk_scale - m_new)
        v = tl.load(V + blk[:, None] * s_vn + slot[:, None] * s_vp + g * s_vh + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, (acc / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _paged_online[(B, Hq)](
        q, k_cache, v_cache, out, block_tables, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        HQ=Hq, HKV=k_cache.shape[2], D=D, PAGE=k_cache.shape[1], BLOCK_N=64,
        BLOCK_D=triton.next_power_of_2(D))
    return out
