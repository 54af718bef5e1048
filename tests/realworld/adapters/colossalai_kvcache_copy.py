"""kv_append entry for ColossalAI's copy_kv_to_blocked_cache (colossalai 0.5.0), decoding path.

ColossalAI's cache is [num_blocks, Hkv, block_size, D]; ours [num_blocks, block_size, Hkv, D] is passed as
a permuted view (the kernel takes every stride). The kernel writes each sequence's newest token at
position kv_length - 1 through the sequence's block table, so each token becomes a one-block "sequence":
block table [slot // block_size], kv_length slot % block_size + 1. Padding tokens (slot -1) are left
out on the host, as ColossalAI's batch holds only live sequences.
"""

from _source import load

_kernel = load("colossalai-0.5.0", "colossalai/kernel/triton/kvcache_copy.py")


def entry(key, value, k_cache, v_cache, slot_mapping):
    bs = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_tables = (slots // bs)[:, None]
    kv_lengths = slots % bs + 1
    _kernel.copy_kv_to_blocked_cache(
        key[keep], value[keep], k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3), kv_lengths, block_tables
    )
