"""attention.decode_paged entry (block_size 1: a token pool) for LightLLM's token attention
(lightllm 0.0.1): scores (att1), softmax, and the V reduction (reduceV), three kernels.

With block_size 1 our cache [num_blocks, 1, Hkv, D] is LightLLM's token pool [num_tokens, Hkv, D] and the
block table is its request-to-token table; both are views. Like LightLLM's llama layer, the adapter
keeps the scores and probabilities in a [Hq, total_tokens] buffer of the activation dtype. LightLLM's
score launcher fixes the scale at 1/sqrt(D); the adapter launches that kernel with the call's scale.
"""

import torch
import triton
from _source import load

_att1 = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/token_attention_nopad_att1.py")
_softmax = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/token_attention_nopad_softmax.py")
_reduce = load("lightllm-0.0.1", "lightllm/models/llama/triton_kernel/token_attention_nopad_reduceV.py")
BLOCK = 32


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, hq, d = q.shape
    k, v = k_cache[:, 0], v_cache[:, 0]
    dev = q.device
    lens = kv_lens.tolist()
    start_loc = torch.tensor([sum(lens[:b]) for b in range(B)], dtype=torch.int32, device=dev)
    b_req_idx = torch.arange(B, dtype=torch.int32, device=dev)
    att = torch.empty((hq, sum(lens)), dtype=q.dtype, device=dev)
    _att1._fwd_kernel_token_att1[(B, hq, triton.cdiv(max(lens), BLOCK))](
        q,
        k,
        scale,
        block_tables,
        b_req_idx,
        start_loc,
        kv_lens,
        att,
        block_tables.stride(0),
        block_tables.stride(1),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        att.stride(0),
        att.stride(1),
        kv_group_num=hq // k.shape[1],
        BLOCK_DMODEL=d,
        BLOCK_N=BLOCK,
        num_warps=4 if hq == k.shape[1] else 2,
        num_stages=1,
    )
    prob = torch.empty_like(att)
    _softmax.token_softmax_fwd(att, start_loc, kv_lens, prob, max(lens))
    out = torch.empty_like(q)
    _reduce.token_att_fwd2(prob, v, out, block_tables, b_req_idx, start_loc, kv_lens)
    return out
