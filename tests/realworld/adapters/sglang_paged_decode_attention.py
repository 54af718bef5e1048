"""attention.decode_paged entry for SGLang's current Triton decode attention (sglang 0.5.23,
sglang/kernels/ops/attention/decode_attention.py): split-KV stage 1 (the grouped tl.dot kernel for GQA,
the plain one for MHA) with its page-aware addressing, then the log-sum-exp combine of stage 2.

SGLang's KV buffer is a token pool [slots, Hkv, D] addressed by token index (kv_indptr / kv_indices, each
request's token indices concatenated); with `page_size` > 1 the kernel splits each index into a page and
an in-page offset itself. Our cache [num_blocks, block_size, Hkv, D] flattened is that pool (a view), and
token j of sequence b has index block_tables[b, j // block_size] * block_size + j % block_size, as the
paged attention backend builds kv_indices. Splits: SGLang's default maximum of 8 per request. The module
imports a few package utilities; the stand-ins are our own lines (CUDA, no score modifier).

Served features (docs/ops.md, "Attention features"): the op's `logit_cap` is SGLang's `logit_cap` (a cap of the
scaled score, in stage 1) and its `sinks` input SGLang's `sinks` (one logit per query head, added to the
combine's denominator in stage 2), passed through as they are; SGLang's kernel has no window or ALiBi.
"""

import torch
from _source import load

import kernalin_ci

_m = load(
    "sglang-0.5.23",
    "sglang/kernels/ops/attention/decode_attention.py",
    stubs={
        "sglang.kernels.ops.attention.score_mod": {"unpack_aux_tensors": lambda score_mod, aux: (None, 0, 0, 0)},
        "sglang.srt.environ": {"envs": None},
        "sglang.srt.utils": {
            "get_device_core_count": lambda index=0: 0,
            "is_gfx95_supported": lambda: False,
            "is_gfx1250_supported": lambda: False,
            "is_hip": lambda: False,
        },
    },
)
MAX_KV_SPLITS = 8


def kv_indices(block_tables, kv_lens, block_size):
    """kv_indptr and kv_indices: each sequence's token indices in the flattened cache, concatenated."""
    B = kv_lens.shape[0]
    indptr = torch.zeros(B + 1, dtype=torch.int32, device=kv_lens.device)
    indptr[1:] = torch.cumsum(kv_lens, 0)
    parts = []
    for b, n in enumerate(kv_lens.tolist()):
        j = torch.arange(n, device=kv_lens.device)
        parts.append(block_tables[b, j // block_size].long() * block_size + j % block_size)
    return indptr, torch.cat(parts).to(torch.int64)


def attend(q, k_pool, v_pool, indptr, indices, scale, page_size, logit_cap=0.0, sinks=None):
    """SGLang's decode attention over a token pool; returns the output."""
    B, hq, d = q.shape
    attn_logits = torch.empty((B, hq, MAX_KV_SPLITS, d), dtype=torch.float32, device=q.device)
    attn_lse = torch.empty((B, hq, MAX_KV_SPLITS), dtype=torch.float32, device=q.device)
    num_kv_splits = torch.full((B,), MAX_KV_SPLITS, dtype=torch.int32, device=q.device)
    o = torch.empty_like(q)
    _m.decode_attention_fwd(
        q, k_pool, v_pool, o, indptr, indices, attn_logits, attn_lse, num_kv_splits, MAX_KV_SPLITS, scale, 1.0, 1.0,
        logit_cap=logit_cap, sinks=sinks, page_size=page_size,
    )  # fmt: skip
    return o


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, sinks=None):
    params = kernalin_ci.current_params()
    bs = params["block_size"]
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    indptr, indices = kv_indices(block_tables, kv_lens, bs)
    cap = params.get("logit_cap") or 0.0
    return attend(q, k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d), indptr, indices, scale, bs, cap, sinks)
