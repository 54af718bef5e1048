"""rope entry for Unsloth's fused q/k RoPE (unsloth 2026.10.9, unsloth/kernels/rope_embedding.py): neox
pairs (rotate_half), q and k in one launch, in place.

Unsloth's launcher takes Q and K as [batch, heads, seq, D] at any strides and per-row cos/sin tables
(HF's, the half table repeated); our [T, H, D] is a [1, T, H, D] buffer, so the adapter passes its
transposed views and one cos/sin row per token (the table's rows at the tokens' positions), the layout of
its prefill path (no rope indices: row t of the tables rotates token t). Its module imports a few package
utilities; the stand-ins below are our own lines (no torch.compile registration, the eager kernel).
"""

from contextlib import nullcontext

import torch
import triton
from _source import load

import kernalin_ci

_STUBS = {
    "unsloth.device_type": {"DEVICE_COUNT": 1, "DEVICE_TYPE_TORCH": "cuda"},
    "unsloth.kernels.utils": {
        "long_indexing": lambda *tensors, block=0: any(t.numel() + block >= 2**31 for t in tensors),
        "next_power_of_2": triton.next_power_of_2,
        "torch_gpu_device": lambda device: nullcontext(),
        "torch_device_stream": None,
    },
    "unsloth.kernels.rms_layernorm": {
        "_BF16_TRACEABLE": False,
        "_TRACEABLE": False,
        "_eager_kernel": lambda kernel: kernel,
        "_tag_compile_cache": lambda path: None,
        "_traced_kernel": lambda kernel: kernel,
    },
}
_m = load("unsloth-2026.10.9", "unsloth/kernels/rope_embedding.py", stubs=_STUBS, package="unsloth.kernels")


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    d = q.shape[-1]
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=q.device, dtype=torch.float32) / r))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    q4, k4 = q[None].transpose(1, 2), k[None].transpose(1, 2)
    _m._rope_qk(q4, k4, q4, k4, emb.cos().to(q.dtype), emb.sin().to(q.dtype), None, False, False, lambda kern: kern)
    return q, k
