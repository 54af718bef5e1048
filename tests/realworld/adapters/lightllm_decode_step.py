"""decode_step entry (block_size 1: a token pool) composing LightLLM's own decode-path kernels (lightllm
0.0.1) as its llama layer runs them, four launches per step: rotary_emb_fwd rotates q and k in place,
destindex_copy_kv writes the rotated key and the value into the pool at each token's destination index,
then the GQA flash decoding stages 1 and 2 attend over the pool through the request-to-token table.

With block_size 1 our caches [num_blocks, 1, Hkv, D] are LightLLM's pools [num_tokens, Hkv, D] and the
block table its request-to-token table: views. The adapter copies q, k, v first (an entry must not modify
them; LightLLM rotates its own activations in place). As in lightllm_gqa_flash_decoding.py, the stage-1
kernel is launched with the call's scale and the launcher's grid and constants.
"""

import torch
import triton
from _source import load

import kernalin_ci

_rotary = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/rotary_emb.py")
_copy = load("lightllm-0.0.1", "lightllm/common/basemodel/triton_kernel/destindex_copy_kv.py")
_stage1 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/gqa_flash_decoding_stage1.py")
_stage2 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/gqa_flash_decoding_stage2.py")
BLOCK_SEQ = 128


def entry(q, k, v, positions, k_cache, v_cache, slot_mapping, block_tables, kv_lens, scale):
    p = kernalin_ci.current_params()
    B, hq, d = q.shape
    hkv = k.shape[1]
    dev = q.device
    r = p.get("rotary_dim") or d
    inv_freq = 1.0 / (p.get("base", 10000.0) ** (torch.arange(0, r, 2, device=dev, dtype=torch.float32) / r))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    q, k, v = q.clone(), k.clone(), v.clone()
    _rotary.rotary_emb_fwd(q, k, freqs.cos().to(q.dtype), freqs.sin().to(q.dtype), partial_rotary_factor=r / d)
    pool_k, pool_v = k_cache[:, 0], v_cache[:, 0]
    _copy.destindex_copy_kv(k, slot_mapping, pool_k)
    _copy.destindex_copy_kv(v, slot_mapping, pool_v)
    lens = kv_lens.tolist()
    batch_ids = [b for b, n in enumerate(lens) for _ in range(0, n, BLOCK_SEQ)]
    starts = [s for n in lens for s in range(0, n, BLOCK_SEQ)]
    nsplit = max(lens) // BLOCK_SEQ + 1
    mid_o = torch.empty((B, hq, nsplit, d), dtype=torch.float32, device=dev)
    mid_lse = torch.empty((B, hq, nsplit), dtype=torch.float32, device=dev)
    b_req_idx = torch.arange(B, dtype=torch.int32, device=dev)
    group = hq // hkv
    _stage1._fwd_kernel_flash_decode_stage1[(len(batch_ids), hkv)](
        torch.tensor(batch_ids, dtype=torch.int32, device=dev),
        torch.tensor(starts, dtype=torch.int32, device=dev),
        q,
        pool_k,
        pool_v,
        scale,
        block_tables,
        b_req_idx,
        kv_lens,
        mid_o,
        mid_lse,
        block_tables.stride(0),
        block_tables.stride(1),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        pool_k.stride(0),
        pool_k.stride(1),
        pool_k.stride(2),
        pool_v.stride(0),
        pool_v.stride(1),
        pool_v.stride(2),
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
