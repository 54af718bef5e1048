"""rope entry for vLLM's Triton M-RoPE (vLLM 0.34.0, vllm/model_executor/layers/rotary_embedding/mrope.py):
Qwen2-VL's multi-section rotary embedding, q and k in place, one program per token, each frequency's cos/sin
taken from the position row of its section (temporal, height, width; `mrope_section` [t, h, w]), neox or gptj
pairs over the first `rotary_dim` dims of each head.

The entry calls the module's `_mrope_apply`, the function vLLM registers as its `mrope` op: it gathers the
cos/sin cache at the [3, T] positions and launches `_triton_mrope_forward` through `triton_mrope`. The cache is
built as vLLM's `RotaryEmbeddingBase._compute_cos_sin_cache` builds it (float32 inverse frequencies
1 / base^(2i/r), cos and sin of position * inv_freq, concatenated) and cast to q's dtype as
`_match_cos_sin_cache_dtype` does, for positions < max_position. The module's package imports (vLLM's platform
object, its Triton re-export, the custom-op registration, the rotary base classes) are stood in for by a few
lines.
"""

import functools

import torch
import triton
import triton.language as tl
from _source import load

import kernalin_ci


class _Platform:
    @staticmethod
    def is_rocm():
        return False


_PKG = "vllm.model_executor.layers.rotary_embedding"
_m = load(
    "vllm-0.34.0",
    "vllm/model_executor/layers/rotary_embedding/mrope.py",
    stubs={
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.utils.torch_utils": {"direct_register_custom_op": lambda **kwargs: None},
        f"{_PKG}.base": {"RotaryEmbeddingBase": type("RotaryEmbeddingBase", (), {})},
        f"{_PKG}.yarn_scaling_rope": {
            "YaRNScalingRotaryEmbedding": type("YaRNScalingRotaryEmbedding", (), {}),
            "yarn_get_mscale": lambda *args: 1.0,
        },
    },
    package=_PKG,
)


@functools.lru_cache(maxsize=8)
def _cos_sin_cache(base: float, rotary_dim: int, max_position: int, dtype: torch.dtype, device: str):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.einsum("i,j -> ij", torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device, dtype=dtype)


def entry(q, k, positions):
    p = kernalin_ci.current_params()
    T, hq, d = q.shape
    sections = [int(s) for s in p["mrope_section"]]
    r = p.get("rotary_dim") or 2 * sum(sections)
    cache = _cos_sin_cache(float(p.get("base", 10000.0)), r, int(p["max_position"]), q.dtype, str(q.device))
    t, h, w = sections
    _m._mrope_apply(
        positions, q.view(T, hq * d), k.view(T, -1), cache, d, r, t, h, w, False, p.get("style", "neox") == "neox"
    )
    return q, k
