"""attention.decode_paged entry for LMDeploy's PyTorch-engine paged attention (lmdeploy 0.18.0,
lmdeploy/pytorch/kernels/cuda/pagedattention.py, `flash_attn_with_kvcache`): a grouped split-K kernel
(a tile of the query heads of one KV head per program, tl.dot) over the paged cache, then the reduce
kernel combining the splits.

LMDeploy's cache is [num_blocks, block_size, Hkv, D] (its 'bshd' layout) addressed through a page table
of block ids: our NHD cache and block table as they are. The module's package imports are stood in for
by _lmdeploy.py.
"""

from _lmdeploy import PACKAGE, STUBS
from _source import load

_m = load("lmdeploy-0.18.0", "lmdeploy/pytorch/kernels/cuda/pagedattention.py", stubs=STUBS, package=PACKAGE)


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    return _m.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=kv_lens, page_table=block_tables, softmax_scale=scale
    )
