"""kv_append entry for LMDeploy's PyTorch-engine fill_kv_cache (lmdeploy 0.18.0,
lmdeploy/pytorch/kernels/cuda/fill_kv_cache.py), decoding path: one program per KV head and sequence
writes the sequence's new token into its page at the slot after its history.

LMDeploy addresses a token by its sequence (start in the batch, length, page table), not by a slot: each
of our tokens is one decoding sequence whose history ends just before its slot, so its length is
slot % block_size + 1 and its page table's one entry is slot // block_size (a view of the slot mapping;
the cache is LMDeploy's 'bshd' cache as it is). Padding tokens (slot -1) are dropped on the host, as the
engine never schedules them. The module's package imports are stood in for by _lmdeploy.py.
"""

import torch
from _lmdeploy import PACKAGE, STUBS
from _source import load

_m = load("lmdeploy-0.18.0", "lmdeploy/pytorch/kernels/cuda/fill_kv_cache.py", stubs=STUBS, package=PACKAGE)


def entry(key, value, k_cache, v_cache, slot_mapping):
    keep = (slot_mapping >= 0).nonzero().flatten()
    if keep.numel() == 0:
        return
    key, value, slots = key[keep], value[keep], slot_mapping[keep]
    bs = k_cache.shape[1]
    n = slots.shape[0]
    start = torch.arange(n, dtype=torch.int32, device=key.device)
    ones = torch.ones(n, dtype=torch.int32, device=key.device)
    lengths = (slots % bs + 1).to(torch.int32)
    pages = (slots // bs).to(torch.int32)[:, None]
    _m.fill_kv_cache(key, value, k_cache, v_cache, start, ones, lengths, 1, pages)
