"""Paged multi-token decode attention whose draft positions are one too far

Bug kernel, derived from correct_causal_drafts.py. The token's position counts one more than its index
among the new tokens (its key count taken as its position), so each draft also attends the draft right after
it; the last one is held back by the kv_len mask and is right:

    pos = kv_len - q_len + (t - q_start) + 1   # should be: ... + (t - q_start)
    n_mask = (offs_n <= pos) & (offs_n < kv_len)

Bug class: causal-mask.
Modelled on: https://github.com/vllm-project/vllm-gaudi/pull/393 -- unified attention extended non-aligned
context lengths by one token, so a query row attended one key more than its own context.

pos0 probe: missed. A single new token is its sequence's last, where the kv_len mask holds.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode_multi",
    "bug_class": "causal-mask",
    "pos0": "missed",
    "params": {"block_size": 16, "max_query_len": 4},
    "modelled_on": "https://github.com/vllm-project/vllm-gaudi/pull/393",
    "style": "varlen-online-softmax",
    "structural": "not-analysed",
}


@triton.jit
def _decode_multi(Q, K, V, Out, Tables, Starts, Lens, scale, B,
                  s_qt, s_qh, s_qd, s_kn, s_kp, s_kh, s_kd, s_vn, s_vp, s_vh, s_vd, s_tb, s_tc, s_ot, s_oh, s_od,
                  HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (HQ // HKV)
    offs_b = tl.arange(0, BLOCK_B)
    ends = tl.load(Starts + 1 + offs_b, mask=offs_b < B, other=2147483647)
    b = tl.sum((ends <= t).to(tl.int32), 0)
    q_start = tl.load(Starts + b)
    q_len = tl.load(Starts + b + 1) - q_start
    kv_len = tl.load(Lens + b)
    pos = kv_len - q_len + (t - q_start) + 1
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + t * s_qt + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    table = Tables + b * s_tb
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, pos + 1, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = (offs_n <= pos) & (offs_n < kv_len)
        col = offs_n // PAGE
        blk = tl.load(table + col * s_tc, mask=n_mask, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(K + blk[:, None] * s_kn + slot[:, None] * s_kp + g * s_kh + offs_d[None, :] * s_kd,
                    mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + blk[:, None] * s_vn + slot[:, None] * s_vp + g * s_vh + offs_d[None, :] * s_vd,
                    mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + t * s_ot + h * s_oh + offs_d * s_od, (acc / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, query_start_loc, kv_lens, scale):
    T, Hq, D = q.shape
    B = kv_lens.shape[0]
    out = torch.empty_like(q)
    _decode_multi[(T, Hq)](
        q, k_cache, v_cache, out, block_tables, query_start_loc, kv_lens, scale, B,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        HQ=Hq, HKV=k_cache.shape[2], D=D, PAGE=k_cache.shape[1], BLOCK_N=32,
        BLOCK_D=triton.next_power_of_2(D), BLOCK_B=triton.next_power_of_2(B))
    return out
