"""GPT-J-style RoPE whose cos/sin table is stored in float16 while q and k are float32

Parent: correct_gptj_table.py. Injected bug, in _cos_sin_table: the table is built in
float32 from the definition and then cast to half precision, as a model-wide `.half()`
cast does to a cos/sin cache kept as a buffer, while the activations stay float32:
`.contiguous().to(device, torch.float16)` where it should be `.contiguous().to(device)`.
Every cos and sin is off by up to 2^-11 of itself: ~1.4e-4 of each row's norm at every
position past the first few, on float32 activations that a correct kernel rotates to
~1e-6. A per-token angle allowance of p * 2^-23 hides it above position ~1000, and the
float32 tolerance of 2e-3 hides it everywhere.
Bug class: precision.
Modelled on huggingface/transformers issue #25681: Llama's rotary embedding kept its
cos/sin cache as a buffer, so casting the model to float16/bfloat16 cast the cache too,
and every position got rounded cos/sin values.
pos-0 probe: missed. At position 0 the table holds cos = 1 and sin = 0, exact in
float16: the rotation is the identity either way.
"""
import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": "precision",
    "pos0": "missed",
    "params": {"style": "gptj"},
    "modelled_on": "https://github.com/huggingface/transformers/issues/25681",
    "style": "gptj, float32 cos/sin table [max_position, r] cached by params, one program per token",
}

_TABLES = {}


def _cos_sin_table(rotary_dim, base, max_position, device):
    key = (rotary_dim, base, max_position, str(device))
    if key not in _TABLES:
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        _TABLES[key] = torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous().to(device, torch.float16)
    return _TABLES[key]


@triton.jit
def _rotate_heads_gptj(src, dst, stride_src_h, stride_dst_h, num_heads, cos, sin,
                       HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (i < HALF)
    x1 = tl.load(src + h * stride_src_h + 2 * i, mask=mask).to(tl.float32)
    x2 = tl.load(src + h * stride_src_h + 2 * i + 1, mask=mask).to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    tl.store(dst + h * stride_dst_h + 2 * i, out1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + h * stride_dst_h + 2 * i + 1, out2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _rope_gptj_table_kernel(q, k, q_out, k_out, positions, cos_sin, stride_cs,
                            stride_qt, stride_qh, stride_kt, stride_kh,
                            stride_qot, stride_qoh, stride_kot, stride_koh,
                            num_q_heads, num_kv_heads,
                            HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                            BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(positions + t)
    i = tl.arange(0, BLOCK_HALF)
    row = cos_sin + pos * stride_cs
    cos = tl.load(row + i, mask=i < HALF)[None, :]
    sin = tl.load(row + HALF + i, mask=i < HALF)[None, :]
    _rotate_heads_gptj(q + t * stride_qt, q_out + t * stride_qot, stride_qh, stride_qoh, num_q_heads,
                       cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    _rotate_heads_gptj(k + t * stride_kt, k_out + t * stride_kot, stride_kh, stride_koh, num_kv_heads,
                       cos, sin, HALF, BLOCK_HALF, BLOCK_HKV)


def entry(q, k, positions):
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    params = current_params()
    assert params.get("rotary_dim") in (None, D), "this kernel rotates the whole head"
    assert q.stride(2) == 1 and k.stride(2) == 1 and D % 2 == 0
    cos_sin = _cos_sin_table(D, float(params.get("base", 10000.0)), int(params.get("max_position", 65536)),
                             q.device)
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k)
    half = D // 2
    _rope_gptj_table_kernel[(T,)](
        q, k, q_out, k_out, positions, cos_sin, cos_sin.stride(0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        Hq, Hkv,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HKV=triton.next_power_of_2(Hkv),
    )
    return q_out, k_out
