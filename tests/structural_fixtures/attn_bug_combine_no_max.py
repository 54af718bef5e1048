"""Bug fixture (from attn_correct_split.py): the combine weights are exp(lse_i), without subtracting max lse."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": "softmax-no-max", "pos0": None, "params": {}, "modelled_on": None,
             "style": "split-kv, two kernels"}

SPLITS = 3


@triton.jit
def _partial(Q, K, V, MO, ML, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks,
             GROUP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    H = tl.num_programs(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    chunk = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < hi
        kvm = nm[:, None] & dm[None, :]
        k = tl.load(K + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
        s = tl.where(nm, tl.sum(k.to(tl.float32) * q[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(V + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    row = (b * H + h) * SPLITS + sp
    tl.store(MO + row * D + d, acc / l_safe, mask=dm)
    tl.store(ML + row, m_i + tl.log(l_safe))


@triton.jit
def _combine(MO, ML, O, s_ob, s_oh, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
             BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    H = tl.num_programs(1)
    s = tl.arange(0, BLOCK_S)
    sm = s < SPLITS
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    row = (b * H + h) * SPLITS + s
    lse = tl.load(ML + row, mask=sm, other=float("-inf"))
    o = tl.load(MO + row[:, None] * D + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    w = tl.exp(lse)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(O + b * s_ob + h * s_oh + d, out.to(O.dtype.element_ty), mask=dm)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    mo = torch.empty((B, Hq, SPLITS, D), dtype=torch.float32, device=q.device)
    ml = torch.empty((B, Hq, SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    bd = triton.next_power_of_2(D)
    _partial[(B, Hq, SPLITS)](q, k_cache, v_cache, mo, ml, kv_lens, scale, q.stride(0), q.stride(1),
                              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                              GROUP=Hq // k_cache.shape[1], D=D, SPLITS=SPLITS, BLOCK_N=16, BLOCK_D=bd)
    _combine[(B, Hq)](mo, ml, out, out.stride(0), out.stride(1), D=D, SPLITS=SPLITS,
                      BLOCK_S=triton.next_power_of_2(SPLITS), BLOCK_D=bd)
    return out
