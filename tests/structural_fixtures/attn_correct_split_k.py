"""Split-K decode attention: stage 1 stores each split's UNNORMALISED accumulator with its running max and sum
(exp2 domain, one scratch row of D + 2 values per split; a tile whose rows are all masked zeroes its weights
with `where(m_new == -inf, 0, ...)`), and a reduce kernel rescales the splits by exp2(m_i - max m) and divides
by the rescaled sums (test fixture)."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "split-k: unnormalised partials with max and sum, a separate reduce kernel"}

SPLITS = 4
LOG2E = 1.4426950408889634


@triton.jit
def _split_k(Q, K, V, Acc, Lens, qk_scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_ab, s_ah, s_as,
             GROUP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    per_split = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per_split
    hi = tl.minimum(lo + per_split, kv_len)
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
        qk = tl.sum(q[None, :] * k.to(tl.float32), 1) * qk_scale
        qk = tl.where(nm, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(qk - m_new)
        alpha = tl.where(m_new == float("-inf"), 0.0, alpha)
        p = tl.where(m_new == float("-inf"), 0.0, p)
        v = tl.load(V + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    row = Acc + b * s_ab + h * s_ah + sp * s_as
    tl.store(row + d, acc, mask=dm)
    tl.store(row + D, m_i)
    tl.store(row + D + 1, l_i)


@triton.jit
def _reduce(Acc, O, s_ab, s_ah, s_as, s_ob, s_oh, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    rows = Acc + b * s_ab + h * s_ah + s * s_as
    m_k = tl.load(rows + D)
    l_k = tl.load(rows + D + 1)
    acc_k = tl.load(rows[:, None] + d[None, :], mask=dm[None, :] & (m_k > float("-inf"))[:, None], other=0.0)
    m_max = tl.max(m_k, 0)
    alpha = tl.math.exp2(m_k - m_max)
    acc = tl.sum(acc_k * alpha[:, None], 0)
    l_sum = tl.sum(l_k * alpha, 0)
    acc = acc / (l_sum + 1e-10)
    tl.store(O + b * s_ob + h * s_oh + d, acc.to(O.dtype.element_ty), mask=dm)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    acc = torch.empty((B, Hq, SPLITS, D + 2), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    bd = triton.next_power_of_2(D)
    _split_k[(B, Hq, SPLITS)](q, k_cache, v_cache, acc, kv_lens, scale * LOG2E, q.stride(0), q.stride(1),
                              k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), acc.stride(0), acc.stride(1),
                              acc.stride(2), GROUP=Hq // k_cache.shape[1], D=D, SPLITS=SPLITS, BLOCK_N=16,
                              BLOCK_D=bd)
    _reduce[(B, Hq)](acc, out, acc.stride(0), acc.stride(1), acc.stride(2), out.stride(0), out.stride(1),
                     D=D, SPLITS=SPLITS, BLOCK_D=bd)
    return out
