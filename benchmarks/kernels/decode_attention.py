"""Two correct attention.decode kernels that differ in speed, and copies made slower on purpose.

Entries (docs/ops.md attention.decode, contiguous KV cache):
- `split_kv`: one program per (sequence, query head, split); SPLITS partial softmax
  states combined by a second kernel. Fast at long kv_len and small batch.
- `single_pass`: one program per (sequence, query head) walking the whole sequence.
  At long kv_len and small batch it leaves most of the GPU idle.
- `split_kv_slow2` / `split_kv_slow1`: `split_kv` plus extra work: every program
  reads the first 2% (1%) of its tokens' keys a second time (volatile loads, so
  the compiler keeps them) into a sum that is multiplied by a runtime zero, so
  the output is bit-identical to `split_kv`.
Online softmax in float32 with the max subtracted; positions >= kv_len are masked
before they can touch the result (their scores are -inf, their values read as 0).
"""

import torch
import triton
import triton.language as tl

SPLITS = 16
BLOCK_N = 64
NUM_WARPS = 4  # Triton's default; benchmarks/live_eval.py varies it, SPLITS and BLOCK_N


@triton.jit
def _split_kernel(
    q,
    k,
    v,
    lens,
    mid_o,
    mid_m,
    mid_l,
    scale,
    zero,
    extra_per_mille,
    sqb,
    sqh,
    skb,
    skh,
    sks,
    svb,
    svh,
    svs,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    g = h // GROUP
    L = tl.load(lens + b)
    chunk = tl.cdiv(tl.cdiv(L, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * chunk
    hi = tl.minimum(lo + chunk, L)
    d = tl.arange(0, D)
    qv = tl.load(q + b * sqb + h * sqh + d).to(tl.float32)
    m = tl.full([1], float("-inf"), tl.float32)
    l_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        mask = n < hi
        kt = tl.load(k + b * skb + g * skh + n[:, None] * sks + d[None, :], mask=mask[:, None], other=0.0)
        s = tl.sum(kt.to(tl.float32) * qv[None, :], axis=1) * scale
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        vt = tl.load(v + b * svb + g * svh + n[:, None] * svs + d[None, :], mask=mask[:, None], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * vt.to(tl.float32), axis=0)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        m = m_new
    # extra work of the slow copies (extra_per_mille = 0 for split_kv: the loop is empty)
    extra = (hi - lo) * extra_per_mille // 1000
    junk = tl.zeros([D], tl.float32)
    for start in range(lo, lo + extra, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        mask = n < lo + extra
        kt = tl.load(
            k + b * skb + g * skh + n[:, None] * sks + d[None, :], mask=mask[:, None], other=0.0, volatile=True
        )
        junk += tl.sum(kt.to(tl.float32), axis=0)
    acc = acc + junk * zero
    row = (b * tl.num_programs(1) + h) * SPLITS + sp
    tl.store(mid_o + row * D + d, acc)
    tl.store(mid_m + row + tl.arange(0, 1), m)
    tl.store(mid_l + row + tl.arange(0, 1), l_sum)


@triton.jit
def _combine_kernel(mid_o, mid_m, mid_l, out, sob, soh, D: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    row0 = (b * tl.num_programs(1) + h) * SPLITS
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    m = tl.load(mid_m + row0 + s)
    lsum = tl.load(mid_l + row0 + s)
    acc = tl.load(mid_o + (row0 + s)[:, None] * D + d[None, :])
    big = tl.max(m, axis=0)
    w = tl.where(lsum > 0, tl.exp(m - big), 0.0)
    o = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * lsum, axis=0)
    tl.store(out + b * sob + h * soh + d, o.to(out.dtype.element_ty))


@triton.jit
def _single_kernel(
    q,
    k,
    v,
    lens,
    out,
    scale,
    sqb,
    sqh,
    skb,
    skh,
    sks,
    svb,
    svh,
    svs,
    sob,
    soh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    L = tl.load(lens + b)
    d = tl.arange(0, D)
    qv = tl.load(q + b * sqb + h * sqh + d).to(tl.float32)
    m = tl.full([1], float("-inf"), tl.float32)
    l_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(0, L, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        mask = n < L
        kt = tl.load(k + b * skb + g * skh + n[:, None] * sks + d[None, :], mask=mask[:, None], other=0.0)
        s = tl.sum(kt.to(tl.float32) * qv[None, :], axis=1) * scale
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        vt = tl.load(v + b * svb + g * svh + n[:, None] * svs + d[None, :], mask=mask[:, None], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * vt.to(tl.float32), axis=0)
        l_sum = l_sum * alpha + tl.sum(p, axis=0)
        m = m_new
    tl.store(out + b * sob + h * soh + d, (acc / l_sum).to(out.dtype.element_ty))


def _split(q, k_cache, v_cache, kv_lens, scale, extra_per_mille):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    mid_o = torch.empty((B, Hq, SPLITS, D), dtype=torch.float32, device=q.device)
    mid_m = torch.empty((B, Hq, SPLITS), dtype=torch.float32, device=q.device)
    mid_l = torch.empty((B, Hq, SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_kernel[(B, Hq, SPLITS)](
        q,
        k_cache,
        v_cache,
        kv_lens,
        mid_o,
        mid_m,
        mid_l,
        scale,
        0.0,
        extra_per_mille,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        GROUP=Hq // Hkv,
        D=D,
        SPLITS=SPLITS,
        BLOCK_N=BLOCK_N,
        num_warps=NUM_WARPS,
    )
    _combine_kernel[(B, Hq)](mid_o, mid_m, mid_l, out, out.stride(0), out.stride(1), D=D, SPLITS=SPLITS)
    return out


def split_kv(q, k_cache, v_cache, kv_lens, scale):
    return _split(q, k_cache, v_cache, kv_lens, scale, 0)


def split_kv_slow2(q, k_cache, v_cache, kv_lens, scale):
    return _split(q, k_cache, v_cache, kv_lens, scale, 20)


def split_kv_slow1(q, k_cache, v_cache, kv_lens, scale):
    return _split(q, k_cache, v_cache, kv_lens, scale, 10)


def single_pass(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = torch.empty_like(q)
    _single_kernel[(B, Hq)](
        q,
        k_cache,
        v_cache,
        kv_lens,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        GROUP=Hq // Hkv,
        D=D,
        BLOCK_N=BLOCK_N,
    )
    return out
