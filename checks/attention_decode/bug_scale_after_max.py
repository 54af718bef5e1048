"""Base-2 decode attention that takes the running maximum of unscaled scores (scale applied after the max)

Bug kernel, derived from correct_exp2.py (log2(e) folded into qk_scale, exp2).
The probabilities use the scaled scores, but the maximum is taken over the raw
dot products:

    m_new = tl.maximum(m_i, tl.max(qk, 0))     # should be: tl.max(qk, 0) * qk_scale

The subtracted value is still consistent between alpha and p, so the result is
exact for ordinary inputs; but raw and scaled scores differ by the factor
qk_scale (~0.18 for D = 64), so with large scores exp2(qk * qk_scale - m)
underflows to 0 for every key (l = 0, out = 0 / 0 = NaN) or overflows to inf.

Bug class: scale.
Modelled on: https://github.com/ROCm/aotriton/pull/43 -- the AOTriton forward
kernel moved qk_scale from the query into the inner loop, which requires the row
maximum to be taken as qk_scale * max(qk) and the probabilities as
exp2(qk * qk_scale - m); dropping the factor from the maximum is the one-token
slip that reproduces this bug.

pos0 probe: missed. With one key, p = exp2(s * qk_scale - s) and l = p, so
acc / l = v[0] exactly whatever the exponent, as long as it stays in float32
range, which it does for N(0, 1) inputs.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "scale",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/ROCm/aotriton/pull/43",
    "style": "online-softmax-exp2",
}

LOG2E = 1.4426950408889634


@triton.jit
def _decode_exp2(Q, K, V, Out, Lens, qk_scale,
                 s_qb, s_qh, s_qd, s_kb, s_kh, s_ks, s_kd, s_vb, s_vh, s_vs, s_vd, s_ob, s_oh, s_od,
                 GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    k_base = K + b * s_kb + (h // GROUP) * s_kh
    v_base = V + b * s_vb + (h // GROUP) * s_vh

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + offs_n[:, None] * s_ks + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        qk = tl.where(n_mask, tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk * qk_scale - m_new)
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, (acc / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _decode_exp2[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, scale * LOG2E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=Hq // k_cache.shape[1], D=D, BLOCK_N=64, BLOCK_D=triton.next_power_of_2(D))
    return out
