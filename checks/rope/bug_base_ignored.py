"""GPT-J RoPE whose cos/sin table is always built with base 10000, whatever rope base is configured

Parent: correct_gptj_table.py. Injected bug, in entry(): the table is built with
`10000.0` where it should be `float(params.get("base", 10000.0))`. Verified with base =
500000 (Llama-3's rope_theta): every frequency but the first is too high.
Bug class: rope-frequency.
Modelled on lyogavin/airllm PR #369: the MLX Llama path never carried rope_theta from the
config, so sanitize_config supplied the Llama-2 default 10000 for Llama 3 models
(rope_theta 500000) and output degraded past ~1k tokens.
pos-0 probe: missed. Row 0 of a table built with any base holds cos = 1 and sin = 0 (every
angle is 0 at position 0), so the rotation is the identity.
"""
import torch
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {
    "op": "rope",
    "bug_class": "rope-frequency",
    "pos0": "missed",
    "params": {"style": "gptj", "base": 500000.0},
    "modelled_on": "https://github.com/lyogavin/airllm/pull/369",
    "style": "gptj cos/sin table built with base 10000 whatever the configured base",
}

_TABLES = {}


def _cos_sin_table(rotary_dim, base, max_position, device):
    key = (rotary_dim, base, max_position, str(device))
    if key not in _TABLES:
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        _TABLES[key] = torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous().to(device)
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
    cos_sin = _cos_sin_table(D, 10000.0, int(params.get("max_position", 65536)),
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
