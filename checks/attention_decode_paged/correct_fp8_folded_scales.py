"""Paged decode attention over an FP8 cache, the scales folded into the softmax (correct)

As correct_online_paged.py, with the cache dequantised by folding (docs/ops.md, "FP8 KV caches"): the
program's KV head g's k_scale[g] is folded into the score scale once (sm_scale * k_scale * log2 e, as
FlashInfer's bmm1 scale does), the FP8 keys and values are widened to float32 unscaled, and v_scale[g]
multiplies the normalised output once at the end (FlashInfer's bmm2 scale). Element 0 under
`kv_scale: per-tensor`.
"""
import torch
import triton
import triton.language as tl

CATALOGUE = {
    "op": "attention.decode_paged",
    "bug_class": None,
    "pos0": None,
    "params": {"block_size": 16, "kv_dtype": "fp8_e5m2", "kv_scale": "per-head"},
    "modelled_on": None,
    "style": "paged-online-softmax-exp2, FP8 cache, scales folded",
    "structural": "not-analysed",
}


@triton.jit
def _paged_online_fp8(Q, K, V, Out, Tables, Lens, KScale, VScale, sm_scale,
                  s_qb, s_qh, s_qd, s_kn, s_kp, s_kh, s_kd, s_vn, s_vp, s_vh, s_vd, s_tb, s_tc, s_ob, s_oh, s_od,
                  HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PER_HEAD: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // (HQ // HKV)
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d * s_qd, mask=d_mask, other=0.0).to(tl.float32)
    table = Tables + b * s_tb
    n_pages = (kv_len + PAGE - 1) // PAGE

    sg = g if PER_HEAD else 0
    qk_scale = sm_scale * tl.load(KScale + sg) * 1.4426950408889634
    v_scale = tl.load(VScale + sg)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        col = offs_n // PAGE
        blk = tl.load(table + col * s_tc, mask=col < n_pages, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
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
    tl.store(Out + b * s_ob + h * s_oh + offs_d * s_od, (acc * v_scale / l_i).to(Out.dtype.element_ty), mask=d_mask)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, k_scale, v_scale):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _paged_online_fp8[(B, Hq)](
        q, k_cache, v_cache, out, block_tables, kv_lens, k_scale, v_scale, scale,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        HQ=Hq, HKV=k_cache.shape[2], D=D, PAGE=k_cache.shape[1], BLOCK_N=64,
        BLOCK_D=triton.next_power_of_2(D), PER_HEAD=k_scale.numel() > 1)
    return out
