"""decode_step entry composing SGLang's own decode-path kernels (sglang 0.5.23), two launches per step as
its attention backend runs them with the fused rope/cache path: fused_qk_rope_reshape_and_cache rotates q
and k at each token's position and writes the rotated key and the value into the paged cache at the
token's slot (one program per token and query head; the first query head of each KV group writes its KV
head), then the Triton decode attention (sglang_paged_decode_attention.py) attends over the cache.

The cache is the kernel's flash layout [num_blocks, block_size, Hkv, D]: our NHD cache as it is, and its
flattened token pool for the attention. cos_sin is SGLang's cos/sin cache, one row per position (the D/2
cosines, then the D/2 sines), in the activation dtype, up to the largest position of the call. The
kernel writes the rotated q to a new tensor, so q, k and v stay unchanged.
"""

import torch
from _source import load
from sglang_paged_decode_attention import attend, kv_indices

import kernalin_ci

_fused = load("sglang-0.5.23", "sglang/kernels/ops/attention/fused_qk_rope_reshape_and_cache.py")


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    p = kernalin_ci.current_params()
    B, hq, d = q.shape
    hkv = k.shape[1]
    bs = k_cache.shape[1]
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=q.device, dtype=torch.float32) / r))
    freqs = torch.arange(int(positions.max()) + 1, device=q.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(q.dtype)
    q_rot, _, _, _ = _fused.fused_qk_rope_reshape_and_cache(
        q, k, v, k_cache, v_cache, slot_mapping, positions, cos_sin, None, None,
        is_neox=p.get("style", "neox") == "neox", flash_layout=True, output_zeros=False,
    )  # fmt: skip
    indptr, indices = kv_indices(block_tables, kv_lens, bs)
    return attend(q_rot.view(B, hq, d), k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d), indptr, indices, scale, bs)
