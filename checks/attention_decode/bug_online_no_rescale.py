"""Decode attention whose online softmax does not rescale the accumulator when the maximum grows

Bug kernel, derived from correct_online_softmax.py. Per key tile the running
maximum m and the running sum l are updated correctly, but the accumulator of
earlier tiles keeps weights taken relative to the old maximum:

    acc = acc + tl.sum(p[:, None] * v.to(tl.float32), 0)
        # should be: acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)

so whenever a later tile raises the maximum, earlier values are over-weighted by
exp(m_new - m_old).

Bug class: online-rescale.
Modelled on: https://github.com/ROCm/rocm-libraries/pull/6498 -- the CK-Tile FMHA
"conditional rescale" skipped the O-accumulator rescale while P had already been
computed against the new maximum, so softmax normalisation was wrong on long
sequences (degraded Flux2 images on MI350X).

pos0 probe: missed. kv_len = 1 is a single tile: alpha is applied to an empty
accumulator (0 * 0), so the missing rescale has no effect. It needs kv_len > 64
(two tiles) with the maximum rising after the first tile.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode",
    "bug_class": "online-rescale",
    "pos0": "missed",
    "params": {},
    "modelled_on": "https://github.com/ROCm/rocm-libraries/pull/6498",
    "style": "online-softmax",
}


@triton.jit
def _decode_online(Q, K, V, Out, Lens, scale,
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
        v = tl.load(v_base + offs_n[:, None] * s_vs + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        acc = acc + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    out = acc / l_i
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, out.to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _decode_online[(B, Hq)](
        q, k_cache, v_cache, out, kv_lens, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        GROUP=Hq // Hkv, D=D, BLOCK_N=64, BLOCK_D=triton.next_power_of_2(D))
    return out
