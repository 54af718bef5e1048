"""RoPE through separate cos and sin tables the entry builds (HF's [rows, rotary_dim], the half table repeated),
q and k in place, one program per (token, head): the layout of LightLLM's, Liger's, LMDeploy's and Unsloth's
kernels. `entry` reads row t of per-token tables; `entry_by_position` reads row positions[t] of tables over
every position; the other entries are bugs: a sign flipped, the cos and sin tensors swapped by the caller, and
row 0 read for every token. Test-only (tests/test_ptx_engine.py)."""

import torch
import triton
import triton.language as tl

from kernalin_ci import current_params


@triton.jit
def _rope(
    X,
    COS,
    SIN,
    P,
    s_xt,
    s_xh,
    s_ct,
    HALF: tl.constexpr,
    BY_POSITION: tl.constexpr,
    SIGN: tl.constexpr,
    ROW0: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.arange(0, HALF)
    row = t
    if BY_POSITION:
        row = tl.load(P + t)
    if ROW0:
        row = 0
    c = tl.load(COS + row * s_ct + i).to(tl.float32)
    s = tl.load(SIN + row * s_ct + i).to(tl.float32)
    base = X + t * s_xt + h * s_xh
    x1 = tl.load(base + i).to(tl.float32)
    x2 = tl.load(base + i + HALF).to(tl.float32)
    tl.store(base + i, (x1 * c - SIGN * x2 * s).to(X.dtype.element_ty))
    tl.store(base + i + HALF, (x2 * c + x1 * s).to(X.dtype.element_ty))


def _tables(q, rows):
    d = q.shape[-1]
    inv = 1.0 / (current_params().get("base", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = rows.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(q.dtype), emb.sin().to(q.dtype)


def _run(q, k, positions, by_position=False, sign=1.0, row0=False, swap=False):
    rows = torch.arange(current_params()["max_position"]) if by_position else positions
    cos, sin = _tables(q, rows.to(q.device))
    if swap:
        cos, sin = sin, cos
    for x in (q, k):
        _rope[(x.shape[0], x.shape[1])](
            x,
            cos,
            sin,
            positions,
            x.stride(0),
            x.stride(1),
            cos.stride(0),
            HALF=x.shape[-1] // 2,
            BY_POSITION=by_position,
            SIGN=sign,
            ROW0=row0,
        )
    return q, k


def entry(q, k, positions):
    return _run(q, k, positions)


def entry_by_position(q, k, positions):
    return _run(q, k, positions, by_position=True)


def entry_sign(q, k, positions):
    return _run(q, k, positions, sign=-1.0)


def entry_swapped(q, k, positions):
    return _run(q, k, positions, swap=True)


def entry_row0(q, k, positions):
    return _run(q, k, positions, row0=True)
