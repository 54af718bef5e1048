"""A kv_append that permutes lanes with tl.gather, an operation the structural analysis does not follow:
it must say "could not verify", never pass or fail silently (test fixture)."""
import triton
import triton.language as tl

from kernalin_ci import current_params

CATALOGUE = {"op": "kv_append", "bug_class": None, "pos0": None, "params": {}, "modelled_on": None,
             "style": "tl.gather (not followed by the analysis)"}


@triton.jit
def _append_gather(K, V, KC, VC, Slots, HD: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(Slots + t)
    if slot >= 0:
        i = tl.arange(0, BLOCK)
        m = i < HD
        k = tl.gather(tl.load(K + t * HD + i, mask=m, other=0.0), i, 0)
        v = tl.load(V + t * HD + i, mask=m, other=0.0)
        tl.store(KC + slot * HD + i, k, mask=m)
        tl.store(VC + slot * HD + i, v, mask=m)


def entry(key, value, k_cache, v_cache, slot_mapping):
    T, Hkv, D = key.shape
    assert current_params().get("block_size", 16) == k_cache.shape[1]
    _append_gather[(T,)](key, value, k_cache, v_cache, slot_mapping, HD=Hkv * D,
                         BLOCK=triton.next_power_of_2(Hkv * D))
