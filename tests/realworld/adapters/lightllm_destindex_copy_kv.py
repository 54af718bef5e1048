"""kv_append entry for LightLLM's destindex_copy_kv (lightllm 0.0.1).

LightLLM's token pool is a [num_tokens, Hkv, D] buffer addressed by a per-token destination index; a
paged cache [num_blocks, block_size, Hkv, D] is that pool viewed with one token per row (slot s is row s),
so the adapter passes a view. The kernel has no padding convention: padding tokens (slot -1) are left out
on the host before the launch, as LightLLM's scheduler does.
"""

from _source import load

_kernel = load("lightllm-0.0.1", "lightllm/common/basemodel/triton_kernel/destindex_copy_kv.py")


def entry(key, value, k_cache, v_cache, slot_mapping):
    nb, bs, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    dest = slot_mapping[keep]
    _kernel.destindex_copy_kv(key[keep], dest, k_cache.view(nb * bs, hkv, d))
    _kernel.destindex_copy_kv(value[keep], dest, v_cache.view(nb * bs, hkv, d))
