"""attention.decode_paged entry for LMDeploy's PyTorch-engine paged attention (lmdeploy 0.18.0,
lmdeploy/pytorch/kernels/cuda/pagedattention.py, `flash_attn_with_kvcache`): a grouped split-K kernel
(a tile of the query heads of one KV head per program, tl.dot) over the paged cache, then the reduce
kernel combining the splits.

LMDeploy's cache is [num_blocks, block_size, Hkv, D] (its 'bshd' layout) addressed through a page table
of block ids: our NHD cache and block table as they are. The module's package imports are stood in for
by _lmdeploy.py.

Served features (docs/ops.md, "Attention features"): LMDeploy's `window_size` counts the keys left of the
query (FlashAttention's convention), so the op's `window` is passed as `window - 1`; `softcap` is the op's
`logit_cap` (a cap of the scaled score), and `alibi_slopes` and `sinks` (one value per query head) are the op's
inputs as they are. LMDeploy's ALiBi bias is -(kv_len - j) * slope, the op's (j - p) * slope less one slope per
row: the same softmax.
"""

from _lmdeploy import PACKAGE, STUBS
from _source import load

import kernalin_ci

_m = load("lmdeploy-0.18.0", "lmdeploy/pytorch/kernels/cuda/pagedattention.py", stubs=STUBS, package=PACKAGE)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale, alibi_slopes=None, sinks=None):
    params = kernalin_ci.current_params()
    window = params.get("window")
    return _m.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=kv_lens, page_table=block_tables, softmax_scale=scale,
        window_size=None if window is None else window - 1, softcap=params.get("logit_cap"),
        alibi_slopes=alibi_slopes, sinks=sinks,
    )  # fmt: skip
