"""Paged decode attention with tl.dot at Triton's default input precision (TF32 for float32 operands on
an NVIDIA GPU), for the decode loop: `attention` (attention.decode_paged, a pipeline member) and
`decode_step` (rope and the cache append in torch, then this kernel). `attention_ieee`/`decode_step_ieee`:
the same with input_precision="ieee". `decode_step_gqa_bug`: the mutant, whose program maps the query
heads of a KV head interleaved (h = g + r * Hkv) instead of contiguous (h = g * G + r).
One program per (sequence, KV head) holds the group's query heads as the rows of a >= 16-row tile."""
import torch
import triton
import triton.language as tl


@triton.jit
def _paged_dot(Q, KC, VC, Tables, Lens, Out, scale, s_qb, s_qh, s_cn, s_cp, s_ch, s_tb, s_ob, s_oh,
               GROUP: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               IEEE: tl.constexpr, GQA_BUG: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    L = tl.load(Lens + b)
    r = tl.arange(0, BLOCK_H)
    if GQA_BUG:
        heads = g + r * HKV
    else:
        heads = g * GROUP + r
    hm = r < GROUP
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(Q + b * s_qb + heads[:, None] * s_qh + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0)
    q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(0, L, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < L
        blk = tl.load(Tables + b * s_tb + j // PAGE, mask=jm, other=0).to(tl.int64)
        row = blk * s_cn + (j % PAGE) * s_cp + g * s_ch
        mask = jm[:, None] & dm[None, :]
        k = tl.load(KC + row[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.load(VC + row[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        else:
            s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(jm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    tl.store(Out + b * s_ob + heads[:, None] * s_oh + d[None, :], (acc / l_i[:, None]).to(Out.dtype.element_ty),
             mask=hm[:, None] & dm[None, :])


def _attend(q, k_cache, v_cache, block_tables, kv_lens, scale, ieee=False, gqa_bug=False):
    B, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape  # NHD
    assert q.stride(2) == 1 and k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride()
    out = torch.empty_like(q)
    _paged_dot[(B, Hkv)](q, k_cache, v_cache, block_tables, kv_lens, out, scale, q.stride(0), q.stride(1),
                         k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
                         out.stride(0), out.stride(1), GROUP=Hq // Hkv, HKV=Hkv, D=D, PAGE=page,
                         BLOCK_H=max(16, triton.next_power_of_2(Hq // Hkv)), BLOCK_N=32,
                         BLOCK_D=max(16, triton.next_power_of_2(D)), IEEE=ieee, GQA_BUG=gqa_bug)
    return out


def attention(q, k_cache, v_cache, block_tables, kv_lens, scale):
    return _attend(q, k_cache, v_cache, block_tables, kv_lens, scale)


def attention_ieee(q, k_cache, v_cache, block_tables, kv_lens, scale):
    return _attend(q, k_cache, v_cache, block_tables, kv_lens, scale, ieee=True)


def _neox(x, positions, base=10000.0):
    """NeoX rotation in float32 (torch), back in x's dtype."""
    half = x.shape[-1] // 2
    inv = base ** (-torch.arange(half, device=x.device, dtype=torch.float64) / half)
    ang = (positions.to(torch.float64)[:, None] * inv[None, :]).to(torch.float32)
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


def _step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, **kw):
    qr, kr = _neox(q, positions), _neox(k, positions)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = kr[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
    return _attend(qr, k_cache, v_cache, block_tables, kv_lens, scale, **kw)


def decode_step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    return _step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale)


def decode_step_ieee(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    return _step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, ieee=True)


def decode_step_gqa_bug(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    return _step(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale, gqa_bug=True)
