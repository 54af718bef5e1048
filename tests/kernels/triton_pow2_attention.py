"""attention.decode written the way many production kernels are: the head dim is a
`tl.arange(0, D)` block, so only power-of-two head dims compile, and the wrapper asserts
the dtypes it was written for. `entry` is correct inside that domain; `entry_no_max` drops
the max subtraction of the softmax (a real bug); `entry_fp16_only` refuses float32 and
bfloat16 in its wrapper."""
import torch
import triton
import triton.language as tl


@triton.jit
def _decode_pow2(Q, K, V, Out, Lens, scale,
                 s_qb, s_qh, s_kb, s_kh, s_ks, s_vb, s_vh, s_vs, s_ob, s_oh,
                 GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SUB_MAX: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * s_qb + h * s_qh + offs_d).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        k = tl.load(K + b * s_kb + g * s_kh + offs_n[:, None] * s_ks + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        qk = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale
        qk = tl.where(n_mask, qk, float("-inf"))
        if SUB_MAX:
            m_new = tl.maximum(m_i, tl.max(qk, 0))
        else:
            m_new = 0.0
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new)
        v = tl.load(V + b * s_vb + g * s_vh + offs_n[:, None] * s_vs + offs_d[None, :],
                    mask=n_mask[:, None], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(Out + b * s_ob + h * s_oh + offs_d, (acc / l_i).to(Out.dtype.element_ty))


def _launch(q, k_cache, v_cache, kv_lens, scale, sub_max=True):
    B, Hq, D = q.shape
    out = torch.empty_like(q)
    _decode_pow2[(B, Hq)](q, k_cache, v_cache, out, kv_lens, scale,
                          q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                          v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
                          GROUP=Hq // k_cache.shape[1], D=D, BLOCK_N=16, SUB_MAX=sub_max)
    return out


def entry(q, k_cache, v_cache, kv_lens, scale):
    return _launch(q, k_cache, v_cache, kv_lens, scale)


def entry_no_max(q, k_cache, v_cache, kv_lens, scale):
    return _launch(q, k_cache, v_cache, kv_lens, scale, sub_max=False)


def entry_fp16_only(q, k_cache, v_cache, kv_lens, scale):
    if q.dtype != torch.float16:
        raise TypeError(f"only float16 is supported, got {q.dtype}")
    return _launch(q, k_cache, v_cache, kv_lens, scale)
