"""Bug fixture (from attn_correct_logits_two_stage.py): the second kernel exponentiates the stored scores
without subtracting their running max."""
import torch
import triton
import triton.language as tl

CATALOGUE = {"op": "attention.decode", "bug_class": "softmax-no-max", "pos0": None, "params": {}, "modelled_on": None,
             "style": "two kernels: logits to scratch, softmax and P @ V in the second"}


@triton.jit
def _qk(Q, K, Logits, Lens, scale, s_qb, s_qh, s_kb, s_kh, s_ks, s_lb, s_lh,
        GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    blk = tl.program_id(2)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < kv_len
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    k = tl.load(K + b * s_kb + g * s_kh + n[:, None] * s_ks + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0)
    att = tl.sum(q[None, :] * k.to(tl.float32), 1) * scale
    tl.store(Logits + b * s_lb + h * s_lh + n, att, mask=nm)


@triton.jit
def _softmax_v(Logits, V, O, Lens, s_lb, s_lh, s_vb, s_vh, s_vs, s_ob, s_oh,
               GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    g = h // GROUP
    kv_len = tl.load(Lens + b)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    e_max = float("-inf")
    e_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, kv_len, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < kv_len
        qk = tl.load(Logits + b * s_lb + h * s_lh + n, mask=nm, other=float("-inf"))
        n_e_max = tl.maximum(tl.max(qk, 0), e_max)
        old_scale = tl.exp(e_max - n_e_max)
        p = tl.exp(qk)
        e_sum = e_sum * old_scale + tl.sum(p, 0)
        v = tl.load(V + b * s_vb + g * s_vh + n[:, None] * s_vs + d[None, :], mask=nm[:, None] & dm[None, :],
                    other=0.0)
        acc = acc * old_scale + tl.sum(p[:, None] * v.to(tl.float32), 0)
        e_max = n_e_max
    tl.store(O + b * s_ob + h * s_oh + d, (acc / e_sum).to(O.dtype.element_ty), mask=dm)


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, Hq, D = q.shape
    L = k_cache.shape[2]
    logits = torch.empty((B, Hq, L), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    group = Hq // k_cache.shape[1]
    bd = triton.next_power_of_2(D)
    _qk[(B, Hq, triton.cdiv(int(kv_lens.max()), 32))](
        q, k_cache, logits, kv_lens, scale, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), logits.stride(0), logits.stride(1), GROUP=group, D=D, BLOCK_N=32, BLOCK_D=bd)
    _softmax_v[(B, Hq)](logits, v_cache, out, kv_lens, logits.stride(0), logits.stride(1), v_cache.stride(0),
                        v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), GROUP=group, D=D,
                        BLOCK_N=32, BLOCK_D=bd)
    return out
