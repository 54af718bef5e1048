"""Bug fixture (from attn_correct_guarded_combine.py): the guarded online combine weights a split by
exp(lse_i) without subtracting the running max of the lse."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": "softmax-no-max", "pos0": None, "params": {}, "modelled_on": None,
             "style": "split-kv, guarded stage 1 and a guarded online combine"}

SPLITS = 4


@triton.jit
def _stage1(Q, K, V, Mid, MidLse, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_mb, s_mh, s_ms,
            GROUP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    per_split = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    split_start = sp * per_split
    split_end = tl.minimum(split_start + per_split, kv_len)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    e_max = -float("inf")
    e_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    if split_end > split_start:
        for start in range(split_start, split_end, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            nm = n < split_end
            kvm = nm[:, None] & dm[None, :]
            k = tl.load(K + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
            qk = tl.sum(q[None, :] * k.to(tl.float32), 1) * scale
            qk = tl.where(nm, qk, float("-inf"))
            n_e_max = tl.maximum(tl.max(qk, 0), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.exp(qk - n_e_max)
            v = tl.load(V + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=kvm, other=0.0)
            acc = acc * re_scale + tl.sum(p[:, None] * v.to(tl.float32), 0)
            e_sum = e_sum * re_scale + tl.sum(p, 0)
            e_max = n_e_max
        tl.store(Mid + b * s_mb + h * s_mh + sp * s_ms + d, acc / e_sum, mask=dm)
        tl.store(MidLse + (b * tl.num_programs(1) + h) * SPLITS + sp, e_max + tl.log(e_sum))


@triton.jit
def _stage2(Mid, MidLse, O, Lens, v_scale, s_mb, s_mh, s_ms, s_ob, s_oh,
            D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    kv_len = tl.load(Lens + b)
    per_split = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_N) * BLOCK_N
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    e_sum = 0.0
    e_max = -float("inf")
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for sp in range(0, SPLITS):
        split_start = sp * per_split
        split_end = tl.minimum(split_start + per_split, kv_len)
        if split_end > split_start:
            tv = tl.load(Mid + b * s_mb + h * s_mh + sp * s_ms + d, mask=dm, other=0.0)
            tlogic = tl.load(MidLse + (b * tl.num_programs(1) + h) * SPLITS + sp)
            n_e_max = tl.maximum(tlogic, e_max)
            old_scale = tl.exp(e_max - n_e_max)
            acc *= old_scale
            exp_logic = tl.exp(tlogic)
            acc += exp_logic * tv
            e_sum = e_sum * old_scale + exp_logic
            e_max = n_e_max
    tl.store(O + b * s_ob + h * s_oh + d, (acc / e_sum * v_scale).to(O.dtype.element_ty), mask=dm)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    mid = torch.empty((B, Hq, SPLITS, D), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((B, Hq, SPLITS), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    bd = triton.next_power_of_2(D)
    _stage1[(B, Hq, SPLITS)](q, k_cache, v_cache, mid, mid_lse, kv_lens, scale, q.stride(0), q.stride(1),
                             k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), mid.stride(0), mid.stride(1),
                             mid.stride(2), GROUP=Hq // k_cache.shape[1], D=D, SPLITS=SPLITS, BLOCK_N=16,
                             BLOCK_D=bd)
    _stage2[(B, Hq)](mid, mid_lse, out, kv_lens, 1.0, mid.stride(0), mid.stride(1), mid.stride(2), out.stride(0),
                     out.stride(1), D=D, SPLITS=SPLITS, BLOCK_N=16, BLOCK_D=bd)
    return out
