"""rope entry for Liger-Kernel's liger_rope forward (liger-kernel 0.8.5): neox pairs, in place.

Liger takes q [batch, heads, seq, D] as a transposed view of a [batch, seq, heads, D] buffer and
HF-style cos/sin [1, seq, D] (the half table repeated); our [T, H, D] is that buffer with batch 1, so
the adapter passes views and gets q and k rotated in place.
"""

import torch
from _source import load

import kernalin_ci

_kernel = load("liger-kernel-0.8.5", "liger_kernel/ops/rope.py")


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    d = q.shape[-1]
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=q.device, dtype=torch.float32) / r))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    q4, k4 = q[None].transpose(1, 2), k[None].transpose(1, 2)
    q_out, k_out, _, _ = _kernel.rope_forward(q4, k4, emb.cos().to(q.dtype), emb.sin().to(q.dtype), rotary_dim=r)
    return q_out.transpose(1, 2)[0], k_out.transpose(1, 2)[0]
