"""Decode attention that masks the value load to the cache capacity, not to kv_len (0 * NaN from the cache tail)

Bug kernel, derived from correct_online_softmax.py. Scores past kv_len are set to
-inf, so their probabilities are exactly 0, and the author relied on that for
the value tile: its load is only kept inside the allocated cache (S slots),
not inside the sequence:

    v = tl.load(v_base + ..., mask=(offs_n < S)[:, None] & d_mask[None, :], other=0.0)
        # should be: mask=kv_mask (offs_n < kv_len)
    (plus the new kernel argument S = v_cache.shape[2] that this needs)

The load never leaves the tensor, but cache slots kv_len .. S-1 are not part of
the input and may hold NaN or Inf (freed or never-written memory); p = 0 times a
NaN value is NaN, which poisons the accumulator of the whole row.

Bug class: unmasked-load.
Modelled on: https://github.com/vllm-project/vllm/issues/641 (fixed by
https://github.com/vllm-project/vllm/pull/936) -- vLLM's paged attention produced
NaN because value vectors of tokens beyond the context length held NaN; the fix
zeroes those values explicitly instead of relying on the zero softmax weight.

pos0 probe: missed. The probe fills the cache past kv_len with zeros and uses no
poison, so the extra slots read 0 and 0 * 0 = 0. The engine's NaN-canary tails
catch it on the first case.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "unmasked-load",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/vllm-project/vllm/issues/641",
    "style": "online-softmax",
}


@triton.jit
def _decode_online(Q, K, V, Out, Lens, scale, S,
                   s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd, s_ob, s_oh, s_od,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    k_base = K + b * s_kb + g * s_kh
    v_base = V + b * s_vb + g * s_vh

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd,
                    mask=(offs_n < S)[:, None] & d_mask[None, :], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    out = acc / l_i
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _decode_online[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, scale, v_cache.shape[2],
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=Hq // Hkv, D=D, BLOCK_N=64, BLOCK_D=triton.next_power_of_2(D))
    return out
