"""attention.decode_paged entry for vLLM's Triton decode attention (vllm 0.34.0,
vllm/v1/attention/ops/triton_decode_attention.py): split-KV stage 1 (the grouped tl.dot kernel for GQA,
the plain one for MHA) over a paged cache, then the log-sum-exp combine of stage 2.

vLLM's kernel takes the cache as [num_blocks, block_size, Hkv, D] and a block table (its req_to_token)
with `page_size`: our NHD cache and block table as they are. Scratch as vLLM's Triton backend allocates
it: attn_logits [B, Hq, splits, D + 1] (each split's output and its log-sum-exp), 8 splits. The module
imports vLLM's platform object and its Triton re-export; the stand-ins are our own lines (CUDA, not ROCm).

Served features (docs/ops.md, "Attention features"): the op's `window` is vLLM's `sliding_window` (the last
`sliding_window` keys, the query's own included: the same count) and its `logit_cap` vLLM's `logit_cap` (a cap
of the scaled score), passed through; vLLM's decode kernel has no ALiBi or sinks.

FP8 caches (docs/ops.md, "FP8 KV caches"): with `kv_dtype` set the caches are FP8 and the entry gets `k_scale`
and `v_scale`, passed to vLLM's `k_scale` / `v_scale` as its Triton backend passes the layer's scales; the
kernel reads one element of each (`tl.load(k_scale)`): per-tensor scales only.
"""

import torch
import triton
import triton.language as tl
from _source import load

import kernalin_ci


class _Cuda:
    @staticmethod
    def is_rocm():
        return False


_m = load(
    "vllm-0.34.0",
    "vllm/v1/attention/ops/triton_decode_attention.py",
    stubs={"vllm.platforms": {"current_platform": _Cuda()}, "vllm.triton_utils": {"tl": tl, "triton": triton}},
)
NUM_KV_SPLITS = 8


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, k_scale=None, v_scale=None):
    B, hq, d = q.shape
    params = kernalin_ci.current_params()
    page_size = params["block_size"]
    o = torch.empty_like(q)
    lse = torch.empty((B, hq), dtype=torch.float32, device=q.device)
    attn_logits = torch.empty((B, hq, NUM_KV_SPLITS, d + 1), dtype=torch.float32, device=q.device)
    _m.decode_attention_fwd(
        q, k_cache, v_cache, o, lse, block_tables, kv_lens, attn_logits, NUM_KV_SPLITS, scale, page_size,
        logit_cap=params.get("logit_cap") or 0.0, k_scale=k_scale, v_scale=v_scale,
        sliding_window=params.get("window"),
    )  # fmt: skip
    return o
