"""A fused decode step: one program per (sequence, KV head) rotates q and k, appends k and v to the paged
cache, then attends over the sequence (new token included) for the query heads of its GQA group."""
import math

import torch
import triton
import triton.language as tl

ROPE_BASE = 10000.0


@triton.jit
def _decode_step_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, kc_ptr, vc_ptr, slot_ptr, tables_ptr, lens_ptr, o_ptr,
                        scale, log2_base, sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sc_blk, sc_slot, sc_h, st_b,
                        so_b, so_h, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr,
                        BLOCK_HALF: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.arange(0, BLOCK_HALF)
    i_mask = i < HALF
    pos = tl.load(pos_ptr + b).to(tl.float32)
    angle = pos * tl.exp2(-(i.to(tl.float32) / HALF) * log2_base)
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    # rotate the new key and write it, with the value, into the token's slot
    k1 = tl.load(k_ptr + b * sk_b + g * sk_h + i, mask=i_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + b * sk_b + g * sk_h + HALF + i, mask=i_mask, other=0.0).to(tl.float32)
    v1 = tl.load(v_ptr + b * sv_b + g * sv_h + i, mask=i_mask, other=0.0)
    v2 = tl.load(v_ptr + b * sv_b + g * sv_h + HALF + i, mask=i_mask, other=0.0)
    slot = tl.load(slot_ptr + b)
    new = (slot // BLOCK_SIZE) * sc_blk + (slot % BLOCK_SIZE) * sc_slot + g * sc_h + i
    tl.store(kc_ptr + new, (k1 * cos - k2 * sin).to(kc_ptr.dtype.element_ty), mask=i_mask)
    tl.store(kc_ptr + new + HALF, (k2 * cos + k1 * sin).to(kc_ptr.dtype.element_ty), mask=i_mask)
    tl.store(vc_ptr + new, v1, mask=i_mask)
    tl.store(vc_ptr + new + HALF, v2, mask=i_mask)
    tl.debug_barrier()  # every lane of the program sees the new slot before the loop reads it back
    # rotate the group's query heads
    h = g * GROUP + tl.arange(0, GROUP)
    q1 = tl.load(q_ptr + b * sq_b + h[:, None] * sq_h + i[None, :], mask=i_mask[None, :], other=0.0)
    q2 = tl.load(q_ptr + b * sq_b + h[:, None] * sq_h + HALF + i[None, :], mask=i_mask[None, :], other=0.0)
    qr1 = q1.to(tl.float32) * cos[None, :] - q2.to(tl.float32) * sin[None, :]
    qr2 = q2.to(tl.float32) * cos[None, :] + q1.to(tl.float32) * sin[None, :]
    # online softmax over the cache, one block per step
    kv_len = tl.load(lens_ptr + b)
    m = tl.full((GROUP,), float("-inf"), tl.float32)
    l = tl.zeros((GROUP,), tl.float32)
    acc1 = tl.zeros((GROUP, BLOCK_HALF), tl.float32)
    acc2 = tl.zeros((GROUP, BLOCK_HALF), tl.float32)
    for start in range(0, kv_len, BLOCK_SIZE):
        block = tl.load(tables_ptr + b * st_b + start // BLOCK_SIZE).to(tl.int64)
        n = tl.arange(0, BLOCK_SIZE)
        n_mask = start + n < kv_len
        row = block * sc_blk + n * sc_slot + g * sc_h
        mask = n_mask[:, None] & i_mask[None, :]
        kk1 = tl.load(kc_ptr + row[:, None] + i[None, :], mask=mask, other=0.0).to(tl.float32)
        kk2 = tl.load(kc_ptr + row[:, None] + HALF + i[None, :], mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(qr1[:, None, :] * kk1[None, :, :], 2) + tl.sum(qr2[:, None, :] * kk2[None, :, :], 2)
        s = tl.where(n_mask[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        vv1 = tl.load(vc_ptr + row[:, None] + i[None, :], mask=mask, other=0.0).to(tl.float32)
        vv2 = tl.load(vc_ptr + row[:, None] + HALF + i[None, :], mask=mask, other=0.0).to(tl.float32)
        acc1 = acc1 * alpha[:, None] + tl.sum(p[:, :, None] * vv1[None, :, :], 1)
        acc2 = acc2 * alpha[:, None] + tl.sum(p[:, :, None] * vv2[None, :, :], 1)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    o = o_ptr + b * so_b + h[:, None] * so_h + i[None, :]
    tl.store(o, (acc1 / l[:, None]).to(o_ptr.dtype.element_ty), mask=i_mask[None, :])
    tl.store(o + HALF, (acc2 / l[:, None]).to(o_ptr.dtype.element_ty), mask=i_mask[None, :])


def decode_step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    group = Hq // Hkv
    assert group & (group - 1) == 0 and D % 2 == 0 and k_cache.stride() == v_cache.stride()
    out = torch.empty_like(q)
    _decode_step_kernel[(B, Hkv)](
        q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, out, scale,
        math.log2(ROPE_BASE), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0), out.stride(0),
        out.stride(1), GROUP=group, BLOCK_SIZE=k_cache.shape[1], HALF=D // 2,
        BLOCK_HALF=triton.next_power_of_2(D // 2))
    return out
