"""rope entry for LMDeploy's PyTorch-engine apply_rotary_pos_emb (lmdeploy 0.18.0): neox pairs
(rotate_half), in place.

LMDeploy passes per-token cos/sin rows [T, rotary_dim] (the half table repeated, as HF builds it) in the
activation dtype; with rotary_dim < D only the first rotary_dim dims are rotated, so the adapter passes q
and k as their own outputs (in place) and the passthrough dims stay as they are.
"""

import torch
from _source import load

import kernalin_ci

_m = load("lmdeploy-0.18.0", "lmdeploy/pytorch/kernels/cuda/apply_rotary_pos_emb.py")


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    d = q.shape[-1]
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=q.device, dtype=torch.float32) / r))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    _m.apply_rotary_pos_emb(q, k, emb.cos().to(q.dtype), emb.sin().to(q.dtype), q_embed=q, k_embed=k)
    return q, k
