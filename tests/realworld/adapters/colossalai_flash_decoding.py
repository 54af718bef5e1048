"""attention.decode_paged entry for ColossalAI's flash decoding (colossalai 0.5.0): one program per
cache block, then a log-sum-exp reduce kernel.

ColossalAI's cache is [num_blocks, Hkv, block_size, D]; ours [num_blocks, block_size, Hkv, D] is passed as
a permuted view (the kernel takes every stride). The kernel needs block_size in {16, 32, 64, 128} and
D in {32, 64, 128, 256}.
"""

from _source import load

_m = load("colossalai-0.5.0", "colossalai/kernel/triton/flash_decoding.py")


def entry(q, k_cache, v_cache, block_tables, kv_lens, scale):
    B, hq, d = q.shape
    bs, hkv = k_cache.shape[1], k_cache.shape[2]
    out = _m.flash_decoding_attention(
        q,
        k_cache.permute(0, 2, 1, 3),
        v_cache.permute(0, 2, 1, 3),
        kv_lens,
        block_tables,
        bs,
        sm_scale=scale,
        kv_group_num=hq // hkv,
    )
    return out.view(B, hq, d)
