"""attention.decode_paged entry (block_size 1: a token pool) for LightLLM's flash decoding
(lightllm 0.0.1, the MHA/GQA kernel with one program per query head and 256-token split, then the
LSE combine).

With block_size 1 our cache [num_blocks, 1, Hkv, D] is LightLLM's token pool [num_tokens, Hkv, D] and the
block table its request-to-token table: views. LightLLM's launcher fixes the scale at 1/sqrt(D); the
adapter launches the stage-1 kernel with the call's scale (the launcher's grid and constants).
"""

import torch
import triton
from _source import load

_stage1 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/flash_decoding_stage1.py")
_stage2 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/flash_decoding_stage2.py")
BLOCK_SEQ = 256


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, hq, d = q.shape
    k, v = k_cache[:, 0], v_cache[:, 0]
    dev = q.device
    max_len = int(kv_lens.max())
    mid_o = torch.empty((B, hq, max_len // BLOCK_SEQ + 1, d), dtype=torch.float32, device=dev)
    mid_lse = torch.empty((B, hq, max_len // BLOCK_SEQ + 1), dtype=torch.float32, device=dev)
    b_req_idx = torch.arange(B, dtype=torch.int32, device=dev)
    _stage1._fwd_kernel_flash_decode_stage1[(B, hq, triton.cdiv(max_len, BLOCK_SEQ))](
        q,
        k,
        v,
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
        hq // k.shape[1],
        BLOCK_SEQ=BLOCK_SEQ,
        BLOCK_DMODEL=d,
        BLOCK_N=16,
        num_warps=1,
        num_stages=2,
    )
    out = torch.empty_like(q)
    _stage2.flash_decode_stage2(mid_o, mid_lse, kv_lens, out, BLOCK_SEQ)
    return out
