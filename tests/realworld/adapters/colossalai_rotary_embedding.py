"""rope entry for ColossalAI's no-pad rotary_embedding (colossalai 0.5.0): neox pairs, in place.

ColossalAI passes per-token cos/sin rows [T, D / 2] (gathered from its cache by position), in the
activation dtype.
"""

import torch
from _source import load

import kernalin_ci

_kernel = load("colossalai-0.5.0", "colossalai/kernel/triton/no_pad_rotary_embedding.py")


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    d = q.shape[-1]
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    _kernel.rotary_embedding(q, k, freqs.cos().to(q.dtype), freqs.sin().to(q.dtype))
    return q, k
