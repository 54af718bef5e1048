"""attention.decode entry for LightLLM's GQA flash decoding (lightllm 0.0.1, stage 1 + stage 2).

LightLLM reads K/V from a token pool [num_tokens, Hkv, D] through a request-to-token table. Our
contiguous cache [B, Hkv, S, D] is such a pool seen through a strided view (token t = b * Hkv * S + s,
token stride D, head stride S * D), so nothing is copied. LightLLM's launcher fixes the scale at
1/sqrt(D); the adapter launches its stage-1 kernel with the call's scale (the launcher's own grid and
constants), then calls its stage-2 launcher.
"""

import torch
import triton
from _source import load

_stage1 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/gqa_flash_decoding_stage1.py")
_stage2 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/gqa_flash_decoding_stage2.py")
BLOCK_SEQ = 128


def _pool(cache):
    B, hkv, S, d = cache.shape
    return cache.as_strided(((B - 1) * hkv * S + S, hkv, d), (d, S * d, 1))


def entry(q, k_cache, v_cache, kv_lens, scale):
    B, hq, d = q.shape
    hkv, S = k_cache.shape[1], k_cache.shape[2]
    dev = q.device
    req_to_tokens = (torch.arange(B, device=dev)[:, None] * (hkv * S) + torch.arange(S, device=dev)[None, :]).to(
        torch.int32
    )
    lens = kv_lens.tolist()
    batch_ids = [b for b, n in enumerate(lens) for _ in range(0, n, BLOCK_SEQ)]
    starts = [s for n in lens for s in range(0, n, BLOCK_SEQ)]
    block_batch_ids = torch.tensor(batch_ids, dtype=torch.int32, device=dev)
    block_start_indexes = torch.tensor(starts, dtype=torch.int32, device=dev)
    nsplit = max(lens) // BLOCK_SEQ + 1
    mid_o = torch.empty((B, hq, nsplit, d), dtype=torch.float32, device=dev)
    mid_lse = torch.empty((B, hq, nsplit), dtype=torch.float32, device=dev)
    k, v = _pool(k_cache), _pool(v_cache)
    b_req_idx = torch.arange(B, dtype=torch.int32, device=dev)
    group = hq // hkv
    _stage1._fwd_kernel_flash_decode_stage1[(len(batch_ids), hkv)](
        block_batch_ids,
        block_start_indexes,
        q,
        k,
        v,
        scale,
        req_to_tokens,
        b_req_idx,
        kv_lens,
        mid_o,
        mid_lse,
        req_to_tokens.stride(0),
        req_to_tokens.stride(1),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_o.stride(3),
        mid_lse.stride(0),
        mid_lse.stride(1),
        mid_lse.stride(2),
        group,
        Q_HEAD_NUM=max(16, triton.next_power_of_2(group)),
        BLOCK_SEQ=BLOCK_SEQ,
        BLOCK_DMODEL=d,
        BLOCK_N=16,
        num_warps=2,
        num_stages=2,
    )
    out = torch.empty_like(q)
    _stage2.flash_decode_stage2(mid_o, mid_lse, kv_lens, out, BLOCK_SEQ)
    return out
