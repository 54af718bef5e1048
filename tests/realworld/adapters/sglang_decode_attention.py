"""attention.decode_paged entry (block_size 1: a token pool) for SGLang's Triton decode attention
(sglang 0.4.6.post5): split-KV stage 1 (the grouped kernel for GQA, the plain one for MHA) and the
log-sum-exp combine of stage 2.

With block_size 1 our cache [num_blocks, 1, Hkv, D] is SGLang's k_buffer [num_tokens, Hkv, D] (a view);
SGLang addresses it through kv_indptr / kv_indices (each request's token indices, concatenated), which the
adapter builds from the block table as SGLang's attention backend does from req_to_token. Splits: SGLang's
default maximum of 8 per request.
"""

import torch
from _source import load

_m = load(
    "sglang-0.4.6.post5",
    "sglang/srt/layers/attention/triton_ops/decode_attention.py",
    stubs={"sglang.srt.utils": {"is_hip": lambda: False}},
)
MAX_KV_SPLITS = 8


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, hq, d = q.shape
    dev = q.device
    k_buffer, v_buffer = k_cache[:, 0], v_cache[:, 0]
    lens = kv_lens.tolist()
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = torch.cumsum(kv_lens, 0)
    kv_indices = torch.cat([block_tables[b, :n] for b, n in enumerate(lens)])
    attn_logits = torch.empty((B, hq, MAX_KV_SPLITS, d), dtype=torch.float32, device=dev)
    attn_lse = torch.empty((B, hq, MAX_KV_SPLITS), dtype=torch.float32, device=dev)
    num_kv_splits = torch.full((B,), MAX_KV_SPLITS, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    _m.decode_attention_fwd(
        q, k_buffer, v_buffer, out, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, MAX_KV_SPLITS, scale
    )
    return out
