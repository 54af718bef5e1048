"""rope entry for LightLLM's llama rotary_emb_fwd (lightllm 0.0.1): neox pairs, in place.

LightLLM gathers per-token cos/sin rows [T, rotary_dim / 2] from a table built in float32 and cast to the
activation dtype; the adapter forms the same rows for the given positions.
"""

import torch
from _source import load

import kernalin_ci

_kernel = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/rotary_emb.py")


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    d = q.shape[-1]
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=q.device, dtype=torch.float32) / r))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos().to(q.dtype), freqs.sin().to(q.dtype)
    _kernel.rotary_emb_fwd(q, k, cos, sin, partial_rotary_factor=r / d)
    return q, k
